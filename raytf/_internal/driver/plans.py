"""Exactly-once data (``DataConfig(exactly_once=True)``): each split dataset materialized once
per run, in order, and read by every attempt by position.

The driver starts materializing every split dataset when the run's worker group is made,
while the first attempt places its bundles and starts its actors, and holds the blocks in
Ray's object store for the life of the run. Every attempt, of whatever size, hands each rank
the same :class:`~raytf._internal.data.planned.PlannedShard`; the ranks read the blocks and
train the rows their position gives them (data/planned.py, data/position.py). A restart
needs no new split and no second read of the source: it reads the object store. Ray Data
keeps its blocks' lineage, so a block lost with its node is made again when read.

The order is Ray Data's with ``preserve_order=True``, so a new driver on the same run (a
resubmitted job) materializes the same rows in the same order from a deterministic
pipeline, and the checkpoint's positions mean the same rows.
"""

from __future__ import annotations

import functools
import logging
import secrets
from typing import Any, Collection, Mapping

from raytf._internal.background import Background
from raytf._internal.data.planned import PlannedShard
from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.members import GroupView
from raytf.errors import ConfigError, RaytfError

logger = logging.getLogger(__name__)


def materialize(dataset: Any) -> tuple[tuple, tuple[int, ...], tuple[int, ...]]:
    """``dataset``'s blocks in order, in Ray's object store (owned by this process): their
    references, the rows of each the dataset uses, and where in the block those start (a block
    Ray Data shares with another dataset, after ``limit`` or a split, is used in part)."""
    options = dataset.context.execution_options
    before = options.preserve_order
    options.preserve_order = True  # the same order in every driver, for a deterministic pipeline
    try:
        materialized = dataset.materialize()
    finally:
        options.preserve_order = before
    refs, rows, offsets = [], [], []
    for bundle in materialized.iter_internal_ref_bundles():
        slices = getattr(bundle, "slices", None) or (None,) * len(bundle.blocks)  # Ray < 2.60: whole blocks
        for entry, part in zip(bundle.blocks, slices):
            ref, metadata = (entry.ref, entry.metadata) if hasattr(entry, "ref") else entry  # Ray < 2.60: a pair
            start, end = (0, metadata.num_rows) if part is None else (part.start_offset, part.end_offset)
            if end is None:
                raise RaytfError(
                    f"Ray Data did not record the row count of a block of {dataset}: this Ray version is not one raytf supports (see the support table), or DataConfig(exactly_once=False) reads without counting"
                )
            refs.append(ref)
            rows.append(end - start)
            offsets.append(start)
    return tuple(refs), tuple(rows), tuple(offsets)


class ExactData(GroupCallback):
    """Every split dataset materialized once, and every file source (data/files.py) counted
    once, handed to every attempt's ranks."""

    def __init__(self, datasets: Mapping[str, Any], split: Collection[str], exactly_once: bool = True):
        from raytf._internal.data.files import FileSource
        from raytf._internal.data.formats import plan_files

        self._seed = secrets.randbits(62)  # orders unseeded shuffles; a checkpoint's positions keep theirs
        self._split = frozenset(split)
        self._making: dict[str, Background] = {}
        for name in sorted(datasets):
            dataset = datasets[name]
            if isinstance(dataset, FileSource):
                self._making[name] = Background(functools.partial(plan_files, dataset), "raytf-plan-files")
            elif exactly_once and name in self._split:
                self._making[name] = Background(functools.partial(materialize, dataset), "raytf-materialize")
        self._made: dict[str, Any] = {}  # name -> (blocks, their rows used, where those start), or a FilePlan

    def kept_shards(self, group: GroupView) -> Mapping[str, Any]:
        from raytf._internal.data.files import FilePlan, FileShard

        for name, making in list(self._making.items()):
            try:
                self._made[name] = making.result()
            except ValueError as error:  # a file source that cannot be read as it says
                raise ConfigError(f"Trainer(datasets={{{name!r}: ...}}): {error}") from None
            del self._making[name]
        shards: dict[str, list[Any]] = {}
        for name, made in self._made.items():
            if isinstance(made, FilePlan):
                whole = name not in self._split
                shards[name] = [FileShard(name, made, self._seed, whole)] * (1 if whole else group.num_workers)
            else:
                blocks, block_rows, block_offsets = made
                shards[name] = [
                    PlannedShard(name, blocks, block_rows, block_offsets, seed=self._seed)
                ] * group.num_workers
        return shards

    def on_close(self, group: GroupView) -> None:
        self._made = {}

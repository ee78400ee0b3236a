"""A worker's shard of a Ray Dataset: what ``raytf.get_dataset_shard`` asks for, checked, and
read once per dataset (the cached path) with every worker agreeing on the rows it uses.

The data path, one way, each stage using only those before it (tests/unit/test_layout.py checks):
source (request.py: what was asked; columns.py: Ray Data's columns; planned.py: materialized
blocks) -> plan (position.py: the rows and order of each pass; files.py: a file source's; formats/:
a file format each) -> position (cursor.py: where the group stands, what a checkpoint
records) -> reader (read_blocks.py, read_files.py, read_stream.py: the tf.data pipelines) ->
tf.data (tfdata.py: the pipeline made the worker's shard). This module ties them. Every worker yields the
same number of batches each epoch: splits are made with
``streaming_split(equal=True)`` (Ray Data drops at most ``num_workers - 1``
rows so every split has the same row count), and on the cached path the
workers also agree on the smallest row count through one collective before
the first epoch.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from raytf._internal.data.files import FileShard
from raytf._internal.data.planned import PlannedShard
from raytf._internal.data.request import (  # noqa: F401 - named here too
    Features,
    KeptShardLost,
    ShardRequest,
    check_request,
    check_rows,
)
from raytf.errors import DatasetShardError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeptShard:
    """A shard a rank of an earlier attempt read whole (the cached path), kept in Ray's object
    store by the driver (``FailureConfig(warm_standby=True)``). The rank that takes its place
    reads it from there: no new split of the dataset, no streaming executor, the same rows."""

    ref: Any  # ray.ObjectRef of {column: np.ndarray}, owned by the driver

    def arrays(self) -> dict[str, Any]:
        import ray

        try:
            return ray.get(self.ref)  # zero-copy on the node that holds it
        except ray.exceptions.ObjectLostError as error:
            raise KeptShardLost(f"the kept copy of this worker's shard was lost: {error}") from None


def shuffle_seed(seed: Optional[int], name: str, world_rank: int, call: int) -> Optional[int]:
    """A per-worker, per-dataset shuffle seed derived from the user's seed, stable across runs."""
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}/{name}/{world_rank}/{call}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def agree_on_rows(strategy: Any, rows: int, world_rank: int, world_size: int) -> list[int]:
    """Every worker's row count, through one all-reduce, so all can take the smallest."""
    import tensorflow as tf

    if world_size == 1:
        return [rows]
    mine = tf.one_hot(world_rank, world_size, dtype=tf.float64) * float(rows)
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(mine)), axis=None)
    return [int(v) for v in total.numpy()]


class ShardReader:
    """A worker's datasets, handed out as ``tf.data`` by ``raytf.get_dataset_shard``.

    ``datasets`` maps each name to this rank's Ray Data iterator; ``first_epoch``
    is the epoch a resumed run starts at (a seeded shuffle of epoch e is the
    same in every run). Cached shards are read once and kept.
    """

    def __init__(
        self,
        datasets: Mapping[str, Any],
        world_rank: int,
        world_size: int,
        strategy: Callable[[], Any],
        first_epoch: int = 0,
        positions: Optional[Mapping[str, Any]] = None,
    ):
        self._datasets = dict(datasets)
        self._positions = dict(positions or {})  # the resumed checkpoint's record of each planned dataset
        self._blocks: dict[str, Any] = {}  # planned datasets' blocks, read once (data/planned.py)
        self.cursors: dict[str, Any] = {}  # name -> the Cursor of its planned shard's passes
        self._world_rank = world_rank
        self._world_size = world_size
        self._strategy = strategy  # called only when the workers must agree on a shard's rows
        self._first_epoch = first_epoch
        self._cached: dict[str, tuple[dict[str, Any], int]] = {}  # name -> (arrays, agreed rows)
        self._calls: dict[str, int] = {}

    def names(self) -> list[str]:
        return sorted(self._datasets)

    def _check_known(self, name: str) -> None:
        if name not in self._datasets:
            passed = ", ".join(sorted(self._datasets)) or "none"
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): no dataset named {name!r} was passed to "
                f"Trainer(datasets=...); passed: {passed}"
            )

    def per_worker_batch(self, name: str, batch_size: Optional[int], global_batch_size: Optional[int]) -> int:
        """The per-worker batch, given directly or as this worker's share of a global batch."""
        self._check_known(name)
        if (batch_size is None) == (global_batch_size is None):
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): pass batch_size (per worker; the global batch "
                "grows and shrinks with the group) or global_batch_size (kept; each worker gets its "
                "share), not both and not neither"
            )
        if global_batch_size is None:
            return batch_size  # type: ignore[return-value]  # check_request checked it
        world = self._world_size
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < world:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): global_batch_size must be an int of at least the "
                f"number of workers ({world}), got {global_batch_size!r}"
            )
        if global_batch_size % world:
            logger.warning(
                "dataset %r: global_batch_size=%d does not divide among %d workers; each takes %d "
                "(a global batch of %d)",
                name,
                global_batch_size,
                world,
                global_batch_size // world,
                global_batch_size // world * world,
            )
        return global_batch_size // world

    def read_whole(self, name: str) -> Optional[dict[str, Any]]:
        """The columns of ``name`` as this worker read them whole (the cached path), if it did."""
        cached = self._cached.get(name)
        return cached[0] if cached is not None else None

    def dataset(self, request: ShardRequest, seed: Optional[int], cache: bool) -> Any:
        """This worker's shard of ``request.name`` as a ``tf.data.Dataset``. A kept shard (see
        :class:`KeptShard`) is already in memory, so it takes the cached path whatever ``cache`` says."""
        from raytf._internal.data import tfdata

        name = request.name
        self._check_known(name)
        check_request(request)
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        source = self._datasets[name]
        if isinstance(source, PlannedShard):
            return tfdata.finish(*self._planned(request, source, cache))
        if isinstance(source, FileShard):
            return tfdata.finish(*self._files(request, source))
        return tfdata.finish(self._streamed(request, source, shuffle_seed(seed, name, self._world_rank, call), cache))

    def _streamed(self, request: ShardRequest, iterator: Any, seed_here: Optional[int], cache: bool) -> Any:
        """A shard Ray Data streams (``DataConfig(exactly_once=False)``), or one kept from the last
        attempt: read once into memory (the cached path), or streamed every epoch."""
        from raytf._internal.data import columns, read_stream

        name = request.name
        kept = isinstance(iterator, KeptShard)
        if not cache and not kept:
            schema = iterator.schema()
            if schema is None:  # Ray Data has no schema for a dataset without rows
                check_rows(name, 0, self._world_size)
            return read_stream.streaming_dataset(iterator, request, schema, seed_here)
        if name not in self._cached:
            arrays = iterator.arrays() if kept else columns.read_shard(iterator, name)
            own = len(next(iter(arrays.values()))) if arrays else 0
            counts = agree_on_rows(self._strategy(), own, self._world_rank, self._world_size)
            check_rows(name, min(counts), self._world_size)  # every rank raises alike
            if min(counts) < own:
                logger.warning(
                    "dataset %r: this worker has %d rows, the smallest shard %d; using %d so every "
                    "worker runs the same number of steps",
                    name,
                    own,
                    min(counts),
                    min(counts),
                )
            self._cached[name] = (arrays, min(counts))
        arrays, rows = self._cached[name]
        request.columns(list(arrays))
        if rows < request.batch_size:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): batch_size={request.batch_size} is larger than the "
                f"worker's shard ({rows} rows, the smallest across {self._world_size} workers); "
                "lower batch_size or pass more data"
            )
        return read_stream.dataset_from_arrays(arrays, request, rows, seed_here, first_epoch=self._first_epoch)

    def _planned(self, request: ShardRequest, shard: PlannedShard, cache: bool) -> tuple[Any, Any]:
        """A planned shard (data/planned.py): this rank's rows by the group's position; (the
        reader's pipeline, its cursor). A second call for the same dataset and batches (one call
        per epoch, as Ray Train's examples make) goes on from the passes the first one planned."""
        from raytf._internal.data import cursor as _cursor
        from raytf._internal.data import planned, read_blocks
        from raytf._internal.data import position as _position

        name = request.name
        if name not in self._blocks:
            self._blocks[name] = planned.Blocks(shard)
        blocks = self._blocks[name]
        seed = _position.dataset_seed(request.seed if request.seed is not None else shard.seed, name)
        start, seed = _cursor.resume_point(
            name, self._positions.get(name), blocks.rows, self._first_epoch, seed, request.shuffle, self._world_size
        )
        cursor = self.cursors.get(name)
        if cursor is None or (cursor.shuffle, cursor.batch, cursor.drop, cursor.start) != (
            request.shuffle,
            request.batch_size,
            request.drop_remainder,
            start,
        ):
            cursor = _cursor.Cursor(
                name,
                blocks.rows,
                start,
                seed,
                request.shuffle,
                self._world_rank,
                self._world_size,
                request.batch_size,
                request.drop_remainder,
            )
            self.cursors[name] = cursor
        return read_blocks.planned_dataset(blocks, cursor, request, cache), cursor

    def _files(self, request: ShardRequest, shard: FileShard) -> tuple[Any, Any]:
        """A file source (data/files.py): this rank's rows by the group's position, read from the
        files every epoch (``cache`` does not apply); (the reader's pipeline, its cursor)."""
        from raytf._internal.data import cursor as _cursor
        from raytf._internal.data import position as _position
        from raytf._internal.data import read_files

        name, plan = request.name, shard.plan
        rank, size = (0, 1) if shard.whole else (self._world_rank, self._world_size)
        seed = _position.dataset_seed(request.seed if request.seed is not None else shard.seed, name)
        recorded = self._positions.get(name)
        if recorded is not None and recorded.get("files") != _cursor.files_digest(plan):
            logger.warning(
                "dataset %r: the checkpoint's data position is for other files; epoch %d starts over",
                name,
                self._first_epoch,
            )
            recorded = None
        start, seed = _cursor.resume_point(name, recorded, plan.rows, self._first_epoch, seed, request.shuffle, size)
        cursor = self.cursors.get(name)
        if not isinstance(cursor, _cursor.FileCursor) or (cursor.shuffle, cursor.batch, cursor.drop, cursor.start) != (
            request.shuffle,
            request.batch_size,
            request.drop_remainder,
            start,
        ):
            cursor = _cursor.FileCursor(
                plan,
                name,
                plan.rows,
                start,
                seed,
                request.shuffle,
                rank,
                size,
                request.batch_size,
                request.drop_remainder,
            )
            self.cursors[name] = cursor
        return read_files.file_dataset(plan, cursor, request), cursor

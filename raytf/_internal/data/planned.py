"""Split datasets read by position: every row of an epoch trained exactly once, whatever
happens to the group.

With ``DataConfig(exactly_once=True)`` (the default) the driver materializes each split
dataset once per run, in order, into Ray's object store (driver/plans.py) and hands every
rank a :class:`PlannedShard`: the blocks, and the run's data seed. A rank reads the blocks
(zero-copy on their node) and trains, each pass, the rows its :class:`~raytf._internal.data.position.Position`
gives it (position.py): the rest of an interrupted epoch first, cut over this group, then
whole epochs. Each checkpoint raytf commits records every split dataset's position
(:meth:`Cursor.position_after`; in a custom loop, from the batches it took from the strategy's
iterator, :meth:`Cursor.taken_position`), so a restart, of any size and on any nodes, trains
what the interrupted epoch has not trained, once.

Two tf.data pipelines, as for streamed shards (tfdata.py). ``cache=True``: a group that keeps
its size trains the same run of rows on each rank every epoch (position.py), so the rank
converts its run to tensors once, and every batch is one ``tf.gather`` per column by the
epoch's order (one Python call per pass, none per batch); the rest of an interrupted epoch,
whose rows come from other ranks' runs, is gathered from the blocks for that pass alone.
``cache=False`` gathers a pass a stack of batches at a time, so a worker never holds more than
a few dozen batches.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Optional

import numpy as np

from raytf._internal.data import position as _position
from raytf._internal.data.request import KeptShardLost, ShardRequest, check_rows
from raytf._internal.data.tfdata import _STACK_BATCHES, _finish, aligned_empty, host_tensor, stack_column
from raytf._internal.worker.strategy import PLANNED_MARK as _PLANNED_MARK
from raytf._internal.worker.strategy import cursor_of  # noqa: F401 - where the data modules find it
from raytf.errors import DatasetShardError

logger = logging.getLogger(__name__)
_iterations = itertools.count()  # orders Cursor.iterated calls in this process


@dataclass(frozen=True)
class PlannedShard:
    """A split dataset as every rank of an attempt gets it: the materialized blocks, in order."""

    name: str
    blocks: tuple  # ObjectRefs of Ray Data blocks, owned by the driver
    block_rows: tuple[int, ...]  # the rows of each block the dataset uses
    block_offsets: tuple[int, ...]  # where in its block they start
    seed: int  # the run's data seed: orders the epochs of a shuffle without a seed of its own


class Blocks:
    """A materialized dataset's columns, block by block, read on this worker as its passes need
    them (zero-copy from the object store where the block is on this node)."""

    def __init__(self, shard: PlannedShard):
        self._shard = shard
        self._read: dict[int, dict[str, np.ndarray]] = {}
        self.starts = np.concatenate([[0], np.cumsum(shard.block_rows)]).astype(np.int64)
        self.rows = int(self.starts[-1])
        self._first = next((i for i, n in enumerate(shard.block_rows) if n), None)  # a block with rows
        self.names = list(self.block(self._first)) if self._first is not None else []

    def block(self, index: int) -> dict[str, np.ndarray]:
        if index not in self._read:
            import ray
            from ray.data.block import BlockAccessor

            try:
                table = ray.get(self._shard.blocks[index])
            except ray.exceptions.ObjectLostError as error:
                raise KeptShardLost(f"a block of dataset {self._shard.name!r} was lost: {error}") from None
            start = self._shard.block_offsets[index]
            end = start + self._shard.block_rows[index]
            accessor = BlockAccessor.for_block(table)
            if (start, end) != (0, accessor.num_rows()):
                accessor = BlockAccessor.for_block(accessor.slice(start, end, copy=False))
            arrays = accessor.to_numpy()
            if not isinstance(arrays, dict):
                arrays = {"data": arrays}
            self._read[index] = {c: stack_column(c, self._shard.name, v) for c, v in arrays.items()}
        return self._read[index]

    def gather(self, rows: np.ndarray, columns: list[str], aligned: bool = False) -> dict[str, np.ndarray]:
        """The given rows (indices into the dataset) of ``columns``, in that order; ``aligned``:
        into arrays TensorFlow takes without a copy (tfdata.host_tensor)."""
        which = np.searchsorted(self.starts, rows, side="right") - 1
        make = aligned_empty if aligned else np.empty
        out = {c: make((len(rows), *self.spec(c)[1]), self.spec(c)[0]) for c in columns}
        for block in np.unique(which):
            here = np.nonzero(which == block)[0]
            offsets = rows[here] - self.starts[block]
            read = self.block(int(block))
            for c in columns:
                out[c][here] = read[c][offsets]
        return out

    def spec(self, column: str) -> tuple[np.dtype, tuple[int, ...]]:
        """A column's dtype and per-row shape."""
        values = self.block(self._first)[column]
        return values.dtype, values.shape[1:]


class Cursor:
    """One rank's passes over a planned shard, and where the group stands in them."""

    def __init__(self, name: str, rows: int, start: _position.Position, seed: int, shuffle: bool,
                 world_rank: int, world_size: int, batch: int, drop_remainder: bool):
        self.name, self.rows, self.start, self.seed, self.shuffle = name, rows, start, seed, shuffle
        self.world_rank, self.world_size, self.batch, self.drop = world_rank, world_size, batch, drop_remainder
        self._passes = 0
        self._taken = 0  # batches a training loop took from the strategy's iterators, eagerly (took)
        self.iterated_at = -1  # when a loop last made an iterator over it (iterated), in _iterations' count
        self.iterated_by_pass = True
        self._lock = threading.Lock()

    def epoch_start(self, epoch: int) -> _position.Position:
        """Where the group started ``epoch`` in this attempt."""
        return self.start if epoch == self.start.epoch else _position.Position.fresh(epoch, self.rows, self.world_size)

    def steps(self, epoch: int) -> int:
        """The steps each rank takes in ``epoch`` (what is left of it, for the one resumed)."""
        runs = _position.runs_of(self.epoch_start(epoch).remaining, self.world_size)
        return _position.steps([sum(e - s for s, e in r) for r in runs], self.batch, self.drop)

    def full_steps(self) -> int:
        """The steps each rank takes in a whole epoch."""
        return self.steps(self.start.epoch + 1)

    def next_pass(self) -> _position.Pass:
        with self._lock:
            epoch = self.start.epoch + self._passes
            self._passes += 1
        return _position.plan_pass(self.epoch_start(epoch), self.rows, self.shuffle, self.seed, self.world_rank,
                                   self.world_size, self.batch, self.drop)

    def position_after(self, epoch: int, done: int) -> _position.Position:
        """The group's position once it trained ``done`` steps of ``epoch``."""
        return _position.advance(self.epoch_start(epoch), self.rows, self.world_size, self.batch, self.drop, done)

    def took(self, batches: int = 1) -> None:
        """A training loop took ``batches`` from an iterator over this shard (worker/strategy.py
        counts what a distributed iterator hands out outside ``tf.function``)."""
        with self._lock:
            self._taken += batches

    def iterated(self, by_pass: bool = True) -> None:
        """A loop made an iterator over this shard's distributed dataset (a Keras fit loop does, each
        epoch): :func:`last_iterated` names the dataset a loop trains from now. ``by_pass``: one
        pass per iterator, not the shard repeated (whose epochs the loop's ``steps_per_epoch``
        cuts, so a resume in mid-epoch cannot start with the rest of one)."""
        self.iterated_at = next(_iterations)
        self.iterated_by_pass = by_pass

    def taken_position(self) -> Optional[_position.Position]:
        """The group's position after the batches the loop took in this attempt, passes one after
        the other (each full pass is an epoch), or None where it took none this way."""
        with self._lock:
            left = self._taken
        if not left:
            return None
        epoch = self.start.epoch
        while True:
            count = self.steps(epoch)
            if left < count or count == 0:
                return self.position_after(epoch, left)
            left -= count
            epoch += 1

    def record(self, position: _position.Position) -> dict[str, Any]:
        return {**position.to_json(), "rows": self.rows, "seed": self.seed, "shuffle": self.shuffle}


def last_iterated(cursors: dict[str, Cursor]) -> Optional[str]:
    """The planned dataset a loop made an iterator over last (the one a Keras fit loop trains from
    at an epoch's start: its validation data is iterated at the epoch's end), where the loop reads
    it a pass an epoch; else None."""
    latest = max(cursors.values(), key=lambda c: c.iterated_at, default=None)
    if latest is None or latest.iterated_at < 0 or not latest.iterated_by_pass:
        return None
    return latest.name


def positions_at(cursors: dict[str, Cursor], done: Any, epoch: Optional[int], step: int, exact: Collection[str],
                 ) -> Optional[dict[str, Any]]:
    """Each planned dataset's record for a checkpoint: ``done`` is the report's ``epoch`` metric
    (the last epoch completed); ``epoch`` and ``step`` the epoch in progress and the steps of its
    pass done, as the training loop noted them. A checkpoint at an epoch's end records the next
    epoch whole. One in mid-epoch (a preemption, ``every_n_steps``) records the rest of that
    epoch for the datasets the loop trains and resumes exactly: ``exact``, ``raytf.keras.fit``'s
    (or tf-keras's own ``model.fit``'s, noted by ``ReportCallback``) training data, whose rest it
    runs as its first epoch, at the step it noted; and every dataset
    a custom loop took batches of from the strategy's iterator, at the batches it took (the resume
    hands the loop the rest of the epoch as its first pass). For any other dataset (validation
    data) or loop (tf-keras's own ``model.fit`` over the shard repeated, with ``steps_per_epoch``;
    a loop inside a ``tf.function``, not counted), the start of the epoch's pass."""
    if not cursors:
        return None
    done = done if isinstance(done, int) and not isinstance(done, bool) else None
    records = {}
    for name, cursor in cursors.items():
        counted = None if name in exact else cursor.taken_position()
        if counted is not None:
            position = counted
        elif epoch is not None and (done is None or epoch == done + 1):
            position = cursor.position_after(epoch, step if name in exact else 0)
        elif done is not None:
            position = _position.Position.fresh(done + 1, cursor.rows, cursor.world_size)
        else:
            continue
        records[name] = cursor.record(position)
    return records


def completed_epoch(done: Any, records: Optional[dict[str, Any]]) -> dict[str, int]:
    """``{"epoch": e}``: the epoch a mid-epoch report's checkpoint completed, where its ``epoch`` metric (``done``,
    the last epoch completed) says the one after is still in progress but a dataset the loop
    resumes exactly has no rows of it left: a preemption at an epoch's last step. Its checkpoint
    must say that epoch completed, or the resume (at ``epoch + 1``, in every loop) would run it
    again with the next epoch's rows, an epoch too many. Else ``{}``."""
    if not records or not isinstance(done, int) or isinstance(done, bool):
        return {}
    for record in records.values():
        if record.get("epoch") == done + 2 and record.get("remaining") == [[0, record.get("rows")]]:
            return {"epoch": done + 1}
    return {}


def resume_point(name: str, recorded: Any, rows: int, first_epoch: int, seed: int, shuffle: bool,
                 world_size: int) -> tuple[_position.Position, int]:
    """(where this attempt starts, the seed of the orders) from the checkpoint's record of
    ``name``, or a fresh ``first_epoch`` when there is none or it does not fit this dataset."""
    if recorded is None:
        return _position.Position.fresh(first_epoch, rows, world_size), seed
    try:
        if recorded.get("rows") != rows:
            raise ValueError(f"it was recorded for {recorded.get('rows')} rows, the dataset has {rows}")
        if bool(recorded.get("shuffle")) != shuffle:
            raise ValueError(f"it was recorded with shuffle={bool(recorded.get('shuffle'))}")
        position = _position.Position.from_json(recorded, rows)
        recorded_seed = int(recorded["seed"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        logger.warning("dataset %r: the checkpoint's data position is not usable (%s); epoch %d starts over",
                       name, error, first_epoch)
        return _position.Position.fresh(first_epoch, rows, world_size), seed
    if position.is_fresh(rows):  # a whole epoch: cut for this group
        position = _position.Position.fresh(position.epoch, rows, world_size)
    return position, recorded_seed


def planned_dataset(blocks: Blocks, cursor: Cursor, request: ShardRequest, cache: bool) -> Any:
    """This rank's tf.data over a planned shard: one pass per iteration, as ``cursor`` plans them."""
    import tensorflow as tf

    if blocks.rows == 0:
        check_rows(request.name, 0, cursor.world_size)
    features, label = request.columns(blocks.names)
    needed = features + ([label] if label is not None else [])
    specs = {}
    for c in needed:
        dtype, shape = blocks.spec(c)
        specs[c] = (tf.string if dtype == object else tf.as_dtype(dtype), shape)
    full = cursor.full_steps()
    share = blocks.rows // cursor.world_size
    if share < request.batch_size:
        raise DatasetShardError(
            f"raytf.get_dataset_shard({request.name!r}): batch_size={request.batch_size} is larger than the "
            f"worker's shard ({share} rows, the smallest across {cursor.world_size} workers); lower batch_size or "
            "pass more data"
        )
    single = isinstance(request.features, str)

    def split(columns: dict[str, Any]) -> Any:
        x = columns[features[0]] if single else {c: columns[c] for c in features}
        return x if label is None else (x, columns[label])

    if cache:
        held: dict[str, Any] = {}  # the rank's run of rows as tensors, for every whole epoch cut for this group

        def pass_columns() -> list:
            """A pass's columns, the order to take their rows in, and the batches' bounds."""
            planned = cursor.next_pass()
            if planned.local is None:  # the rest of an interrupted epoch: this pass's rows, gathered
                columns = blocks.gather(planned.rows, needed)
                return [columns[c] for c in needed] + [np.arange(len(planned.rows)), planned.bounds]
            start, end = planned.local
            if held.get("run") != planned.local:
                held.pop("tensors", None)  # the previous run's, before this one is read
                columns = blocks.gather(np.arange(start, end), needed, aligned=True)
                with tf.device("/cpu:0"):
                    held["tensors"] = [host_tensor(columns[c]) for c in needed]
                held["run"] = planned.local
            return held["tensors"] + [planned.rows - start, planned.bounds]

        def one_pass(_: Any) -> Any:
            out = tf.py_function(pass_columns, [], Tout=[specs[c][0] for c in needed] + [tf.int64, tf.int64])
            columns = {c: tf.ensure_shape(t, (None, *specs[c][1])) for c, t in zip(needed, out)}
            take, bounds = tf.ensure_shape(out[-2], (None,)), tf.ensure_shape(out[-1], (None,))
            count = tf.size(bounds, out_type=tf.int64) - 1
            batch_dim = request.batch_size if request.drop_remainder else None
            return tf.data.Dataset.range(count).map(lambda i: split({
                c: tf.ensure_shape(tf.gather(v, take[bounds[i]:bounds[i + 1]]), (batch_dim, *specs[c][1]))
                for c, v in columns.items()}))

        dataset = tf.data.Dataset.range(1).flat_map(one_pass)
    else:
        def stacks() -> Iterator[dict[str, np.ndarray]]:
            planned = cursor.next_pass()
            b, bounds = request.batch_size, planned.bounds
            full_batches = planned.steps if planned.steps == 0 or bounds[-1] - bounds[-2] == b else planned.steps - 1
            for first_batch in range(0, full_batches, _STACK_BATCHES):
                last = min(full_batches, first_batch + _STACK_BATCHES)
                columns = blocks.gather(planned.rows[bounds[first_batch]:bounds[last]], needed)
                yield {c: v.reshape(last - first_batch, b, *v.shape[1:]) for c, v in columns.items()}
            if full_batches < planned.steps:
                columns = blocks.gather(planned.rows[bounds[-2]:bounds[-1]], needed)
                yield {c: v[None] for c, v in columns.items()}

        batch_dim = request.batch_size if request.drop_remainder else None
        signature = {c: tf.TensorSpec((None, batch_dim, *shape), dtype) for c, (dtype, shape) in specs.items()}
        dataset = tf.data.Dataset.from_generator(stacks, output_signature=signature).unbatch().map(split)
    if cursor.start.is_fresh(cursor.rows):
        # Every pass is a whole epoch: Keras can count steps and size its progress without a pass.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(full))
    dataset = _finish(dataset.prefetch(tf.data.AUTOTUNE))
    setattr(dataset, _PLANNED_MARK, cursor)
    return dataset

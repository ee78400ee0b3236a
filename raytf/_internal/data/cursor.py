"""Position: where the group stands in a shard's passes, and what a checkpoint records of it.

The third stage of the data path (source -> plan -> position -> reader -> tf.data). A
:class:`Cursor` follows one rank's passes over a planned shard (a :class:`FileCursor` over a file
source's plan) as position.py plans them: the rest of an interrupted epoch first, cut over this
group, then whole epochs. Each checkpoint raytf commits records every split dataset's position
(:meth:`Cursor.position_after`; in a custom loop, from the batches it took from the strategy's
iterator, :meth:`Cursor.taken_position`; :func:`positions_at`), so a restart, of any size and on
any nodes, trains what the interrupted epoch has not trained, once (:func:`resume_point`).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import threading
from typing import Any, Collection, Optional

import numpy as np

from raytf._internal.data import position as _position
from raytf._internal.data.files import FilePlan, Layout
from raytf._internal.worker.strategy import cursor_of  # noqa: F401 - where the data path's users find it

logger = logging.getLogger(__name__)
_iterations = itertools.count()  # orders Cursor.iterated calls in this process


class Cursor:
    """One rank's passes over a planned shard, and where the group stands in them."""

    def __init__(
        self,
        name: str,
        rows: int,
        start: _position.Position,
        seed: int,
        shuffle: bool,
        world_rank: int,
        world_size: int,
        batch: int,
        drop_remainder: bool,
    ):
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
        return _position.plan_pass(
            self.epoch_start(epoch),
            self.rows,
            self.shuffle,
            self.seed,
            self.world_rank,
            self.world_size,
            self.batch,
            self.drop,
        )

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


def positions_at(
    cursors: dict[str, Cursor], done: Any, epoch: Optional[int], step: int, exact: Collection[str]
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


def resume_point(
    name: str, recorded: Any, rows: int, first_epoch: int, seed: int, shuffle: bool, world_size: int
) -> tuple[_position.Position, int]:
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
        logger.warning(
            "dataset %r: the checkpoint's data position is not usable (%s); epoch %d starts over",
            name,
            error,
            first_epoch,
        )
        return _position.Position.fresh(first_epoch, rows, world_size), seed
    if position.is_fresh(rows):  # a whole epoch: cut for this group
        position = _position.Position.fresh(position.epoch, rows, world_size)
    return position, recorded_seed


class FileCursor(Cursor):
    """A rank's passes over a file source: runs of positions, not rows, since the rows are read
    from the files in the epoch's :class:`Layout`."""

    def __init__(self, plan: FilePlan, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.plan = plan
        self._layout: Optional[Layout] = None
        self.files_read: list[int] = []  # the files of the pass being read (indices into plan.files)

    def next_run(self) -> tuple[Layout, _position.Ranges, np.ndarray]:
        """The next pass: the epoch's layout, the rank's run in it, the batches' bounds."""
        with self._lock:
            epoch = self.start.epoch + self._passes
            self._passes += 1
            if self._layout is None or self._layout.epoch != epoch:
                self._layout = Layout(self.plan, self.shuffle, self.seed, epoch)
            layout = self._layout
        run, bounds = _position.plan_run(
            self.epoch_start(epoch), self.world_rank, self.world_size, self.batch, self.drop
        )
        return layout, run, bounds

    def record(self, position: _position.Position) -> dict[str, Any]:
        return {**super().record(position), "files": files_digest(self.plan)}


def files_digest(plan: FilePlan) -> str:
    """The files and their rows, in a few bytes: a checkpoint's position fits only these."""
    return hashlib.sha256(repr(plan.signature()).encode()).hexdigest()[:16]

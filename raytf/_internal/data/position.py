"""Where a split dataset stands in its epoch, and which rows each rank trains next.

Every epoch of a split dataset has one order of its N rows (seeded: the same on every rank
and in every attempt). The group that starts an epoch, of W ranks, cuts the rows into W
contiguous runs of equal length (the first ``N mod W`` one row longer); the epoch's order is
run 0, then run 1, ..., each in a seeded permutation of its own with ``shuffle=True``. So a
group that keeps its size trains the same rows on each rank every epoch, in a new order each
time, and a rank holds only its run (its cache is converted once). A :class:`Position` is the
epoch, the size its order was cut for, and the stretches of the order no step has trained
yet, as half-open ranges of positions in it: a fresh epoch is ``[(0, N)]``. That is all a
checkpoint needs to carry to resume exactly (a few integers per dataset, whatever its size).

A group of W ranks cuts what remains into W contiguous runs of equal length and each rank
trains its run in order, ``batch`` rows a step; every rank takes the same number of steps,
the last batch taking what its run has left (one row more than ``batch`` at most). After k
steps each rank has trained the first k batches of its run, so what remains is each run's
tail: the next Position. A group of another size (a restart on fewer nodes, an elastic
resize) cuts those tails anew, so every row of the epoch is trained exactly once, spread over
whoever trains it; the epoch after is cut for the new size.

Pure functions, no TensorFlow and no Ray: the worker's shard (planned.py) and the tests use
them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class Position:
    """A split dataset's epoch, the group size its order was cut for, and the ranges of that
    order not trained yet."""

    epoch: int
    remaining: Ranges
    cut: int = 1

    @staticmethod
    def fresh(epoch: int, rows: int, cut: int) -> "Position":
        return Position(epoch, ((0, rows),) if rows else (), cut)

    @property
    def rows_left(self) -> int:
        return sum(end - start for start, end in self.remaining)

    def is_fresh(self, rows: int) -> bool:
        return self.remaining == Position.fresh(self.epoch, rows, self.cut).remaining

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "remaining": [list(r) for r in self.remaining], "cut": self.cut}

    @staticmethod
    def from_json(raw: Any, rows: int) -> "Position":
        """A position as a checkpoint recorded it, checked against the dataset's ``rows``;
        ValueError says what does not fit (another dataset under the same name)."""
        if not isinstance(raw, dict) or not all(_is_int(raw.get(k)) for k in ("epoch", "cut")) or raw["cut"] < 1:
            raise ValueError(f"not a data position: {raw!r}")
        ranges: list[tuple[int, int]] = []
        for item in raw.get("remaining", []):
            start, end = (int(v) for v in item)
            if not 0 <= start < end <= rows or (ranges and start < ranges[-1][1]):
                raise ValueError(f"its range {item} does not fit a dataset of {rows} rows")
            ranges.append((start, end))
        return Position(int(raw["epoch"]), tuple(ranges), int(raw["cut"]))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def order(rows: int, shuffle: bool, seed: int, epoch: int, cut: int) -> np.ndarray:
    """Epoch ``epoch``'s order of the rows (position -> row index), cut for ``cut`` ranks:
    their runs in turn, each permuted on its own with ``shuffle``."""
    if not shuffle:
        return np.arange(rows, dtype=np.int64)
    parts = []
    for rank, run in enumerate(runs_of(((0, rows),), cut)):
        for start, end in run:  # one range (none where there are fewer rows than ranks)
            parts.append(start + np.random.default_rng((seed, epoch, rank)).permutation(end - start))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def dataset_seed(seed: int, name: str) -> int:
    """The seed of one dataset's orders, from the run's data seed (or the user's ``seed``)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:7], "little")


def runs_of(remaining: Ranges, world_size: int) -> list[Ranges]:
    """``remaining`` in ``world_size`` contiguous runs of equal length (the first ``R mod W``
    one row longer), in rank order."""
    total = sum(end - start for start, end in remaining)
    base, extra = divmod(total, world_size)
    runs: list[Ranges] = []
    pieces = iter(remaining)
    start, end = next(pieces, (0, 0))
    for rank in range(world_size):
        need = base + (1 if rank < extra else 0)
        run = []
        while need:
            if start == end:
                start, end = next(pieces)
            take = min(need, end - start)
            run.append((start, start + take))
            start += take
            need -= take
        runs.append(tuple(run))
    return runs


def steps(run_lengths: Sequence[int], batch: int, drop_remainder: bool) -> int:
    """The steps every rank takes over runs of these lengths: the shortest run's full batches,
    and with ``drop_remainder=False`` one more for what is left (which every rank then has, or,
    when fewer rows than ranks remain, some ranks have as an empty batch)."""
    shortest, longest = min(run_lengths), max(run_lengths)
    if drop_remainder:
        return shortest // batch
    if shortest == 0:
        return 1 if longest else 0
    return -(-shortest // batch)


def batch_bounds(length: int, batch: int, count: int, drop_remainder: bool) -> np.ndarray:
    """Where each of a run's ``count`` batches starts and ends (``count + 1`` offsets): ``batch``
    rows each, the last taking the rest of the run (with ``drop_remainder``, ``batch`` too)."""
    bounds = np.arange(count + 1, dtype=np.int64) * batch
    if count and not drop_remainder:
        bounds[-1] = length
    return bounds


def trained(length: int, batch: int, count: int, done: int, drop_remainder: bool) -> int:
    """Rows of a run of ``length`` trained after ``done`` of its ``count`` steps."""
    return int(batch_bounds(length, batch, count, drop_remainder)[min(done, count)])


def positions(run: Ranges) -> np.ndarray:
    """A run's positions in the epoch's order, in the order the rank trains them."""
    if not run:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.arange(start, end, dtype=np.int64) for start, end in run])


def advance(position: Position, rows: int, world_size: int, batch: int, drop_remainder: bool, done: int) -> Position:
    """The position after a group of ``world_size`` ranks trained ``done`` steps from ``position``.
    A finished epoch is the next one, fresh; with ``drop_remainder`` the rows no step took are
    not trained this epoch."""
    runs = runs_of(position.remaining, world_size)
    count = steps([_length(r) for r in runs], batch, drop_remainder)
    if done >= count:
        return Position.fresh(position.epoch + 1, rows, world_size)
    tails: list[tuple[int, int]] = []
    for run in runs:
        skip = trained(_length(run), batch, count, done, drop_remainder)
        for start, end in run:
            if skip >= end - start:
                skip -= end - start
                continue
            start, skip = start + skip, 0
            if tails and tails[-1][1] == start:
                tails[-1] = (tails[-1][0], end)
            else:
                tails.append((start, end))
    return Position(position.epoch, tuple(tails), position.cut)


def _length(run: Ranges) -> int:
    return sum(end - start for start, end in run)


@dataclass(frozen=True)
class Pass:
    """One rank's pass over an epoch (or the rest of one): the rows, in order, and the batches."""

    epoch: int
    start: Position  # where the group stood when the pass began
    rows: np.ndarray  # row indices into the dataset, in training order
    bounds: np.ndarray  # count + 1 offsets into ``rows``
    # A whole epoch cut for this group: the rank's rows are all of [start, end), every such epoch.
    local: Optional[tuple[int, int]] = None

    @property
    def steps(self) -> int:
        return len(self.bounds) - 1


def plan_run(
    start: Position, world_rank: int, world_size: int, batch: int, drop_remainder: bool
) -> tuple[Ranges, np.ndarray]:
    """Rank ``world_rank``'s run of positions from ``start``, and its batches' bounds in it."""
    runs = runs_of(start.remaining, world_size)
    count = steps([_length(r) for r in runs], batch, drop_remainder)
    return runs[world_rank], batch_bounds(_length(runs[world_rank]), batch, count, drop_remainder)


def plan_pass(
    start: Position,
    rows: int,
    shuffle: bool,
    seed: int,
    world_rank: int,
    world_size: int,
    batch: int,
    drop_remainder: bool,
    epoch_order: Optional[np.ndarray] = None,
) -> Pass:
    """Rank ``world_rank``'s pass from ``start``."""
    mine, bounds = plan_run(start, world_rank, world_size, batch, drop_remainder)
    where = positions(mine)
    epoch_order = order(rows, shuffle, seed, start.epoch, start.cut) if epoch_order is None else epoch_order
    local = None
    if start.is_fresh(rows) and start.cut == world_size:
        local = mine[0] if mine else (0, 0)
    return Pass(start.epoch, start, epoch_order[where], bounds, local)

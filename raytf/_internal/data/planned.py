"""Source: a split dataset's materialized blocks, as every rank of an attempt gets them.

With ``DataConfig(exactly_once=True)`` (the default) the driver materializes each split
dataset once per run, in order, into Ray's object store (driver/plans.py) and hands every
rank a :class:`PlannedShard`: the blocks, and the run's data seed. A rank reads the blocks
(zero-copy on their node) through :class:`Blocks`. Which rows each pass trains is the plan's
(position.py), where the group stands the cursor's (cursor.py), and the pipeline the reader's
(read_blocks.py): every row of an epoch trained exactly once, whatever happens to the group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raytf._internal.data.columns import aligned_empty, stack_column
from raytf._internal.data.request import KeptShardLost


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
        into arrays TensorFlow takes without a copy (columns.host_tensor)."""
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
        assert self._first is not None  # asked only for a column of ``names``, which a shard with rows has
        values = self.block(self._first)[column]
        return values.dtype, values.shape[1:]

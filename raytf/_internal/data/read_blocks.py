"""Reader: a planned shard's tf.data, every row of an epoch trained exactly once, whatever
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

from typing import Any, Iterator

import numpy as np

from raytf._internal.data.columns import STACK_BATCHES, host_tensor
from raytf._internal.data.cursor import Cursor
from raytf._internal.data.planned import Blocks
from raytf._internal.data.request import ShardRequest, check_rows
from raytf.errors import DatasetShardError


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
        specs[c] = (tf.string if dtype == object else tf.as_dtype(dtype), shape)  # noqa: E721 - numpy "O"
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
            return tf.data.Dataset.range(count).map(
                lambda i: split(
                    {
                        c: tf.ensure_shape(tf.gather(v, take[bounds[i] : bounds[i + 1]]), (batch_dim, *specs[c][1]))
                        for c, v in columns.items()
                    }
                )
            )

        dataset = tf.data.Dataset.range(1).flat_map(one_pass)
    else:

        def stacks() -> Iterator[dict[str, np.ndarray]]:
            planned = cursor.next_pass()
            b, bounds = request.batch_size, planned.bounds
            full_batches = planned.steps if planned.steps == 0 or bounds[-1] - bounds[-2] == b else planned.steps - 1
            for first_batch in range(0, full_batches, STACK_BATCHES):
                last = min(full_batches, first_batch + STACK_BATCHES)
                columns = blocks.gather(planned.rows[bounds[first_batch] : bounds[last]], needed)
                yield {c: v.reshape(last - first_batch, b, *v.shape[1:]) for c, v in columns.items()}
            if full_batches < planned.steps:
                columns = blocks.gather(planned.rows[bounds[-2] : bounds[-1]], needed)
                yield {c: v[None] for c, v in columns.items()}

        batch_dim = request.batch_size if request.drop_remainder else None
        signature = {c: tf.TensorSpec((None, batch_dim, *shape), dtype) for c, (dtype, shape) in specs.items()}
        dataset = tf.data.Dataset.from_generator(stacks, output_signature=signature).unbatch().map(split)
    if cursor.start.is_fresh(cursor.rows):
        # Every pass is a whole epoch: Keras can count steps and size its progress without a pass.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(full))
    return dataset.prefetch(tf.data.AUTOTUNE)  # tfdata.finish makes it the shard

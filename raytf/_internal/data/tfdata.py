"""tf.data: the last stage of the data path (source -> plan -> position -> reader -> tf.data).

A reader's pipeline (read_blocks.py, read_files.py, read_stream.py) becomes the worker's shard
here, in one place: never sharded again by TensorFlow (Ray Data or raytf's plan already did),
marked per worker for raytf's strategy, and, for an exactly-once shard, marked with its cursor.
shard.py calls it on every pipeline it hands out.
"""

from __future__ import annotations

from typing import Any


def finish(dataset: Any, cursor: Any = None) -> Any:
    """A reader's pipeline as the worker's shard: TensorFlow told not to shard it again, and marked
    as a per-worker dataset the strategy distributes per worker; with the :class:`~raytf._internal.data.cursor.Cursor`
    of an exactly-once shard, marked with it too (cursor.cursor_of finds it through the datasets
    built from it)."""
    import tensorflow as tf

    from raytf._internal.worker import strategy as _strategy

    options = tf.data.Options()
    # The data is already sharded by Ray Data; TensorFlow must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # Per-worker batches: raytf's strategy distributes it (and all built from it) per worker.
    dataset = _strategy.mark_shard(dataset.with_options(options))
    if cursor is not None:
        setattr(dataset, _strategy.PLANNED_MARK, cursor)
    return dataset

"""Reader: the tf.data pipelines a streamed (not exactly-once) shard becomes, at in-memory speed.

Where the time goes in Ray's ``to_tf``: it wraps ``iter_batches`` in
``tf.data.Dataset.from_generator``, so every batch crosses from TensorFlow's
C++ runtime into Python, holds the GIL while Ray Data slices and converts it,
and crosses back. On a worker with one or two CPUs that Python work competes
with the training step itself.

raytf takes two paths that keep Python out of the per-batch loop:

- ``cache=True`` (default): the shard is read once, in whole blocks, into
  NumPy arrays in the worker's memory. Every epoch then runs entirely inside
  tf.data: a shuffled range of row indices is batched, and each batch is one
  ``tf.gather`` per column. There is no per-row work at all, which is why this
  beats ``from_tensor_slices(...).batch(...)``, which slices row by row.
- ``cache=False``: for shards larger than memory. Each epoch streams the shard
  from Ray Data again; the generator yields stacks of many batches at once, so
  Python is crossed once per stack, not once per batch.

Every worker yields the same number of batches each epoch: splits are made
with ``streaming_split(equal=True)`` (Ray Data drops at most ``num_workers - 1``
rows so every split has the same row count), and on the cached path the
workers also agree on the smallest row count through one collective before the
first epoch.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from raytf._internal.data.columns import STACK_BATCHES, stack_column
from raytf._internal.data.request import ShardRequest
from raytf.errors import DatasetShardError


class EpochOrders:
    """The row order of each pass over a shard: epoch ``e``'s is a permutation
    seeded by ``(seed, e)``, so it depends on the epoch, not on how many passes
    this process has made. A run resumed at epoch 3 shuffles epoch 3 as a run
    without a failure did, which is what makes resumed training reproducible."""

    def __init__(self, rows: int, seed: Optional[int], first_epoch: int = 0):
        self.rows = rows
        self.seed = seed
        self.epoch = first_epoch

    def order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng(None if self.seed is None else (self.seed, epoch))
        return rng.permutation(self.rows).astype(np.int64)

    def next(self) -> np.ndarray:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return self.order(epoch)


def dataset_from_arrays(
    arrays: dict[str, np.ndarray], request: ShardRequest, rows: int, seed: Optional[int], first_epoch: int = 0
) -> Any:
    """tf.data over in-memory columns: batches of shuffled row indices, one gather per column."""
    import tensorflow as tf

    features, label = request.columns(list(arrays))
    needed = features + ([label] if label is not None else [])
    with tf.device("/cpu:0"):
        tensors = {c: tf.convert_to_tensor(arrays[c][:rows]) for c in needed}
    if request.shuffle:
        orders = EpochOrders(rows, seed, first_epoch)
        # One Python call per pass over the data (when its iterator is made), none per batch.
        indices = tf.data.Dataset.range(1).flat_map(
            lambda _: tf.data.Dataset.from_tensor_slices(tf.reshape(tf.py_function(orders.next, [], tf.int64), [rows]))
        )
    else:
        indices = tf.data.Dataset.range(rows)
    indices = indices.batch(request.batch_size, drop_remainder=request.drop_remainder)
    batches = rows // request.batch_size + (0 if request.drop_remainder or rows % request.batch_size == 0 else 1)
    # Known cardinality: Keras can count steps and size its progress without a pass.
    indices = indices.apply(tf.data.experimental.assert_cardinality(batches))
    single = isinstance(request.features, str)

    def take(index: Any) -> Any:
        x = tf.gather(tensors[features[0]], index) if single else {c: tf.gather(tensors[c], index) for c in features}
        return x if label is None else (x, tf.gather(tensors[label], index))

    dataset = indices.map(take, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _spec_of(column: str, arrow_type: Any, dataset: str) -> tuple[Any, tuple[Optional[int], ...]]:
    """(tf dtype, per-row shape) of a column, from its Arrow type."""
    import pyarrow as pa
    import tensorflow as tf

    if isinstance(arrow_type, pa.ExtensionType):  # Ray Data's tensor column types
        shape = getattr(arrow_type, "shape", None)
        if shape is None or any(d is None for d in shape):
            raise DatasetShardError(
                f"raytf.get_dataset_shard({dataset!r}): column {column!r} is ragged (variable-"
                "shaped tensors); give it a fixed shape in Ray Data first"
            )
        value_type = getattr(arrow_type, "value_type", None) or arrow_type.scalar_type  # before Ray 2.51: scalar_type
        return tf.as_dtype(value_type.to_pandas_dtype()), tuple(shape)
    if pa.types.is_fixed_size_list(arrow_type):
        dtype, inner = _spec_of(column, arrow_type.value_type, dataset)
        return dtype, (arrow_type.list_size, *inner)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        raise DatasetShardError(
            f"raytf.get_dataset_shard({dataset!r}): column {column!r} is a variable-length list "
            "(ragged); use cache=True, which accepts lists of one length, or give it a fixed "
            "shape in Ray Data first"
        )
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_binary(arrow_type):
        return tf.string, ()
    return tf.as_dtype(arrow_type.to_pandas_dtype()), ()


def streaming_dataset(iterator: Any, request: ShardRequest, schema: Any, seed: Optional[int]) -> Any:
    """tf.data that streams the shard from Ray Data every epoch, many batches per Python crossing."""
    import tensorflow as tf

    arrow_schema = getattr(schema, "base_schema", schema)  # ray.data.Schema wraps pyarrow's
    names = list(arrow_schema.names)
    features, label = request.columns(names)
    types = {name: arrow_schema.field(name).type for name in names}
    needed = features + ([label] if label is not None else [])
    specs = {c: _spec_of(c, types[c], request.name) for c in needed}
    epoch = [0]

    def stacks():
        local_seed = None if seed is None else (seed + epoch[0]) % (2**31)
        epoch[0] += 1
        rows = 0
        b = request.batch_size
        carry: dict[str, np.ndarray] = {}
        # Ask Ray Data for many batches' worth of rows at once and view each chunk
        # as a [batches, batch_size, ...] stack: no Python work per batch. Rows
        # left over from a short chunk (local shuffling makes some) lead the next.
        for chunk in iterator.iter_batches(
            batch_size=b * STACK_BATCHES,
            batch_format="numpy",
            local_shuffle_buffer_size=b * STACK_BATCHES * 2 if request.shuffle else None,
            local_shuffle_seed=local_seed,
            prefetch_batches=2,
        ):
            columns = {c: stack_column(c, request.name, chunk[c]) for c in needed}
            if carry:
                columns = {c: np.concatenate([carry[c], v]) for c, v in columns.items()}
            n = len(columns[needed[0]])
            full = n // b
            rows += full * b
            if full:
                yield {c: v[: full * b].reshape(full, b, *v.shape[1:]) for c, v in columns.items()}
            carry = {c: v[full * b :] for c, v in columns.items()} if n % b else {}
        if carry:
            rows += len(carry[needed[0]])
            if not request.drop_remainder:
                yield {c: v[None] for c, v in carry.items()}
        if rows < b:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({request.name!r}): batch_size={b} is larger than the "
                f"worker's shard ({rows} rows); lower batch_size or pass more data"
            )

    batch_dim = request.batch_size if request.drop_remainder else None
    signature = {c: tf.TensorSpec((None, batch_dim, *shape), dtype) for c, (dtype, shape) in specs.items()}
    single = isinstance(request.features, str)

    def split(stack: dict[str, Any]) -> Any:
        x = stack[features[0]] if single else {c: stack[c] for c in features}
        return x if label is None else (x, stack[label])

    dataset = tf.data.Dataset.from_generator(stacks, output_signature=signature)
    dataset = dataset.unbatch().map(split, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)

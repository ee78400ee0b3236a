"""The tf.data pipelines a worker's shard becomes, at in-memory speed.

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

from raytf._internal.data.request import ShardRequest
from raytf.errors import DatasetShardError

_STACK_BATCHES = 32  # batches per Python crossing on the streaming path
_ALIGN = 64  # bytes: the alignment TensorFlow's CPU kernels (Eigen) assume of a tensor's buffer


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array whose buffer starts on a 64-byte boundary (one TensorFlow can use
    as it is, :func:`host_tensor`); an object array as NumPy makes it."""
    dtype = np.dtype(dtype)
    if dtype == object:
        return np.empty(shape, dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + _ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start:start + size].view(dtype).reshape(shape)


def host_tensor(array: np.ndarray) -> Any:
    """``array`` as a CPU tensor. A numeric, C-contiguous array on a 64-byte boundary is taken
    without a copy (DLPack; the tensor keeps the array alive): ``tf.convert_to_tensor`` copies,
    twice at its peak, which for a worker's cached share of a large dataset is GiBs. Anything else
    (strings, booleans, another layout) is converted."""
    import tensorflow as tf

    if (array.size and array.dtype.kind in "fiu" and array.flags.c_contiguous
            and array.ctypes.data % _ALIGN == 0):
        try:
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        except (TypeError, ValueError, BufferError, tf.errors.InvalidArgumentError):
            pass
    return tf.convert_to_tensor(array)


def stack_column(name: str, dataset: str, values: np.ndarray) -> np.ndarray:
    """One column as a dense array; a ragged column is an error that names it."""
    if values.dtype != object:
        return values
    if len(values) and isinstance(values[0], (str, bytes)):
        return values
    try:
        shapes = {np.shape(v) for v in values}
    except Exception:  # noqa: BLE001 - any odd element is reported as ragged below
        shapes = {None, ()}
    if len(shapes) > 1:
        shown = sorted(str(s) for s in shapes)[:3]
        raise DatasetShardError(
            f"raytf.get_dataset_shard({dataset!r}): column {name!r} is ragged (rows of shapes "
            f"{', '.join(shown)}, ...); pad or truncate it to a fixed shape in Ray Data first, "
            "e.g. with map_batches"
        )
    return np.stack(list(values)) if len(values) else values


def read_shard(iterator: Any, dataset: str) -> dict[str, np.ndarray]:
    """Every row of a shard, column by column, read in whole blocks."""
    parts: dict[str, list[np.ndarray]] = {}
    for batch in iterator.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=4):
        for column, values in batch.items():
            parts.setdefault(column, []).append(stack_column(column, dataset, values))
    arrays = {}
    for column, chunks in parts.items():
        try:
            arrays[column] = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        except ValueError:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({dataset!r}): column {column!r} is ragged (its blocks "
                "have different shapes); give it a fixed shape in Ray Data first"
            ) from None
    return arrays

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
    arrays: dict[str, np.ndarray],
    request: ShardRequest,
    rows: int,
    seed: Optional[int],
    first_epoch: int = 0,
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
            lambda _: tf.data.Dataset.from_tensor_slices(
                tf.reshape(tf.py_function(orders.next, [], tf.int64), [rows])
            )
        )
    else:
        indices = tf.data.Dataset.range(rows)
    indices = indices.batch(request.batch_size, drop_remainder=request.drop_remainder)
    batches = rows // request.batch_size + (0 if request.drop_remainder or rows % request.batch_size == 0 else 1)
    # Known cardinality: Keras can count steps and size its progress without a pass.
    indices = indices.apply(tf.data.experimental.assert_cardinality(batches))
    single = isinstance(request.features, str)

    def take(index: Any) -> Any:
        x = (
            tf.gather(tensors[features[0]], index)
            if single
            else {c: tf.gather(tensors[c], index) for c in features}
        )
        return x if label is None else (x, tf.gather(tensors[label], index))

    dataset = indices.map(take, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _finish(dataset.prefetch(tf.data.AUTOTUNE))


def _finish(dataset: Any) -> Any:
    import tensorflow as tf

    from raytf._internal.worker import strategy as _strategy

    options = tf.data.Options()
    # The data is already sharded by Ray Data; TensorFlow must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # Per-worker batches: raytf's strategy distributes it (and all built from it) per worker.
    return _strategy.mark_shard(dataset.with_options(options))


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
            batch_size=b * _STACK_BATCHES,
            batch_format="numpy",
            local_shuffle_buffer_size=b * _STACK_BATCHES * 2 if request.shuffle else None,
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
    signature = {
        c: tf.TensorSpec((None, batch_dim, *shape), dtype) for c, (dtype, shape) in specs.items()
    }
    single = isinstance(request.features, str)

    def split(stack: dict[str, Any]) -> Any:
        x = stack[features[0]] if single else {c: stack[c] for c in features}
        return x if label is None else (x, stack[label])

    dataset = tf.data.Dataset.from_generator(stacks, output_signature=signature)
    dataset = dataset.unbatch().map(split, num_parallel_calls=tf.data.AUTOTUNE)
    return _finish(dataset.prefetch(tf.data.AUTOTUNE))

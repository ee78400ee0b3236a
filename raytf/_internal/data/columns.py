"""Source: a shard's columns as NumPy arrays TensorFlow takes as they are.

The first stage of the data path (source -> plan -> position -> reader -> tf.data; shard.py ties
them): a Ray Data batch's columns made dense (:func:`stack_column`, a ragged one an error that
names it), a whole shard read in blocks (:func:`read_shard`), and host arrays TensorFlow takes
without a copy (:func:`aligned_empty`, :func:`host_tensor`). The readers (read_blocks.py,
read_stream.py) build on these.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raytf.errors import DatasetShardError

STACK_BATCHES = 32  # batches per Python crossing on the streaming path
_ALIGN = 64  # bytes: the alignment TensorFlow's CPU kernels (Eigen) assume of a tensor's buffer


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array whose buffer starts on a 64-byte boundary (one TensorFlow can use
    as it is, :func:`host_tensor`); an object array as NumPy makes it."""
    dtype = np.dtype(dtype)
    if dtype == object:  # noqa: E721 - a numpy dtype equals object where it is "O"
        return np.empty(shape, dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + _ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % _ALIGN
    return raw[start : start + size].view(dtype).reshape(shape)


def host_tensor(array: np.ndarray) -> Any:
    """``array`` as a CPU tensor. A numeric, C-contiguous array on a 64-byte boundary is taken
    without a copy (DLPack; the tensor keeps the array alive): ``tf.convert_to_tensor`` copies,
    twice at its peak, which for a worker's cached share of a large dataset is GiBs. Anything else
    (strings, booleans, another layout) is converted."""
    import tensorflow as tf

    if array.size and array.dtype.kind in "fiu" and array.flags.c_contiguous and array.ctypes.data % _ALIGN == 0:
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
        shapes: set[Any] = {np.shape(v) for v in values}
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

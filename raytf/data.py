"""Reading training data the way TensorFlow code already describes it.

``read_tfrecords`` reads TFRecord files through Ray Data and parses them with a TensorFlow
feature spec, as ``tf.io.parse_example`` takes one: every feature becomes a column of its
fixed shape and dtype (a ``[784]`` float feature: a tensor column, not a list per row), a
missing value takes the spec's default, and features the spec does not name are dropped. The Dataset it returns
goes to ``Trainer(datasets=...)`` like any other, exactly once per epoch by default
(``DataConfig``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from raytf.errors import ConfigError, DataError

__all__ = ["parquet_files", "read_tfrecords", "tfrecord_files"]


def tfrecord_files(
    paths: Union[str, Sequence[str]], features: Mapping[str, Any], *, chunk_rows: int = 1024, shuffle_rows: int = 8192
) -> Any:
    """A directory (or list) of uncompressed TFRecord files of ``tf.train.Example``, read by each
    worker directly with TensorFlow's reader, for ``Trainer(datasets={name: ...})``; parsed by
    ``features`` as in :func:`read_tfrecords`. Every row of an epoch is trained once, whatever
    happens to the group: each checkpoint records the position by file and record.

    The driver counts the records once per run (reading their headers) while the workers start.
    ``get_dataset_shard(shuffle=True)`` orders the chunks of ``chunk_rows`` records anew every
    epoch and permutes the rows within windows of about ``shuffle_rows`` (at most 64 MiB; a worker
    holds a few windows at a time), seeded as for any dataset. Paths are local (on every node) or
    URIs TensorFlow opens (``gs://``; ``s3://`` needs tensorflow-io)."""
    from raytf._internal.data.files import FileSource

    return FileSource(
        "tfrecord",
        _paths(paths, "tfrecord_files"),
        features=feature_spec(features),
        chunk_rows=_positive("tfrecord_files", "chunk_rows", chunk_rows),
        shuffle_rows=_positive("tfrecord_files", "shuffle_rows", shuffle_rows),
    )


def parquet_files(paths: Union[str, Sequence[str]], columns: Optional[Sequence[str]] = None) -> Any:
    """A directory (or list) of Parquet files, read by each worker directly with pyarrow, row group
    by row group, for ``Trainer(datasets={name: ...})``: numbers, strings and fixed-size lists
    (tensor columns) of ``columns`` (default: all). Every row of an epoch is trained once, as
    with :func:`tfrecord_files`; with ``shuffle=True`` the row groups are ordered anew every epoch
    and each one's rows permuted. Paths are local (on every node) or URIs pyarrow opens
    (``s3://``, ``gs://``)."""
    from raytf._internal.data.files import FileSource

    if columns is not None and (isinstance(columns, str) or not all(isinstance(c, str) for c in columns)):
        raise ConfigError(f"raytf.data.parquet_files(columns=...) takes a list of column names, got {columns!r}")
    return FileSource("parquet", _paths(paths, "parquet_files"), columns=tuple(columns) if columns else None)


def _paths(paths: Union[str, Sequence[str]], function: str) -> tuple[str, ...]:
    found = (paths,) if isinstance(paths, str) else tuple(paths)
    if not found or not all(isinstance(p, str) and p for p in found):
        raise ConfigError(f"raytf.data.{function}(paths=...) takes a path or a list of paths, got {paths!r}")
    return found


def _positive(function: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"raytf.data.{function}({name}=...) must be an int >= 1, got {value!r}")
    return value


def read_tfrecords(paths: Union[str, Sequence[str]], features: Mapping[str, Any], **read_args: Any) -> Any:
    """TFRecord files of ``tf.train.Example`` as a Ray Dataset, parsed by ``features``:
    ``{name: tf.io.FixedLenFeature(shape, dtype, default_value=None)}``, one block per file, in
    the files' order. Each file is read whole by a Ray Data task and its records parsed by
    TensorFlow's ``tf.io.parse_example`` in one call (Ray Data's own ``read_tfrecords`` parses
    each Example in Python, about 150x slower here). ``read_args`` go to
    ``ray.data.read_binary_files`` (``filesystem``, ``file_extensions``, ...); the files are
    uncompressed TFRecord."""
    import ray

    spec = feature_spec(features)
    return ray.data.read_binary_files(paths if isinstance(paths, str) else list(paths), **read_args).map_batches(
        _ParseFiles(spec), batch_format="numpy", batch_size=1
    )


def feature_spec(features: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype, Optional[np.ndarray]]]:
    """``features`` as (shape, NumPy dtype, default or None) per name; a ValueError names any
    entry that is not a ``tf.io.FixedLenFeature`` of a fixed shape."""
    if not isinstance(features, Mapping) or not features:
        raise ConfigError(
            "raytf.data.read_tfrecords / tfrecord_files(features=...) takes a dict of feature names to "
            f"tf.io.FixedLenFeature, got {features!r}"
        )
    spec = {}
    for name, feature in features.items():
        if type(feature).__name__ != "FixedLenFeature":
            raise ConfigError(
                f"raytf.data.read_tfrecords: feature {name!r} is a {type(feature).__name__}; only "
                "tf.io.FixedLenFeature(shape, dtype) is read (a row's values must have one shape: pad "
                "variable-length features when writing, or read them with ray.data.read_tfrecords)"
            )
        shape = tuple(int(d) for d in feature.shape)
        dtype = np.dtype(object) if feature.dtype.name == "string" else np.dtype(feature.dtype.as_numpy_dtype)
        default = None
        if feature.default_value is not None:
            default = np.broadcast_to(np.asarray(feature.default_value, dtype=dtype), shape)
        spec[name] = (shape, dtype, default)
    return spec


def records(data: bytes, name: str = "a TFRecord file") -> list[bytes]:
    """The records of one uncompressed TFRecord file's bytes (each: a little-endian uint64
    length, its masked CRC, the data, the data's masked CRC)."""
    import struct

    view, out, at = memoryview(data), [], 0
    while at < len(data):
        if at + 12 > len(data):
            raise DataError(
                f"raytf.data.read_tfrecords: {name} ends inside a record's header (truncated, or "
                "compressed: the files must be uncompressed TFRecord)"
            )
        (length,) = struct.unpack_from("<Q", data, at)
        end = at + 12 + length + 4
        if end > len(data):
            raise DataError(
                f"raytf.data.read_tfrecords: {name} ends inside a record of {length} bytes (truncated, "
                "or compressed: the files must be uncompressed TFRecord)"
            )
        out.append(bytes(view[at + 12 : at + 12 + length]))
        at = end
    return out


class _ParseFiles:
    """Ray Data's file bytes, one file per call, as the spec's columns, parsed by TensorFlow."""

    def __init__(self, spec: Mapping[str, tuple[tuple[int, ...], np.dtype, Optional[np.ndarray]]]):
        self.spec = dict(spec)
        self._features: Any = None

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        if self._features is None:
            self._features = {
                name: tf.io.FixedLenFeature(
                    shape,
                    tf.string if dtype == object else tf.as_dtype(dtype),  # noqa: E721 - numpy "O"
                    default_value=default,
                )
                for name, (shape, dtype, default) in self.spec.items()
            }
        serialized = [r for data in batch["bytes"] for r in records(bytes(data))]
        if not serialized:
            return {name: np.empty((0, *shape), dtype=dtype) for name, (shape, dtype, _) in self.spec.items()}
        try:
            parsed = tf.io.parse_example(tf.constant(serialized), self._features)
        except tf.errors.InvalidArgumentError as error:
            raise DataError(
                f"raytf.data.read_tfrecords: a record does not fit the feature spec: {error.message.splitlines()[0]}"
            ) from None
        return {name: parsed[name].numpy() for name in self.spec}

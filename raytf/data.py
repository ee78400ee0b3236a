"""Reading training data the way TensorFlow code already describes it.

``read_tfrecords`` is Ray Data's ``read_tfrecords`` with a TensorFlow feature spec, as
``tf.io.parse_example`` takes one: every feature becomes a column of its fixed shape and
dtype (a ``[784]`` float feature: a tensor column, not a list per row), a missing value takes
the spec's default, and features the spec does not name are dropped. The Dataset it returns
goes to ``Trainer(datasets=...)`` like any other, exactly once per epoch by default
(``DataConfig``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

__all__ = ["read_tfrecords"]


def read_tfrecords(paths: Union[str, Sequence[str]], features: Mapping[str, Any], **read_args: Any) -> Any:
    """TFRecord files of ``tf.train.Example`` as a Ray Dataset, parsed by ``features``:
    ``{name: tf.io.FixedLenFeature(shape, dtype, default_value=None)}``. ``read_args`` go to
    ``ray.data.read_tfrecords`` (``override_num_blocks``, ``filesystem``, ...)."""
    import ray

    return ray.data.read_tfrecords(paths, **read_args).map_batches(
        _Parse(feature_spec(features)), batch_format="numpy", batch_size=None)


def feature_spec(features: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], np.dtype, Optional[np.ndarray]]]:
    """``features`` as (shape, NumPy dtype, default or None) per name; a ValueError names any
    entry that is not a ``tf.io.FixedLenFeature`` of a fixed shape."""
    if not isinstance(features, Mapping) or not features:
        raise ValueError("raytf.data.read_tfrecords(features=...) takes a dict of feature names to "
                         f"tf.io.FixedLenFeature, got {features!r}")
    spec = {}
    for name, feature in features.items():
        if type(feature).__name__ != "FixedLenFeature":
            raise ValueError(
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


class _Parse:
    """One block of Ray Data's TFRecord columns, as the spec's fixed-shape columns."""

    def __init__(self, spec: Mapping[str, tuple[tuple[int, ...], np.dtype, Optional[np.ndarray]]]):
        self.spec = dict(spec)

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(batch.values()))) if batch else 0
        out = {}
        for name, (shape, dtype, default) in self.spec.items():
            values = batch.get(name)
            size = int(np.prod(shape, dtype=np.int64))
            if values is not None and values.dtype != object and values.size == rows * size:
                out[name] = values.astype(dtype).reshape(rows, *shape)  # a scalar feature: already a column
                continue
            if values is not None and rows and all(v is not None and np.size(v) == size for v in values):
                out[name] = np.stack([np.asarray(v, dtype=dtype) for v in values]).reshape(rows, *shape)
                continue
            column = np.empty((rows, *shape), dtype=dtype)  # some records lack it, or hold another count
            for i in range(rows):
                value = None if values is None else values[i]
                if value is None or (np.ndim(value) and len(value) == 0 and shape):
                    if default is None:
                        raise ValueError(f"raytf.data.read_tfrecords: a record has no feature {name!r}, and its "
                                         "FixedLenFeature has no default_value")
                    value = default
                value = np.asarray(value, dtype=dtype)
                if value.size != size:
                    raise ValueError(f"raytf.data.read_tfrecords: feature {name!r} has {value.size} values in a "
                                     f"record, its FixedLenFeature shape {list(shape)} holds {size}")
                column[i] = value.reshape(shape)
            out[name] = column
        return out

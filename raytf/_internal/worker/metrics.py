"""What ``raytf.report`` takes as metrics: plain JSON-friendly values under names of the user's."""

from __future__ import annotations

import numbers
from typing import Any

from raytf._internal.protocol import HISTORY_KEYS
from raytf.errors import ConfigError


def clean_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` as the driver records them; a name raytf uses itself or a value it cannot
    record is an error that names it."""
    clean = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise ConfigError(f"raytf.report(metrics): metric names must be str, got {key!r}")
        if key in HISTORY_KEYS:
            raise ConfigError(
                f"raytf.report(metrics): the metric name {key!r} is raytf's (every history entry "
                f"carries {', '.join(HISTORY_KEYS)}); rename the metric, e.g. to 'my_{key}'"
            )
        clean[key] = to_plain(value, key)
    return clean


def to_plain(value: Any, name: str) -> Any:
    """A metric as JSON-friendly Python: tensors and NumPy values become numbers and lists."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "numpy") and callable(value.numpy):  # tf.Tensor, tf.Variable
        return to_plain(value.numpy(), name)
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy scalars and arrays
        return to_plain(value.tolist(), name)
    if isinstance(value, (list, tuple)):
        return [to_plain(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v, f"{name}.{k}") for k, v in value.items()}
    raise ConfigError(
        f"raytf.report(metrics): metric {name!r} is a {type(value).__name__}; "
        "report numbers, strings, tensors or lists of them"
    )

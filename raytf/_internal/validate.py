"""The checks every config makes of its values, with messages that name the setting and the value."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional, Sequence

from raytf._internal.redact import redact
from raytf.errors import ConfigError


def check_number(setting: str, value: object, *, minimum: float = 0.0, forever: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{setting} must be a number, got {value!r}")
    if math.isinf(value):
        raise ConfigError(
            f"{setting} must be a finite number, got {value!r}" + ("; pass None to wait forever" if forever else "")
        )
    if value < minimum:
        raise ConfigError(f"{setting} must be >= {minimum:g}, got {value!r}")
    return float(value)


def check_bool(setting: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{setting} must be True or False, got {value!r}")


def check_mapping(setting: str, value: object) -> dict:
    """A mapping setting as a dict; None means empty, as in Ray Train."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{setting} must be a dict, got {type(value).__name__} {value!r}")
    return dict(value)


def check_int(setting: str, value: object, *, minimum: int, maximum: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{setting} must be an int, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{setting} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{setting} must be <= {maximum}, got {value}")
    return value


def check_choice(setting: str, value: object, choices: Sequence[str], *, upper: bool) -> str:
    """``value`` normalised to the case of ``choices``, or an error listing them."""
    normalised = (value.upper() if upper else value.lower()) if isinstance(value, str) else value
    if not isinstance(normalised, str) or normalised not in choices:
        raise ConfigError(f"{setting} must be one of {', '.join(choices)}, got {value!r}")
    return normalised


def check_timeout(setting: str, value: Optional[float]) -> None:
    if value is None:
        return
    if check_number(setting, value, forever=True) <= 0:
        raise ConfigError(f"{setting} must be > 0 seconds or None to wait forever, got {value!r}")


def check_environment(setting: str, value: object) -> dict[str, str]:
    """A mapping of environment variables: names without ``=`` or NUL, string values."""
    env = check_mapping(setting, value)
    for key, item in env.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise ConfigError(f"{setting} must map str to str, got {key!r}: {item!r}")
        if not key or "=" in key or "\0" in key:
            raise ConfigError(
                f"{setting}: {key!r} is not an environment variable name (it must be non-empty, without '=' or NUL)"
            )
        if "\0" in item:
            raise ConfigError(f"{setting}[{key!r}] contains a NUL character")
    return env


def check_count(setting: str, value: object, maximum: int) -> object:
    """A count of actors: an int, or an elastic ``(min, max)`` pair (returned as a tuple)."""
    if not isinstance(value, (tuple, list)):
        return check_int(setting, value, minimum=1, maximum=maximum)
    if len(value) != 2:
        raise ConfigError(f"{setting} must be an int or a (min, max) pair, got {value!r}")
    low = check_int(f"{setting}[0] (min)", value[0], minimum=1, maximum=maximum)
    high = check_int(f"{setting}[1] (max)", value[1], minimum=1, maximum=maximum)
    if low > high:
        raise ConfigError(f"{setting}=(min, max) needs min <= max, got {tuple(value)!r}")
    return (low, high)


def check_resources(setting: str, value: object, *, cpus: str, gpus: str) -> dict[str, float]:
    """Custom Ray resources per actor; CPUs and GPUs have settings of their own (``cpus``, ``gpus``)."""
    resources = check_mapping(setting, value)
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{setting} keys must be resource names, got {name!r}")
        if name in ("CPU", "GPU"):
            raise ConfigError(f"{setting}[{name!r}]: set CPUs and GPUs with {cpus} and {gpus} instead")
        check_number(f"{setting}[{name!r}]", amount)
    return resources


def check_storage(storage_path: object, storage_filesystem: Any) -> None:
    """RunConfig's storage: a path or URI, or a plain path on a ``pyarrow.fs.FileSystem``. A URI is
    shown redacted (it may hold the keys pyarrow reads from it)."""
    if not isinstance(storage_path, (str, os.PathLike)) or not str(storage_path):
        raise ConfigError(
            f"RunConfig.storage_path must be a directory or a URI such as s3://bucket/prefix, got {storage_path!r}"
        )
    if storage_filesystem is not None:
        import pyarrow.fs as pafs

        if not isinstance(storage_filesystem, pafs.FileSystem):
            raise ConfigError(
                f"RunConfig.storage_filesystem must be a pyarrow.fs.FileSystem, got {type(storage_filesystem).__name__}"
            )
        if "://" in str(storage_path):
            raise ConfigError(
                "RunConfig.storage_path must be a plain path on storage_filesystem, not a URI, "
                f"got {redact(storage_path)!r}"
            )

"""A worker's output as the driver shows it: the user's lines, prefixed by rank; TensorFlow's chatter, not.

TensorFlow's C++ code logs through Abseil before anything initializes Abseil's
logging, so ``TF_CPP_MIN_LOG_LEVEL`` does not reach those lines ("All log
messages before absl::InitializeLog()...", oneDNN and CUDA-stub notices on
every CPU worker). The worker therefore passes its own stdout and stderr
through a filter at the file-descriptor level, before Ray's log monitor
forwards them to the driver: lines of TensorFlow's C++ logging below
``TensorflowConfig.log_level`` are dropped, and on CPU workers so are the
CUDA stubs' complaints that there is no GPU. Everything else (the user's
prints, tracebacks, warnings) passes unchanged. Ray's log prefix names the
actor; raytf renames it ``raytf rank N`` once the rank is known.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from typing import Optional

# TensorFlow's C++ log levels, as TensorflowConfig.log_level names them.
LEVELS = ("info", "warning", "error", "fatal")
# Abseil's prefix; before its logging is initialized the seconds field holds the epoch time.
_ABSL_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ (\S+):\d+\] ")
_ALWAYS_DROPPED = ("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",)
# Ray Data's routine notices when raytf reads a worker's shard in the worker itself.
_SHARD_READ_NOTICES = ("Progress bars disabled. To enable, set", "tqdm is not installed")
# On a worker with no GPU: the CUDA stubs saying there is none, at whatever level.
_NO_GPU_SOURCES = re.compile(r"^(cuda_\w+|cudart_stub|gpu_device|cuda_executor|cuda_platform)\.cc$")
_NO_GPU_PHRASES = ("TF-TRT Warning", "Unable to register cu", "failed call to cuInit")


def keep(line: str, level: str, use_gpu: bool) -> bool:
    """Whether a line of a worker's output reaches the driver."""
    if line.rstrip("\n") in _ALWAYS_DROPPED:
        return False
    if not use_gpu and any(p in line for p in _NO_GPU_PHRASES):
        return False
    if any(p in line for p in _SHARD_READ_NOTICES) or ("Dataset" in line and "execution finished in" in line):
        return False
    match = _ABSL_LINE.match(line)
    if match is None:
        return True
    severity, source = match.groups()
    if not use_gpu and _NO_GPU_SOURCES.match(source):
        return False
    return "IWEF".index(severity) >= LEVELS.index(level)


def tf_cpp_min_log_level(level: str) -> str:
    """TF_CPP_MIN_LOG_LEVEL for a log level (it still governs TensorFlow's initialized logging)."""
    return str(LEVELS.index(level))


class OutputFilter:
    """Routes file descriptors 1 and 2 through :func:`keep`, line by line, in a daemon thread each."""

    def __init__(self, level: str = "error", use_gpu: bool = False):
        self.level = level
        self.use_gpu = use_gpu
        self._installed = False

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        for fd in (1, 2):
            original = os.dup(fd)
            read, write = os.pipe()
            os.dup2(write, fd)
            os.close(write)
            threading.Thread(target=self._pump, args=(read, original), name=f"raytf-output-{fd}", daemon=True).start()

    def _pump(self, read: int, original: int) -> None:
        with os.fdopen(read, "rb", buffering=0) as source:
            pending = b""
            while True:
                chunk = source.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > 65536:  # no newline in sight: pass it on as it is
                    lines.append(pending)
                    pending = b""
                kept = [line for line in lines if keep(line.decode("utf-8", "replace"), self.level, self.use_gpu)]
                if kept:
                    os.write(original, b"\n".join(kept) + b"\n")
            if pending:
                os.write(original, pending)


def name_in_log_prefix(name: str) -> None:
    """Make Ray's log prefix for this actor's lines ``(<name> pid=...)``."""
    from raytf._internal import hooks
    from raytf._internal.hooks import ray as ray_hooks

    prefix = hooks.named("ray.log_prefix").call_or_warn(ray_hooks.log_prefix_actor_name)
    if prefix is None:  # Ray's own prefix stays
        return
    for stream in (sys.stdout, sys.stderr):
        stream.write(f"{prefix}{name}\n")
        stream.flush()


class DropMessages:
    """A logging filter that drops records whose message contains any of ``phrases``."""

    def __init__(self, *phrases: str):
        self.phrases = phrases

    def filter(self, record: object) -> bool:
        message = getattr(record, "getMessage", lambda: "")()
        return not any(p in message for p in self.phrases)


def quiet_tensorflow_python() -> Optional[object]:
    """Drop TensorFlow's warning about raytf's own eager collectives (shard sizes, preemption checks)."""
    import logging

    dropped = DropMessages("eagerly has significant overhead")
    logging.getLogger("tensorflow").addFilter(dropped)
    return dropped

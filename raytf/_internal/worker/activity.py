"""What a worker's training thread is doing, for the driver's hang detection.

A collective needs every rank. When one rank stops taking part (its
``train_fn`` returned early, or it sits in its own code: a sleep, a lock, a
slow read) the others wait inside TensorFlow with no error, forever by
default, and the rank that stopped answers the driver's polls as if all were
well. Each poll therefore samples the training thread's stack: the innermost
frame tells whether it is inside TensorFlow, in raytf's own code, or in the
user's. The driver compares the ranks (:mod:`raytf._internal.driver.hang`).
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import time
from types import FrameType
from typing import Callable, Optional

from raytf._internal.protocol import Activity, ActivityKind

logger = logging.getLogger(__name__)

# How deep the walk goes at most: far past any training stack, short of a loop in a torn read.
_MAX_FRAMES = 1000

# raytf's package directory (this file is raytf/_internal/worker/activity.py).
_RAYTF_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
_STDLIB_DIRS = tuple(
    os.path.abspath(p) + os.sep for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
)


def _tensorflow_dir() -> Optional[str]:
    module = sys.modules.get("tensorflow")
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


# Where the user's training code lives when it is an installed package (site-packages): the
# directory of train_fn's top-level package, or its module's file. Frames there are the user's.
_user_roots: tuple[str, ...] = ()


def note_user_code(fn: object) -> None:
    """Count the package that defines ``fn`` (``train_fn``) as the user's code, wherever it is
    installed: a ``train_fn`` that a user installed with pip and that idles is still named."""
    global _user_roots
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if module is None or module.__name__ == "__main__":
        return
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    path = getattr(top, "__file__", None)
    if not path:
        return
    path = os.path.abspath(path)
    root = os.path.dirname(path) + os.sep if os.path.basename(path) == "__init__.py" else path
    if root.startswith(_RAYTF_DIR) or root in _user_roots:
        return
    tensorflow = _tensorflow_dir()
    if tensorflow and root.startswith(tensorflow):
        return
    _user_roots = _user_roots + (root,)


def _is_user_package(path: str) -> bool:
    return any(path == root or (root.endswith(os.sep) and path.startswith(root)) for root in _user_roots)


def _is_library(path: str) -> bool:
    if _is_user_package(path):
        return False
    return (
        path.startswith("<")  # frozen modules, exec'd strings
        or f"{os.sep}site-packages{os.sep}" in path
        or f"{os.sep}dist-packages{os.sep}" in path
        or path.startswith(_STDLIB_DIRS)
    )


def classify(frame: Optional[FrameType]) -> tuple[ActivityKind, str]:
    """(kind, where) of a thread whose innermost frame is ``frame``; see :class:`Activity`.

    The kind is that of the innermost frame that is TensorFlow's, raytf's or
    the user's, skipping other libraries and the standard library (a
    TensorFlow collective may wait in a ``multiprocessing`` pool, a Ray Data
    read in Ray's code). ``where`` is the innermost frame of the user's code.
    """
    tensorflow = _tensorflow_dir()
    kind: Optional[ActivityKind] = None
    where = ""
    current = frame
    # The frames are another thread's, read while it may run between two of this loop's steps:
    # on CPython 3.11 a frame's f_back then at times names what is no frame at all (a function,
    # seen in a worker whose every poll then failed, and whose rank was taken for unresponsive).
    # The walk ends at the first such link, with what it found up to there.
    for _ in range(_MAX_FRAMES):
        if where or not isinstance(current, FrameType):
            break
        code = current.f_code
        path = getattr(code, "co_filename", None)
        if not isinstance(path, str):
            break
        if tensorflow and path.startswith(tensorflow):
            kind = kind or ActivityKind.TENSORFLOW
        elif path.startswith(_RAYTF_DIR):
            kind = kind or ActivityKind.RAYTF
        elif not _is_library(path):
            kind = kind or ActivityKind.PYTHON
            where = f"{path}:{current.f_lineno} in {code.co_name}"
        current = current.f_back
    return kind or ActivityKind.RAYTF, where


class ActivityTracker:
    """How long the training thread has continuously been of one kind, sampled at each poll."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._kind: Optional[ActivityKind] = None
        self._since = 0.0

    def _update(self, kind: ActivityKind, where: str) -> Activity:
        now = self._clock()
        if kind != self._kind:
            self._kind, self._since = kind, now
        return Activity(kind, now - self._since, where)

    def sample(self, thread_ident: Optional[int]) -> Activity:
        """The thread's activity now. It never raises: a poll answers for the worker's life, and a
        sample that could not be read (see ``classify``) must not make a live rank silent."""
        try:
            frame = sys._current_frames().get(thread_ident) if thread_ident is not None else None
            kind, where = classify(frame)
        except Exception:  # noqa: BLE001 - whatever a torn read of another thread's frames raises
            logger.debug("could not read the training thread's stack", exc_info=True)
            kind, where = self._kind or ActivityKind.RAYTF, ""
        return self._update(kind, where)

    def finished(self) -> Activity:
        return self._update(ActivityKind.FINISHED, "")

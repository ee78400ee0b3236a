"""Keeping a worker's process for the next attempt (``FailureConfig.keep_survivors``).

When an attempt of a MultiWorkerMirroredStrategy group ends (a peer lost, a preemption, an
exception), the ranks that outlived it are live processes with TensorFlow, Keras and
``train_fn``'s modules loaded: seconds of CPU each. The driver (driver/survivors.py) asks each to
``recycle`` instead of killing it: its ``train_fn`` is stopped (its collectives aborted, so an
all-reduce waiting on the lost peer raises at once), what the attempt set up in the process is
undone, and TensorFlow gets a new eager context joined to no cluster (hooks/tensorflow/eager.py).
The next attempt then starts it on the same bundle as it starts a warm standby.

What stays: every module imported, and what they hold. TensorFlow objects a module made when it
was imported (a module-level variable or constant) belong to the last attempt's context: make
them inside ``train_fn``, or set ``FailureConfig.keep_survivors=False``. The old context's gRPC
server also stays (TensorFlow cannot stop one), listening on the last attempt's port; a process is
kept for at most :data:`MAX_REUSES` attempts after its first.
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any, Optional

from raytf._internal import hooks as _hooks
from raytf._internal.hooks import tensorflow as _tf_hooks
from raytf._internal.hooks._hook import warn_once
from raytf._internal.worker import compression as _compression
from raytf._internal.worker import session as _session
from raytf._internal.worker import strategy as _strategy
from raytf.errors import HookError

MAX_REUSES = 4  # attempts a process trains after its first (each leaves an idle gRPC server behind)
_ABORTED = "raytf: the attempt ended; this worker goes on to the next one"


def stop(payload: Any, thread: Optional[threading.Thread], timeout_s: float) -> Optional[str]:
    """End this attempt's ``train_fn``: abort its collectives and wait up to ``timeout_s`` for its
    thread. None once it has ended, else why the process cannot be kept."""
    from raytf._internal.worker.payloads import TrainFnPayload

    if payload is not None and not isinstance(payload, TrainFnPayload):
        return "not a train_fn worker under MultiWorkerMirroredStrategy"
    uploading = getattr(getattr(payload, "session", None), "uploading", None)
    if uploading is not None and uploading():
        return "an asynchronous checkpoint of the attempt is still uploading"
    if thread is None or not thread.is_alive():
        return None
    if "tensorflow" in sys.modules:
        why = _through("tensorflow.abort_collectives", _tf_hooks.abort_collectives, _ABORTED)
        if why is not None:
            return why
    thread.join(timeout_s)
    return f"its train_fn did not end within {timeout_s:g} s of the attempt's end" if thread.is_alive() else None


def reset() -> Optional[str]:
    """Undo what an attempt set up in this process (its session, its strategy, what Keras built on
    it, gradient compression) and give TensorFlow a new eager context. None once done, else why not."""
    _session.install(None)
    _strategy.uninstall()
    _compression.install(None, False)
    for name in ("keras", "tf_keras"):
        backend = getattr(sys.modules.get(name), "backend", None)
        if backend is not None:
            backend.clear_session()
    gc.collect()
    if "tensorflow" not in sys.modules:
        return None
    return _through("tensorflow.reset_context", _tf_hooks.reset_context)


def _through(name: str, reach: Any, *args: Any) -> Optional[str]:
    """``reach(*args)`` through the optional hook ``name``: None, or the HookError's text, warned
    once in this process (the process is then not kept: the restart starts a new one)."""
    hook = _hooks.named(name)
    try:
        hook.call(reach, *args)
    except HookError as error:
        warn_once(hook, error)
        return str(error)
    return None

"""A worker's one-time load (TensorFlow, Keras, the user's modules) with Python's cyclic garbage
collector paused, and what it loaded set aside from later collections.

Importing TensorFlow creates some 300,000 Python objects and almost no cyclic garbage. While it
runs, the collector's allocation counts trigger full collections that walk every object made so
far, again and again: a quarter of ``import tensorflow``'s CPU on a 2-core machine (2.1 s with the
collector on, 1.6 s paused). Every worker start and every restart pays it, and so does the rest of
the worker's life: a full collection during tracing or training walks the modules' objects too.

So the load runs with the collector paused, and ends with ``gc.freeze()``: the objects it made
(modules, classes, functions, which live as long as the process) move to the permanent
generation, which collections skip. Reference counting still frees them; only a cycle among
them that becomes garbage later stays, as it would in any process that imported them and
exited. Loads may overlap (a warm standby's load in a background thread, then its start): the
collector resumes when the last one ends, and stays off where the process had turned it off.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_active = 0
_was_enabled = True


@contextlib.contextmanager
def paused_collector() -> Iterator[None]:
    """Run the body with the cyclic collector paused; freeze what exists when the last load ends."""
    global _active, _was_enabled
    with _lock:
        if _active == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                gc.freeze()
                if _was_enabled:
                    gc.enable()

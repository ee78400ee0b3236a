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

The threads that load and train run on a deep data stack (:func:`on_a_deep_stack`): CPython 3.11
and 3.12 give a thread's Python frames their memory in chunks of 16 KiB, map a new chunk when a
call does not fit in the current one, and unmap it as soon as that call returns (CPython issue
gh-142183; 3.13's later releases and 3.14 keep one chunk instead). Code whose call depth goes up
and down across a chunk's end maps and unmaps a chunk, and faults its first page in, at every
crossing: ``import tensorflow`` crossed 15,000 to 30,000 times on Python 3.11 (by its starting
depth), some 4% of its CPU in one thread alone, more where the worker's other threads make each
unmap a TLB flush on the other cores. One frame that reserves half a MiB of the stack makes
CPython map a chunk of a MiB for it, and every call below it runs in the rest: 83 unmaps where
there were 15,559 (tests/unit/test_worker_local.py).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
import types
from collections.abc import Iterator
from typing import Any, Callable

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


# Slots (8 bytes each) the trampoline's frame reserves: CPython maps a chunk at the next power of
# two of 16 KiB above a frame's size, 1 MiB here, so that ~60,000 slots are left for the calls below.
_DEEP_STACK_SLOTS = 65536


def _trampoline(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    return function(*args, **kwargs)


# The same function with a frame that reserves _DEEP_STACK_SLOTS more of the data stack, unused:
# a code object's stack size is only an upper bound CPython reserves, and nothing initializes it.
_deep_trampoline = types.FunctionType(
    _trampoline.__code__.replace(co_stacksize=_trampoline.__code__.co_stacksize + _DEEP_STACK_SLOTS),
    _trampoline.__globals__,
    "_deep_trampoline",
)


def on_a_deep_stack(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, called below a frame that makes CPython give the calling thread a data-stack
    chunk of a MiB (module docstring): the calls it makes do not map and unmap chunks as their
    depth goes up and down. Use it as a thread's target, or for a whole load."""

    @functools.wraps(function)
    def deep(*args: Any, **kwargs: Any) -> Any:
        return _deep_trampoline(function, args, kwargs)

    return deep

"""A function run in a thread from now, its result (or error) waited for where it is needed."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable


def lowest_priority() -> None:
    """Give the calling thread the lowest CPU priority (Linux, where a thread has a nice value of
    its own); elsewhere, or in a sandbox that refuses it, the thread keeps its priority."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


class Background:
    """``function()`` run in a thread from now, at the lowest CPU priority with ``low_priority``;
    :meth:`result` waits for it (and raises its error)."""

    def __init__(self, function: Callable[[], Any], name: str, *, low_priority: bool = False):
        self._outcome: list = []

        def run() -> None:
            if low_priority:
                lowest_priority()
            try:
                self._outcome.append((function(), None))
            except BaseException as error:  # noqa: BLE001 - raised in the caller of result()
                self._outcome.append((None, error))

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        value, error = self._outcome[0]
        if error is not None:
            raise error
        return value

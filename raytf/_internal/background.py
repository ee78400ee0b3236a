"""A function run in a thread from now, its result (or error) waited for where it is needed."""

from __future__ import annotations

import threading
from typing import Any, Callable


class Background:
    """``function()`` run in a thread from now; :meth:`result` waits for it (and raises its error)."""

    def __init__(self, function: Callable[[], Any], name: str):
        self._outcome: list = []

        def run() -> None:
            try:
                self._outcome.append((function(), None))
            except Exception as error:  # noqa: BLE001 - raised in the caller of result()
                self._outcome.append((None, error))

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        value, error = self._outcome[0]
        if error is not None:
            raise error
        return value

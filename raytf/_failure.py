"""The failure policy: decides whether a failed attempt is retried. Imports no Ray."""

from __future__ import annotations

import enum
from typing import Sequence

from raytf.config import FailureConfig
from raytf.errors import WorkerFailure


class Decision(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


def root_cause(failures: Sequence[WorkerFailure]) -> WorkerFailure:
    """The failure that ended an attempt, out of everything the ranks reported.

    A lost worker (dead or unresponsive) takes its peers down with it: their
    collectives fail within a second. So a loss is the cause whenever there is
    one; otherwise the earliest exception is, since later ones on other ranks
    are usually the collective errors it triggered.
    """
    if not failures:
        raise ValueError("root_cause needs at least one failure")
    lost = [f for f in failures if f.kind != "exception"]
    return min(lost or failures, key=lambda f: (f.time, f.rank))


class FailurePolicy:
    """Keeps the failure count and decides; the controller carries the decision out."""

    def __init__(self, config: FailureConfig):
        self._config = config
        self.failures: list[WorkerFailure] = []

    def _exhausted(self) -> bool:
        limit = self._config.max_failures
        return limit != -1 and len(self.failures) > limit

    def decide(self, failure: WorkerFailure) -> Decision:
        self.failures.append(failure)
        if failure.kind == "exception" and not self._config.retry_on_exception:
            return Decision.RAISE
        if self._exhausted():
            return Decision.RAISE
        return Decision.RETRY

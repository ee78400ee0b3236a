"""The failure policy: decides whether a failed attempt is retried. Imports no Ray."""

from __future__ import annotations

import enum
from typing import Sequence

from raytf.config import FailureConfig
from raytf.errors import FailureKind, WorkerFailure


class Decision(enum.Enum):
    RETRY = "retry"
    RAISE = "raise"


LOST = (FailureKind.DIED, FailureKind.UNRESPONSIVE, FailureKind.NOT_STARTED)
# A rank that stopped taking part while its peers waited for it (see raytf._internal.driver.hang).
STOPPED = (FailureKind.STALLED, FailureKind.RETURNED_EARLY)
# Retried whatever max_failures says: nobody's fault (port races only up to FREE_PORT_RACES).
NOT_COUNTED = (FailureKind.PREEMPTED, FailureKind.RESIZED, FailureKind.PORT_TAKEN)
# A launched script whose server lost raytf's port handover is retried with new ports this many
# times without counting; past it, every further race counts against max_failures as a failure
# (a machine where ports are taken that often has a problem no number of retries fixes).
FREE_PORT_RACES = 3
# Raised on the side of a collective whose peer went away: a loss, not a bug in train_fn.
PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "CancelledError", "AbortedError")


def root_cause(failures: Sequence[WorkerFailure]) -> WorkerFailure:
    """The failure that ended an attempt, out of everything the ranks reported.

    A lost worker (dead, unresponsive, never started) takes its peers down
    with it: their collectives fail within a second. So a loss is the cause
    whenever there is one; then an exception from ``train_fn`` (a peer's
    collective errors are what it triggered); then a rank that stopped
    taking part (returned early, or idle while the others waited); then the
    collective errors themselves. Within a kind, the earliest.
    """
    if not failures:
        raise ValueError("root_cause needs at least one failure")
    for kinds in (LOST + (FailureKind.PORT_TAKEN,), (FailureKind.EXCEPTION,), STOPPED):
        found = [f for f in failures if f.kind in kinds]
        if found:
            return min(found, key=lambda f: (f.time, f.rank))
    return min(failures, key=lambda f: (f.time, f.rank))


class FailurePolicy:
    """Keeps the failure count and decides; the controller carries the decision out."""

    def __init__(self, config: FailureConfig):
        self._config = config
        self.failures: list[WorkerFailure] = []
        # Failures that continue one already decided (a replacement in place that did not come up):
        # recorded, so the run's failures tell the whole story, but counted once, as one loss.
        self._continuations: list[WorkerFailure] = []

    @property
    def counted(self) -> int:
        """Failures that count against ``max_failures`` (preemptions do not, nor the first
        FREE_PORT_RACES port races)."""
        races = sum(1 for f in self.failures if f.kind == FailureKind.PORT_TAKEN)
        counted = sum(1 for f in self.failures if f.kind not in NOT_COUNTED and not self._continues(f))
        return counted + max(0, races - FREE_PORT_RACES)

    def continues(self, failure: WorkerFailure) -> None:
        """``failure`` is how recovering from a failure already decided ended (its replacement in place
        did not come up, and the group restarts): deciding it records it without counting it again."""
        self._continuations.append(failure)

    def _continues(self, failure: WorkerFailure) -> bool:
        return any(failure is c for c in self._continuations)

    def _exhausted(self) -> bool:
        limit = self._config.max_failures
        return limit != -1 and self.counted > limit

    def decide(self, failure: WorkerFailure) -> Decision:
        self.failures.append(failure)
        if failure.kind == FailureKind.RESIZED:  # no budget: GrowBack spaces out a flapping node's growths
            return Decision.RETRY
        if failure.kind == FailureKind.PREEMPTED:
            limit = self._config.max_preemptions
            preemptions = sum(1 for f in self.failures if f.kind == FailureKind.PREEMPTED)
            return Decision.RAISE if limit != -1 and preemptions > limit else Decision.RETRY
        if failure.kind == FailureKind.PORT_TAKEN:
            return Decision.RAISE if self._exhausted() else Decision.RETRY
        # An exception, or a train_fn that returned before its peers, is the training
        # code's doing: a retry would do it again, unless the user says otherwise.
        if failure.kind in (FailureKind.EXCEPTION, FailureKind.RETURNED_EARLY) and not self._config.retry_on_exception:
            return Decision.RAISE
        if self._exhausted():
            return Decision.RAISE
        return Decision.RETRY

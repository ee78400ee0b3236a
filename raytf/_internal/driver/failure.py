"""The run's failures, as the driver records them, and the failure policy's decision on each
(``FailureConfig(policy=...)``, raytf.policies; ``DefaultFailurePolicy`` without one). Imports no Ray."""

from __future__ import annotations

from typing import Sequence

from raytf.config import FailureConfig
from raytf.errors import ConfigError, FailureKind, WorkerFailure
from raytf.policies import FREE_PORT_RACES, DefaultFailurePolicy, FailureDecision, FailureHistory, FailurePolicy

__all__ = ["FREE_PORT_RACES", "FailureBook", "FailureDecision", "LOST", "NOT_COUNTED", "STOPPED", "root_cause"]

LOST = (FailureKind.DIED, FailureKind.UNRESPONSIVE, FailureKind.NOT_STARTED)
# A rank that stopped taking part while its peers waited for it (see raytf._internal.driver.hang).
STOPPED = (FailureKind.STALLED, FailureKind.RETURNED_EARLY)
# Retried whatever max_failures says: nobody's fault (port races only up to FREE_PORT_RACES).
NOT_COUNTED = (FailureKind.PREEMPTED, FailureKind.RESIZED, FailureKind.PORT_TAKEN)
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


class FailureBook:
    """Records the run's failures and asks the run's policy about each; the controller carries
    the decision out."""

    def __init__(self, config: FailureConfig):
        self._config = config
        self._policy: FailurePolicy = config.policy if config.policy is not None else DefaultFailurePolicy()
        self.failures: list[WorkerFailure] = []
        # Failures that continue one already decided (a replacement in place that did not come up):
        # recorded, so the run's failures tell the whole story, but counted once, as one loss.
        self._continuations: list[WorkerFailure] = []

    @property
    def counted(self) -> int:
        """Failures that count against ``max_failures`` (preemptions do not, nor growths, nor the
        first FREE_PORT_RACES port races)."""
        races = sum(1 for f in self.failures if f.kind == FailureKind.PORT_TAKEN)
        counted = sum(1 for f in self.failures if f.kind not in NOT_COUNTED and not self._continues(f))
        return counted + max(0, races - FREE_PORT_RACES)

    def continues(self, failure: WorkerFailure) -> None:
        """``failure`` is how recovering from a failure already decided ended (its replacement in place
        did not come up, and the group restarts): deciding it records it without counting it again."""
        self._continuations.append(failure)

    def _continues(self, failure: WorkerFailure) -> bool:
        return any(failure is c for c in self._continuations)

    def decide(self, failure: WorkerFailure) -> FailureDecision:
        self.failures.append(failure)
        history = FailureHistory(
            failures=tuple(self.failures),
            counted=self.counted,
            preemptions=sum(1 for f in self.failures if f.kind == FailureKind.PREEMPTED),
            config=self._config,
        )
        decision = self._policy.decide(failure, history)
        if not isinstance(decision, FailureDecision):
            raise ConfigError(
                f"{type(self._policy).__name__}.decide returned {decision!r}: a FailurePolicy returns a "
                "raytf.FailureDecision (FailureDecision.RETRY, FailureDecision.RAISE, or one with delay_s)"
            )
        return decision

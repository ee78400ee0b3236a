"""The driver's state machine: schedule a worker group, watch it, restart or stop.

Plain Python with no Ray import: the worker group is passed in, so the
controller is tested with a fake group in milliseconds. Each state is a small
object carrying its payload; :meth:`Controller.step` moves one transition.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Union

from raytf._failure import Decision, FailurePolicy, root_cause
from raytf._status import GroupStatus, Report
from raytf.errors import TrainingFailedError, WorkerFailure

logger = logging.getLogger(__name__)


class WorkerGroup(Protocol):
    def start(self, attempt: int) -> None: ...

    def poll(self) -> GroupStatus: ...

    def shutdown(self) -> None: ...

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None: ...


@dataclass(frozen=True)
class Scheduling:
    attempt: int


@dataclass(frozen=True)
class Running:
    """Training. ``failures`` seen so far this attempt, held for the grace period."""

    attempt: int
    failures: tuple[WorkerFailure, ...] = ()
    failing_since: Optional[float] = None


@dataclass(frozen=True)
class Restarting:
    attempt: int
    failure: WorkerFailure


@dataclass(frozen=True)
class Finished:
    attempt: int


@dataclass(frozen=True)
class Errored:
    attempt: int
    error: BaseException


State = Union[Scheduling, Running, Restarting, Finished, Errored]
TERMINAL = (Finished, Errored)


class Controller:
    """Runs one training run to the end: every attempt, every restart.

    ``on_report`` records a report and commits its checkpoint, if any; it
    returns None, or why the checkpoint could not be committed.
    """

    def __init__(
        self,
        group: WorkerGroup,
        policy: FailurePolicy,
        on_report: Callable[[Report], Optional[str]],
        *,
        poll_interval_s: float = 0.1,
        failure_grace_s: float = 3.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._group = group
        self._policy = policy
        self._on_report = on_report
        self._poll_interval_s = poll_interval_s
        self._failure_grace_s = failure_grace_s
        self._sleep = sleep
        self._clock = clock
        self.state: State = Scheduling(attempt=0)

    def step(self) -> tuple[State, State]:
        previous = self.state
        self.state = self._next(previous)
        if type(self.state) is not type(previous):
            logger.debug("controller: %s -> %s", previous, self.state)
        return previous, self.state

    def run(self) -> Finished:
        """Step until the run finishes; raise its error if it failed.

        The worker group is shut down on every way out, including
        KeyboardInterrupt and errors raised by the report callback.
        """
        try:
            while not isinstance(self.state, TERMINAL):
                self.step()
        finally:
            self._group.shutdown()
        if isinstance(self.state, Errored):
            raise self.state.error
        return self.state

    def _next(self, state: State) -> State:
        if isinstance(state, Scheduling):
            try:
                self._group.start(state.attempt)
            except Exception as error:  # placement timeout, a worker that never came up
                return Errored(state.attempt, error)
            return Running(state.attempt)
        if isinstance(state, Running):
            return self._watch(state)
        if isinstance(state, Restarting):
            return Scheduling(state.attempt + 1)
        return state

    def _watch(self, state: Running) -> State:
        status = self._group.poll()
        for report in status.reports:
            # on_report commits a reported checkpoint; the worker's report() returns on the ack.
            error = self._on_report(report)
            if report.checkpoint is not None:
                self._group.acknowledge(report.rank, report.seq, error)
        failures = state.failures + status.failures
        if failures and not self._cause_is_clear(state, failures):
            # A worker that raised may have done so because a peer died (its
            # collective failed first); wait briefly for the loss to surface.
            self._sleep(self._poll_interval_s)
            return Running(state.attempt, failures, state.failing_since or self._clock())
        if failures:
            self._group.shutdown()
            failure = root_cause(failures)
            decision = self._policy.decide(failure)
            if decision is Decision.RETRY:
                logger.warning(
                    "attempt %d failed (%s); restarting the worker group",
                    state.attempt,
                    failure.describe(),
                )
                return Restarting(state.attempt, failure)
            return Errored(
                state.attempt, TrainingFailedError(failure, tuple(self._policy.failures))
            )
        if status.finished:
            return Finished(state.attempt)
        self._sleep(self._poll_interval_s)
        return state

    def _cause_is_clear(self, state: Running, failures: tuple[WorkerFailure, ...]) -> bool:
        """A lost worker explains everything; an exception alone waits out the grace period."""
        if any(f.kind != "exception" for f in failures):
            return True
        started = state.failing_since
        return started is not None and self._clock() - started >= self._failure_grace_s

"""The driver's state machine: schedule a worker group, watch it, restart or stop.

Plain Python with no Ray import: the worker group is passed in, so the
controller is tested with a fake group in milliseconds. Each state is a small
object carrying its payload; :meth:`Controller.step` moves one transition.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from raytf._internal.driver.failure import LOST, NOT_COUNTED, STOPPED, FailureBook, FailureDecision, root_cause
from raytf._internal.protocol import GroupStatus, Report, ResumePoint
from raytf.errors import FailureKind, TrainingFailedError, WorkerFailure, WorkerStartError

logger = logging.getLogger(__name__)


class WorkerGroup(Protocol):
    """What the controller calls on a worker group; every group has all of it."""

    def start(self, attempt: int, resume: ResumePoint) -> None: ...

    def poll(self) -> GroupStatus: ...

    def connect(self) -> None: ...  # release the start barrier

    def shutdown(self, restarting: bool = True) -> None: ...  # this attempt's actors: the attempt ended

    def close(self) -> None: ...  # the run ended: shut down, and end what outlives attempts (standbys)

    def halt(self, uploading: bool = False) -> bool: ...  # the run is stopping; whether an upload is in flight

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None: ...

    def can_replace(self, failure: WorkerFailure) -> bool: ...  # ride the failure out with a new actor

    def replace(self, failure: WorkerFailure) -> None: ...  # in place; WorkerStartError if it does not come up


@dataclass(frozen=True)
class State:
    """A state of the run; each carries the attempt it belongs to, and what it needs."""

    attempt: int


class Scheduling(State):
    """Placing the worker group and starting its actors."""


@dataclass(frozen=True)
class Running(State):
    """Training. A preemption ends the attempt without counting as a failure."""

    failures: tuple[WorkerFailure, ...] = ()  # seen this attempt, held for the grace period
    failing_since: Optional[float] = None  # when the first of them came in
    preempting: Optional[str] = None  # why, once a preemption was requested


@dataclass(frozen=True)
class Restarting(State):
    """The attempt ended with a failure the policy retries, after ``delay_s``."""

    failure: WorkerFailure
    delay_s: float = 0.0


class Finished(State):
    """Every worker's train_fn returned."""


@dataclass(frozen=True)
class Errored(State):
    """The run failed; ``error`` is raised from ``fit()``."""

    error: BaseException


TERMINAL = (Finished, Errored)
UPLOAD_WAIT_S = 60.0  # how long a stopped run waits for the chief's asynchronous checkpoint in flight


def _after(decision: FailureDecision) -> str:
    """How a retry's log line ends: its back-off and the policy's reason, where there are."""
    delay = f" in {decision.delay_s:g} s" if decision.delay_s else ""
    return delay + (f" ({decision.reason})" if decision.reason else "")


def _chief_lost(failures: tuple[WorkerFailure, ...]) -> bool:
    """Whether rank 0, which uploads asynchronous checkpoints, is among the lost."""
    return any(f.rank == 0 and f.kind in LOST for f in failures)


class Controller:
    """Runs one training run to the end: every attempt, every restart.

    ``on_report`` records a report and commits its checkpoint, if any; it
    returns None, or why the checkpoint could not be committed. ``guard`` is
    called before every poll; what it raises ends the run (after shutdown).
    """

    def __init__(
        self,
        group: WorkerGroup,
        policy: FailureBook,
        on_report: Callable[[Report], Optional[str]],
        *,
        resume_point: Callable[[], ResumePoint] = ResumePoint,
        poll_interval_s: float = 0.1,
        failure_grace_s: float = 3.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        guard: Callable[[], None] = lambda: None,
        on_status: Callable[[int, GroupStatus], None] = lambda attempt, status: None,
    ):
        self._group = group
        self._policy = policy
        self._on_report = on_report
        self._resume_point = resume_point  # where each attempt starts (the checkpoint manager knows)
        self._poll_interval_s = poll_interval_s
        self._failure_grace_s = failure_grace_s
        self._sleep = sleep
        self._clock = clock
        self._guard = guard  # raises when the run must stop at once (this driver lost the run's lease)
        self._on_status = on_status  # every poll's answer, for the progress display
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
        except (KeyboardInterrupt, SystemExit):
            self._wait_for_upload("stopping; training stopped", " (Ctrl-C again to stop now)")
            raise
        finally:
            self._group.close()
        if isinstance(self.state, Errored):
            raise self.state.error
        return self.state

    def _wait_for_upload(self, why: str, hint: str = "", timeout_s: float = UPLOAD_WAIT_S) -> None:
        """Stopped (Ctrl-C, SIGTERM), or an attempt that failed with its chief alive: training stops
        at once (:meth:`WorkerGroup.halt`), and before the group goes, the chief's asynchronous
        checkpoint in flight may reach the index, for at most ``timeout_s`` (a second Ctrl-C stops
        the wait). The chief keeps that checkpoint's copy in host memory once it is committed, so a
        restart after a peer's loss restores from memory whenever it was a fresh checkpoint, however
        slow its upload. The workers' ends that the halt causes are the stop, not failures."""
        if not isinstance(self.state, Running):
            return
        status = self._group.poll()
        self._handle_reports(status)
        # First: a group left training would commit its next checkpoints meanwhile. The chief's own
        # answer decides, the relay's last progress being perhaps a poll older than the stop.
        if not self._group.halt(uploading=status.progress is not None and status.progress.uploading):
            return
        logger.warning(
            "raytf: %s, waiting up to %.0f s for the checkpoint being uploaded to be committed%s", why, timeout_s, hint
        )
        deadline = self._clock() + timeout_s
        while True:
            self._sleep(self._poll_interval_s)
            status = self._group.poll()
            self._handle_reports(status)
            if status.progress is None or not status.progress.uploading or _chief_lost(status.failures):
                return  # committed, or never will be: the chief's last progress is all there is of it
            if self._clock() > deadline:
                logger.warning(
                    "raytf: the checkpoint being uploaded was not committed within %.0f s; the "
                    "last committed checkpoint is the one a resume starts from",
                    timeout_s,
                )
                return

    def _handle_reports(self, status: GroupStatus) -> None:
        for report in status.reports:
            # on_report commits a reported checkpoint; the worker's report() (or, for an asynchronous
            # checkpoint, its upload thread) goes on at the ack.
            error = self._on_report(report)
            if report.checkpoint is not None:
                self._group.acknowledge(report.rank, report.seq, error)

    def _next(self, state: State) -> State:
        if isinstance(state, Scheduling):
            try:
                self._group.start(state.attempt, self._resume_point())
            except WorkerStartError as error:  # an actor that never came up: retried like a loss
                return self._end_attempt(
                    state.attempt,
                    WorkerFailure(
                        rank=-1,
                        kind=FailureKind.NOT_STARTED,
                        error_type=type(error).__name__,
                        message=str(error),
                        traceback="",
                        time=time.time(),
                    ),
                )
            except Exception as error:  # the group could not be placed: no retry would help
                return Errored(state.attempt, error)
            return Running(state.attempt)
        if isinstance(state, Running):
            return self._watch(state)
        if isinstance(state, Restarting):
            self._wait(state.delay_s)
            return Scheduling(state.attempt + 1)
        return state

    def _watch(self, state: Running) -> State:
        self._guard()
        status = self._group.poll()
        if status.ready:
            self._group.connect()
        self._handle_reports(status)
        self._on_status(state.attempt, status)  # after its reports: a rank's last reports precede its end
        failures = state.failures + status.failures
        preempting = state.preempting or (
            (status.preempt_reason or "preemption requested") if status.preempting else None
        )
        if failures and not preempting:
            kept = self._replace_in_place(state.attempt, failures)
            if isinstance(kept, State):
                return kept
            failures = kept
        if failures and not preempting and not self._cause_is_clear(state, failures):
            # A worker that raised may have done so because a peer died (its
            # collective failed first); wait briefly for the loss to surface.
            self._sleep(self._poll_interval_s)
            return Running(state.attempt, failures, state.failing_since or self._clock(), preempting)
        if failures or (preempting and status.stopped):
            if preempting:
                # A node drained, a worker got SIGTERM, or the group stops to grow: whatever
                # followed (a clean stop after the checkpoint, or the node going away) is that.
                cause = root_cause(failures) if failures else None
                resized = status.preempt_kind == FailureKind.RESIZED
                failure = WorkerFailure(
                    rank=cause.rank if cause else -1,
                    kind=status.preempt_kind,
                    error_type="Resized" if resized else "Preempted",
                    message=preempting + (f"; then {cause.describe()}" if cause else ""),
                    traceback="",
                    time=time.time(),
                    node_ip=cause.node_ip if cause else "",
                )
            else:
                failure = root_cause(failures)
                if not _chief_lost(failures):
                    # The chief is alive: its checkpoint in flight is committed (and kept in its
                    # node's memory) before the group goes, rather than lost with it.
                    self._wait_for_upload(f"attempt {state.attempt} failed ({failure.describe()})")
            return self._end_attempt(state.attempt, failure)
        if status.finished:
            return Finished(state.attempt)
        self._sleep(self._poll_interval_s)
        return Running(state.attempt, failures, state.failing_since, preempting)

    def _replace_in_place(
        self, attempt: int, failures: tuple[WorkerFailure, ...]
    ) -> "tuple[WorkerFailure, ...] | State":
        """Failures a group can ride out (a parameter-server worker's) are replaced in place, as the
        policy allows; the rest are returned. Errored when the policy allows no more."""
        kept = []
        for failure in failures:
            if not self._group.can_replace(failure):
                kept.append(failure)
                continue
            decision = self._policy.decide(failure)
            if not decision.retry:
                self._group.shutdown(restarting=False)
                return self._failed(attempt, failure, decision)
            logger.warning("attempt %d: %s; replacing it in place%s", attempt, failure.describe(), _after(decision))
            self._wait(decision.delay_s)
            try:
                self._group.replace(failure)
            except WorkerStartError as error:  # its replacement did not come up: the attempt ends
                ended = dataclasses.replace(
                    failure, kind=FailureKind.NOT_STARTED, message=f"{failure.message}; its replacement: {error}"
                )
                self._policy.continues(ended)  # one loss, counted once: the restart is its recovery
                kept.append(ended)
        return tuple(kept)

    def _end_attempt(self, attempt: int, failure: WorkerFailure) -> State:
        """Shut the group down and restart it, or stop, as the policy decides (decided first: a
        group that will not restart keeps nothing of the attempt for the next one)."""
        decision = self._policy.decide(failure)
        self._group.shutdown(restarting=decision.retry)
        if decision.retry:
            logger.warning(
                "attempt %d ended (%s); restarting the worker group%s", attempt, failure.describe(), _after(decision)
            )
            return Restarting(attempt, failure, decision.delay_s)
        return self._failed(attempt, failure, decision)

    def _failed(self, attempt: int, failure: WorkerFailure, decision: FailureDecision) -> State:
        return Errored(attempt, TrainingFailedError(failure, tuple(self._policy.failures), decision.reason))

    def _wait(self, seconds: float) -> None:
        """A policy's back-off before a restart: the driver still stops on a signal or a lost lease."""
        deadline = self._clock() + seconds
        while self._clock() < deadline:
            self._guard()
            self._sleep(min(self._poll_interval_s, deadline - self._clock()))

    def _cause_is_clear(self, state: Running, failures: tuple[WorkerFailure, ...]) -> bool:
        """A lost worker, or one that stopped taking part, explains everything; an exception
        alone waits out the grace period."""
        if any(f.kind in LOST + STOPPED + NOT_COUNTED for f in failures):
            return True
        started = state.failing_since
        return started is not None and self._clock() - started >= self._failure_grace_s

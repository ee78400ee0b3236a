"""What the driver makes of its workers' answers to one poll. Pure: no Ray.

The worker group sends the polls and hands each answer (or its absence) to a
:class:`GroupWatch`, which keeps what it heard across polls (phases, the
activity of each training thread, rank 0's progress) and turns one round into
a :class:`~raytf._internal.protocol.GroupStatus`: the reports, the failures
(a lost worker, one that never joined, a hang, and who a collective error
really points at), and whether the group is ready, finished or stopped.
"""

from __future__ import annotations

import enum
import time
from typing import Callable, Collection, Mapping, Optional

from raytf._internal.driver.hang import blame_collective, find_hangs
from raytf._internal.protocol import (
    STARTING_PHASES,
    Activity,
    ActivityKind,
    CoordinatorHeld,
    GroupStatus,
    Phase,
    Progress,
    Report,
    WorkerStatus,
)
from raytf.errors import FailureKind, WorkerFailure

_BEHIND = {
    Phase.CREATED: "(its actor was not started)",
    Phase.STARTING: "(loading train_fn and its modules, importing TensorFlow)",
    Phase.READY: "(waiting for the others)",
    Phase.CONNECTING: "(connecting to its peers)",
}


class Milestone(str, enum.Enum):
    """How far an attempt's start has got (``GroupWatch.reached``: when each was reached)."""

    LOADED = "loaded"  # every worker loaded train_fn and imported TensorFlow
    CONNECTED = "connected"  # every worker's strategy is connected
    FIRST_STEP = "first_step"  # rank 0 trained a step, as its progress shows
    FIRST_REPORT = "first_report"  # rank 0's first report, where its loop tells raytf of no step


class GroupWatch:
    """One attempt's view of its workers, fed one poll at a time."""

    def __init__(
        self,
        node_ips: Mapping[int, str],
        *,
        start_timeout_s: float,
        worker_timeout_s: float,
        hang_timeout_s: Optional[float],
        coordinator_timeout_s: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
        finishers: Optional[Collection[int]] = None,
        labels: Optional[Mapping[int, str]] = None,
    ):
        self._node_ips = dict(node_ips)  # world rank -> node address
        # The ranks whose train_fn ending ends the group: all of them, or (parameter-server
        # training) the chief and the evaluator, while workers and ps serve until shut down.
        self._finishers = set(node_ips) if finishers is None else set(finishers)
        self._labels = dict(labels or {})  # rank -> "ps 0", ... where ranks are not the roles
        self._start_timeout_s = start_timeout_s
        self._worker_timeout_s = worker_timeout_s
        self._hang_timeout_s = hang_timeout_s
        self._coordinator_timeout_s = coordinator_timeout_s
        self._clock = clock
        self._started_at: Optional[float] = clock()
        self.phases: dict[int, Phase] = {}
        self._activities: dict[int, tuple[Activity, float]] = {}  # rank -> (last activity, heard at)
        self._held: dict[int, tuple[CoordinatorHeld, float]] = {}  # rank -> (its coordinator's hold, heard at)
        self.progress: Optional[Progress] = None  # rank 0's, as last heard
        self.released = False  # the start barrier: every worker told to build the strategy
        self._reports: list[Report] = []
        self._failures: list[WorkerFailure] = []
        self.silent_ranks: set[int] = set()  # found unresponsive: their processes may outlive a kill (group.shutdown)
        self._quiet_since: dict[int, float] = {}  # rank -> since when a rank still joining has not answered
        self.preempt_reasons: list[str] = []  # workers that asked for a preemption (SIGTERM), this round
        # When the whole group first got past each start-up phase (the clock's time), for the breakdown.
        self.reached: dict[Milestone, float] = {}

    def _failure(
        self, rank: int, kind: FailureKind, error_type: str, message: str, at: Optional[float] = None
    ) -> WorkerFailure:
        return WorkerFailure(
            rank=rank,
            kind=kind,
            error_type=error_type,
            message=message,
            traceback="",
            time=time.time() if at is None else at,
            node_ip=self._node_ips.get(rank, ""),
            task=self._labels.get(rank, ""),
        )

    def replaced(self, rank: int, node_ip: str) -> None:
        """``rank``'s actor was replaced by a new one on ``node_ip``: forget the old one, and give the
        new one ``start_timeout_s`` to join."""
        self.phases.pop(rank, None)
        self._activities.pop(rank, None)
        self._held.pop(rank, None)
        self.silent_ranks.discard(rank)
        self._quiet_since.pop(rank, None)
        self._node_ips[rank] = node_ip
        self._started_at = self._clock()

    def heard(self, rank: int, status: WorkerStatus) -> None:
        now = self._clock()
        self._quiet_since.pop(rank, None)
        self._reports.extend(status.reports)
        self.phases[rank] = status.phase
        if rank == 0 and status.progress is not None:
            self.progress = status.progress
        if status.activity is not None:
            self._activities[rank] = (status.activity, now)
        if status.coordinator_held is None:
            self._held.pop(rank, None)
        else:
            self._held[rank] = (status.coordinator_held, now)
        if status.failure is not None:
            self._failures.append(status.failure)
            if status.failure.kind == FailureKind.COLLECTIVE:  # a peer that stopped taking part is the cause
                self._failures.extend(blame_collective(status.failure, self.activities(), self._node_ips))
        if status.preempt_reason:
            self.preempt_reasons.append(f"rank {rank}: {status.preempt_reason}")

    def silent(self, rank: int, since: float) -> None:
        """A poll sent to ``rank`` at ``since`` has not come back.

        The failure is dated when the rank went silent, not when the driver gave up on it: of two
        members found silent in one round (a stopped worker, and the chief that then blocks in
        TensorFlow waiting for it), the root cause is the one that stopped answering first.

        A rank that has not joined the group yet is judged by ``start_timeout_s`` instead
        (:meth:`_not_joined`): its start holds the interpreter in native code for long stretches
        (the dynamic loading and static initialisers of TensorFlow's import), which on a node
        whose cores many starting workers share lasts seconds, and a peer waiting for it
        is not lost."""
        now = self._clock()
        if now - since <= self._worker_timeout_s:
            return
        if self._started_at is not None and self.phases.get(rank, Phase.CREATED) in STARTING_PHASES:
            self._quiet_since[rank] = since
            return
        self._failures.append(
            self._failure(
                rank,
                FailureKind.UNRESPONSIVE,
                "WorkerTimeout",
                f"no answer to the driver for {self._worker_timeout_s:g} s (FailureConfig.worker_timeout_s)",
                at=time.time() - (now - since),
            )
        )
        self.phases[rank] = Phase.LOST
        self.silent_ranks.add(rank)

    def died(self, rank: int, error_type: str, message: str) -> None:
        self._failures.append(self._failure(rank, FailureKind.DIED, error_type, message))
        self.phases[rank] = Phase.LOST

    def activities(self) -> dict[int, Activity]:
        """Each rank's last activity, aged by the time since it was heard."""
        now = self._clock()
        return {
            rank: Activity(a.kind, a.seconds + (now - heard), a.where) for rank, (a, heard) in self._activities.items()
        }

    def _someone_waited(self, timeout_s: Optional[float]) -> bool:
        """Whether a rank has waited inside TensorFlow ``timeout_s``: only then can there be a hang
        (hang.find_hangs), and only then are every rank's activities aged for it, which at a
        thousand workers is most of a round's work."""
        if timeout_s is None:
            return False
        now = self._clock()
        return any(
            a.kind == ActivityKind.TENSORFLOW and a.seconds + (now - heard) >= timeout_s
            for a, heard in self._activities.values()
        )

    def _coordinator_held(self) -> list[WorkerFailure]:
        """After coordinator_timeout_s, a coordinator still held: reconnecting to its cluster, or
        holding scheduled functions of which none ends. TensorFlow's failure handling redials a lost
        task's address with no timeout and holds every step while it does, and a step waiting on a
        peer that will never answer waits as long: where that address never answers (the task came
        back elsewhere too late for raytf to point the coordinator there, or TensorFlow's reconnect
        itself wedged), only a restart from the last checkpoint ends it."""
        timeout_s = self._coordinator_timeout_s
        if timeout_s is None:
            return []
        now = self._clock()
        return [
            self._failure(
                rank,
                FailureKind.STALLED,
                "Stalled",
                f"its ClusterCoordinator has been {held.why} for {held.seconds + now - heard:.0f} s "
                f"(FailureConfig.hang_timeout_s={timeout_s:g}), holding every step: TensorFlow waits on a lost "
                "task with no timeout; the group restarts from the last checkpoint",
            )
            for rank, (held, heard) in sorted(self._held.items())
            if held.seconds + now - heard >= timeout_s
        ]

    def _not_joined(self) -> list[WorkerFailure]:
        """After start_timeout_s, the workers furthest from joining the group (a peer that never arrives)."""
        now = self._clock()
        if self._started_at is None or now - self._started_at <= self._start_timeout_s:
            return []
        behind = {r: p for r, p in self.phases.items() if p in STARTING_PHASES}
        behind.update({r: Phase.CREATED for r in self._node_ips if r not in self.phases})
        if not behind:
            self._started_at = None  # everyone joined: stop checking
            return []
        slowest = min(STARTING_PHASES.index(p) for p in behind.values())
        late = [rank for rank, phase in sorted(behind.items()) if STARTING_PHASES.index(phase) == slowest]
        quiet = {rank: now - self._quiet_since[rank] for rank in late if rank in self._quiet_since}
        self.silent_ranks.update(quiet)  # a process that answers nothing may outlive Ray's kill
        return [
            self._failure(
                rank,
                FailureKind.NOT_STARTED,
                "StartTimeout",
                f"did not join the worker group within {self._start_timeout_s:g} s "
                f"(FailureConfig.start_timeout_s); it was still {behind[rank].value} {_BEHIND[behind[rank]]}"
                + (f", and had not answered the driver for {quiet[rank]:.0f} s" if rank in quiet else ""),
            )
            for rank in late
        ]

    def _note_reached(self, done: bool) -> None:
        """When the attempt reached each :class:`Milestone`."""
        now, phases = self._clock(), self.phases.values()
        if (
            done
            and Milestone.LOADED not in self.reached
            and all(p not in (Phase.CREATED, Phase.STARTING) for p in phases)
        ):
            self.reached[Milestone.LOADED] = now
        if done and Milestone.CONNECTED not in self.reached and all(p not in STARTING_PHASES for p in phases):
            self.reached[Milestone.CONNECTED] = now
        if self.trained_since() is not None or Milestone.CONNECTED not in self.reached:
            return
        progress = self.progress
        if progress is not None and ((progress.global_step or 0) >= 1 or (progress.step or 0) >= 1):
            self.reached[Milestone.FIRST_STEP] = now
        elif any(r.rank == 0 for r in self._reports):  # a loop that tells raytf of no step: its first report
            self.reached[Milestone.FIRST_REPORT] = now

    def now(self) -> float:
        """The watch's clock (time.monotonic, or a test's)."""
        return self._clock()

    def trained_since(self) -> Optional[float]:
        """When the attempt trained its first step (or made its first report), or None."""
        return self.reached.get(Milestone.FIRST_STEP, self.reached.get(Milestone.FIRST_REPORT))

    def startup(self, began: float, placed: float, actors_up: float) -> dict[str, float]:
        """Seconds per start-up phase, from the attempt's start, as far as the group has got."""
        marks = [
            ("placement", placed),
            ("actors", actors_up),
            ("loading", self.reached.get(Milestone.LOADED)),
            ("connect", self.reached.get(Milestone.CONNECTED)),
        ]
        first = Milestone.FIRST_STEP if Milestone.FIRST_STEP in self.reached else Milestone.FIRST_REPORT
        marks.append((first.value, self.reached.get(first)))
        phases, last = {}, began
        for name, at in marks:
            if at is None:
                break
            phases[name] = round(max(0.0, at - last), 2)
            last = at
        phases["total"] = round(last - began, 2)
        return phases

    def round(self, preempting: Optional[str]) -> GroupStatus:
        """What this round of polls amounts to; starts the next round."""
        failures = self._failures + self._not_joined()
        if not failures and self._someone_waited(self._hang_timeout_s):
            failures += find_hangs(self.activities(), self._hang_timeout_s, self._node_ips)
        if not failures:
            failures += self._coordinator_held()
        done = len(self.phases) == len(self._node_ips)
        ready = (
            not self.released and done and all(p not in (Phase.CREATED, Phase.STARTING) for p in self.phases.values())
        )
        self._note_reached(done)
        ends = [self.phases.get(rank) for rank in self._finishers]
        finished = done and all(p == Phase.FINISHED for p in ends)
        stopped = done and not finished and all(p in (Phase.FINISHED, Phase.PREEMPTED) for p in ends)
        reports = sorted(self._reports, key=lambda r: (r.time, r.rank, r.seq))
        self._reports, self._failures, self.preempt_reasons = [], [], []
        return GroupStatus(
            tuple(reports),
            tuple(failures),
            finished,
            dict(self.phases),
            preempting=preempting is not None,
            preempt_reason=preempting,
            stopped=stopped,
            progress=self.progress,
            ready=ready,
        )

"""The Ray side of a parameter-server group: a chief, workers, parameter servers, an evaluator.

One placement group holds a bundle per task, in TF_CONFIG's role order. Every
actor gets a TF_CONFIG naming every task (the evaluator outside the training
cluster, as TensorFlow expects). Workers and ps run TensorFlow's server; the
chief runs ``train_fn`` with ParameterServerStrategy once every server is up
(the group's ``ready``), and the evaluator evaluates each committed checkpoint.

Failures go the way TensorFlow intends. The coordinator survives a lost
worker: it reschedules the worker's in-flight steps on the others. So the
group replaces a lost worker (or evaluator) in place: a new actor in the same
bundle, at the same task index, on the old port when it is free (else the
chief is pointed at the new one first), reading the same piece of each
dataset. Losing the chief or a ps ends the attempt, and the controller
restarts the group from the last committed checkpoint. A worker that gets
SIGTERM or whose node drains is a preemption: replaced, never counted against
``FailureConfig.max_failures``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytf._internal.driver import cluster, placement
from raytf._internal.driver.topology import build_tf_config
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.driver.actors import kill_and_wait, new_worker, poll_round
from raytf._internal.protocol import (
    GroupStatus, PayloadKind, Phase, RankInfo, ResumePoint, RoleSpec, RunSpec, TaskId, WorkerAddress, WorkerSpec,
    WorkerStatus,
)
from raytf.errors import FailureKind, PlacementTimeoutError, WorkerFailure, WorkerStartError

logger = logging.getLogger(__name__)

_DRAIN_CHECK_INTERVAL_S = 1.0
_CLOSE_TIMEOUT_S = 5.0
REPLACEABLE = ("worker", "evaluator")  # roles whose loss the chief's coordinator rides out
FINISHERS = ("chief", "evaluator")  # roles whose end is the group's end


@dataclass
class Member:
    """One task of the group: its role, task index, bundle, actor and address."""

    role: RoleSpec
    task: int
    bundle: int  # its placement-group bundle, kept by every replacement
    actor: Any = None
    address: Optional[WorkerAddress] = None
    generation: int = 0  # replacements so far

    @property
    def label(self) -> str:
        return f"{self.role.name} {self.task}"


class ParameterServerGroup:
    """The tasks of one parameter-server attempt; workers replaced in place when lost."""

    def __init__(
        self,
        run: RunSpec,
        roles: Sequence[RoleSpec],
        *,
        placement_strategy: str,
        placement_timeout_s: Optional[float],
        datasets: Optional[Mapping[str, Any]] = None,
        split: Sequence[str] = (),
        worker_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        notify: Callable[[str], None] = lambda message: None,
        finishers: Sequence[str] = FINISHERS,
    ):
        self._run = run
        self._finishers = tuple(finishers)
        self._run_ref: Any = None
        self._roles = list(roles)
        self._strategy = placement_strategy
        self._placement_timeout_s = placement_timeout_s
        self._datasets = dict(datasets or {})
        self._split = frozenset(split)
        self._worker_timeout_s = worker_timeout_s
        self._start_timeout_s = start_timeout_s
        self._notify = notify
        self.num_workers = sum(r.max_count for r in roles if r.name == "worker")
        self._pieces: Optional[list[dict[str, Any]]] = None  # by worker task: dataset -> its piece
        self._pg: Any = None
        self._members: list[Member] = []
        self._cluster: dict[str, list[str]] = {}
        self._in_flight: dict[int, tuple[Any, float]] = {}
        self._watch: Optional[GroupWatch] = None
        self._attempt = 0
        self._resume = ResumePoint()
        self._preempt_reason: Optional[str] = None
        self._preempted: dict[int, str] = {}  # member -> why, for workers on their way out
        self._evaluator_told = False
        self._drain_checked_at = 0.0

    # Starting an attempt.

    def start(self, attempt: int, resume: ResumePoint) -> None:
        self._attempt, self._resume = attempt, resume
        self._preempt_reason, self._preempted, self._evaluator_told = None, {}, False
        try:
            self._split_datasets()  # before the group holds the CPUs that Ray Data's tasks need
            self._place()
            self._start_members()
        except BaseException:
            self.shutdown()
            raise

    def _place(self) -> None:
        bundles = [dict(role.bundle) for role in self._roles for _ in range(role.max_count)]
        self._pg = placement.place(bundles, self._strategy, self._placement_timeout_s, self._notify)
        if self._pg is None:
            raise PlacementTimeoutError(
                f"the parameter-server group ({', '.join(f'{r.max_count} {r.name} x {r.bundle}' for r in self._roles)}"
                f", {self._strategy}) could not be placed within {self._placement_timeout_s:g} s "
                f"(ParameterServerScaling.placement_timeout_s); the cluster has {ray.cluster_resources()}, "
                f"of which {ray.available_resources()} is free"
            )

    def _split_datasets(self) -> list[dict[str, Any]]:
        """Each worker's piece of every dataset, made once for the run: a replaced worker, and every
        attempt, reads the same rows. Datasets not split are given whole to every worker."""
        if self._pieces is None:
            pieces: list[dict[str, Any]] = [{} for _ in range(self.num_workers)]
            for name, dataset in self._datasets.items():
                parts = dataset.split(self.num_workers, equal=True) if name in self._split else (
                    [dataset] * self.num_workers)
                for task, part in enumerate(parts):
                    pieces[task][name] = part
            self._pieces = pieces
        return self._pieces

    def _new_actor(self, member: Member) -> Any:
        role = member.role
        resources = {k: v for k, v in role.bundle.items() if k not in ("CPU", "GPU")}
        suffix = f":{member.generation}" if member.generation else ""
        return new_worker(
            self._run.run_name, f"raytf:{self._run.run_name}:{self._attempt}:{member.label.replace(' ', '-')}{suffix}",
            num_cpus=role.bundle.get("CPU", 0), num_gpus=role.bundle.get("GPU", 0), resources=resources,
            max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self._pg, placement_group_bundle_index=member.bundle),
        )

    def _start_members(self) -> None:
        members, bundle = [], 0
        for role in self._roles:
            for task in range(role.max_count):
                members.append(Member(role, task, bundle))
                bundle += 1
        self._members = members
        for member in members:
            member.actor = self._new_actor(member)
        addresses = self._call([m.actor for m in members], "reserve", lambda i: (), "start")
        self._cluster = {}
        for member, address in zip(members, addresses):
            member.address = address
            self._cluster.setdefault(member.role.name, []).append(address.host_port)
        if self._run_ref is None:
            self._run_ref = ray.put(self._run)
        self._call([m.actor for m in members], "start",
                   lambda i: (self._run_ref, self._spec(members[i]), members[i].role.payload), "start")
        logger.info("attempt %d: %s", self._attempt, ", ".join(f"{m.label} {m.address.host_port}" for m in members))
        self._in_flight = {}
        self._watch = GroupWatch(
            {i: m.address.node_ip for i, m in enumerate(members)}, start_timeout_s=self._start_timeout_s,
            worker_timeout_s=self._worker_timeout_s, hang_timeout_s=None,  # no collectives to hang in
            finishers=[i for i, m in enumerate(members) if m.role.name in self._finishers],
            labels={i: m.label for i, m in enumerate(members)},
        )

    def _spec(self, member: Member) -> WorkerSpec:
        index = self._members.index(member)
        chief = member.role.name == "chief"  # the one train_fn, so a group of one in its context
        rank = RankInfo(world_rank=0 if chief else index, world_size=1 if chief else len(self._members),
                        local_rank=0, local_world_size=1, node_rank=0, num_nodes=1)
        datasets = self._split_datasets()[member.task] if member.role.name == "worker" else {}
        return WorkerSpec(role=member.role.name, rank=rank,
                          tf_config=build_tf_config(self._cluster, member.task, member.role.name),
                          attempt=self._attempt, resume=self._resume, datasets=datasets,
                          task=TaskId(member.role.name, member.task))

    def _call(self, actors: list, method: str, args_of: Callable[[int], tuple], what: str) -> list:
        """``actor.method(*args_of(i))`` on every actor, retried where Ray says an actor is only
        temporarily unavailable (a fresh worker process whose RPC server is not up yet): the
        methods called this way (reserve, start, retarget) may safely run twice."""
        deadline = time.monotonic() + self._start_timeout_s
        results: list = [None] * len(actors)
        pending = list(range(len(actors)))
        while pending:
            refs = {i: getattr(actors[i], method).remote(*args_of(i)) for i in pending}
            pending = []
            for i, ref in refs.items():
                try:
                    results[i] = self._get([ref], what, deadline)[0]
                except ActorUnavailableError:
                    if time.monotonic() > deadline:
                        raise WorkerStartError(f"a parameter-server actor stayed unavailable: cannot {what}") from None
                    pending.append(i)
            if pending:
                time.sleep(0.5)
        return results

    def _get(self, refs: list, what: str, deadline: Optional[float] = None) -> list:
        timeout = self._start_timeout_s if deadline is None else max(0.1, deadline - time.monotonic())
        try:
            return ray.get(refs, timeout=timeout)
        except ActorUnavailableError:
            if deadline is not None:
                raise  # _call retries it
            raise WorkerStartError(f"a parameter-server actor was unavailable: cannot {what}") from None
        except GetTimeoutError:
            raise WorkerStartError(
                f"parameter-server actors did not {what} within {self._start_timeout_s:g} s "
                "(FailureConfig.start_timeout_s); check the actors' logs"
            ) from None
        except RayActorError as error:
            raise WorkerStartError(f"a parameter-server actor died while starting: {error}") from None

    # Watching it.

    def poll(self) -> GroupStatus:
        watch = self._watch

        def answer(index: int, status: WorkerStatus) -> WorkerStatus:
            if status.preempt_reason and self._members[index].role.name in REPLACEABLE:
                self._preempt_member(index, status.preempt_reason)
                return dataclasses.replace(status, preempt_reason=None)
            return status

        now = poll_round([m.actor for m in self._members], self._in_flight, watch, answer)
        for reason in watch.preempt_reasons:
            if self._preempt_reason is None:
                self._request_preemption(reason)
        self._watch_drains(now)
        self._tell_evaluator()
        status = watch.round(self._preempt_reason)
        if self._preempted and status.failures:
            # A preempted worker's end is the preemption, whatever it looked like from here.
            status = dataclasses.replace(status, failures=tuple(
                dataclasses.replace(f, kind=FailureKind.PREEMPTED, message=f"{self._preempted[f.rank]}; then {f.message}")
                if f.rank in self._preempted else f for f in status.failures))
        return status

    def _tell_evaluator(self) -> None:
        """Once the chief's train_fn returned, the evaluator evaluates the last checkpoint and ends."""
        if self._evaluator_told or self._watch.phases.get(0) != Phase.FINISHED:
            return
        for member in self._members:
            if member.role.name == "evaluator" and member.role.payload == PayloadKind.EVALUATOR:
                member.actor.finish.remote()
        self._evaluator_told = True

    def _preempt_member(self, index: int, reason: str) -> None:
        """A worker (or the evaluator) is going away: end it now, so it is replaced as a preemption."""
        if index in self._preempted:
            return
        member = self._members[index]
        self._preempted[index] = reason
        logger.warning("%s is being preempted (%s); replacing it", member.label, reason)
        ray.kill(member.actor, no_restart=True)

    def connect(self) -> None:
        """Every server is up: hand the chief every worker's shard manifest and let it connect."""
        workers = [m for m in self._members if m.role.name == "worker"]
        try:
            manifests = ray.get([m.actor.shard_files.remote() for m in workers], timeout=self._start_timeout_s)
        except (RayActorError, GetTimeoutError):
            return  # a worker was lost just now: the next polls name it, and the group is ready again once replaced
        self._watch.released = True
        for member in self._members:
            member.actor.connect.remote(manifests if member.role.name == "chief" else None)

    def _watch_drains(self, now: float) -> None:
        if now - self._drain_checked_at < _DRAIN_CHECK_INTERVAL_S:
            return
        self._drain_checked_at = now
        draining = cluster.draining_nodes()
        for index, member in enumerate(self._members):
            if member.address is None or member.address.node_id not in draining:
                continue
            why = f"node {member.address.node_ip} of {member.label} is draining"
            if member.role.name in REPLACEABLE:
                self._preempt_member(index, why)
            elif self._preempt_reason is None:
                self._request_preemption(why)

    def _request_preemption(self, reason: str) -> None:
        """The chief or a ps is going away: ask the chief to checkpoint and stop."""
        logger.warning("preemption: %s; asking the chief to checkpoint and stop", reason)
        self._preempt_reason = reason
        self._members[0].actor.preempt.remote(reason)

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None:
        if rank == 0:
            self._members[0].actor.acknowledge.remote(seq, error)

    # Replacing a lost worker.

    def can_replace(self, failure: WorkerFailure) -> bool:
        """Whether ``failure`` is a worker's (or the evaluator's) the chief rides out."""
        if not 0 < failure.rank < len(self._members) or self._watch is None:
            return False
        return (self._members[failure.rank].role.name in REPLACEABLE
                and self._watch.phases.get(0) not in (Phase.FAILED, Phase.LOST))

    def replace(self, failure: WorkerFailure) -> None:
        """A new actor for the lost task: same bundle, same task index, its old port if free."""
        index = failure.rank
        member = self._members[index]
        ray.kill(member.actor, no_restart=True)
        self._in_flight.pop(index, None)
        self._preempted.pop(index, None)
        old = member.address
        member.generation += 1
        member.actor = self._new_actor(member)
        address = self._call([member.actor], "reserve", lambda i: (old.port if old else 0,), "replace a lost task")[0]
        member.address = address
        if old is None or address.host_port != old.host_port:
            # The coordinator must dial the new address before the new server answers there.
            self._call([self._members[0].actor], "retarget",
                       lambda i: (member.role.name, member.task, address.host_port), "retarget the chief")
        self._cluster[member.role.name][member.task] = address.host_port
        self._call([member.actor], "start", lambda i: (self._run_ref, self._spec(member), member.role.payload),
                   "start a replacement")
        self._watch.replaced(index, address.node_ip)
        member.actor.connect.remote(None)  # a launched script waits for this go; a server does not
        if member.role.name == "evaluator" and self._evaluator_told:
            member.actor.finish.remote()
        self._notify(f"{member.label} lost ({failure.kind.value}); replaced at {address.host_port}, "
                     "training goes on")

    # Ending it.

    def close(self) -> None:
        """The run is over: nothing of a parameter-server group outlives an attempt."""
        self.shutdown()

    def shutdown(self) -> None:
        """Let the workers remove their shard files, kill every actor, remove the placement group."""
        members, self._members = self._members, []
        self._in_flight, self._watch = {}, None
        closing = [m.actor.close.remote() for m in members if m.role.name == "worker" and m.actor is not None]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=_CLOSE_TIMEOUT_S)
        kill_and_wait([m.actor for m in members if m.actor is not None], "parameter-server")
        placement.remove(self._pg)
        self._pg = None

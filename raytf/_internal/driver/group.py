"""The Ray side of a worker group, for every TensorFlow cluster shape: one placement group, one
actor per bundle, polls, preemption, replacement in place, teardown.

A group is made of roles (:class:`~raytf._internal.protocol.RoleSpec`: a name
in TF_CONFIG, a count, a bundle, a payload) and a shape (shapes.py: what
differs between MultiWorkerMirroredStrategy and ParameterServerStrategy, as
data and a few rules). Its lifecycle is written once, here: place, start,
poll, connect, preempt, replace a member in place, shut down, close. The
features that act at points of that lifecycle (start-up timing, drains,
warm standbys and kept shards, the evaluator's last evaluation) are
callbacks (callbacks.py, warm.py). What the answers to a poll mean is decided
in watch.py, how many workers an elastic group asks for in scaling.py, and
how a dataset is cut per rank in data/split.py; this module does what needs Ray.
The controller (controller.py) sees a group through its ``WorkerGroup`` protocol.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from raytf._internal import env as _env
from raytf._internal.driver import cluster, placement
from raytf._internal.driver.actors import (
    CLOSE_TIMEOUT_S,
    ask_each,
    call_each,
    floats,
    kill_and_wait,
    new_worker,
    relay_for,
    reserve,
    scheduling,
)
from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.members import Member, watch_of
from raytf._internal.driver.relay import feed
from raytf._internal.driver.scaling import ElasticPolicy
from raytf._internal.driver.shapes import GroupShape, addresses_by_role, task_id
from raytf._internal.driver.topology import build_tf_config
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import GroupStatus, Phase, ResumePoint, RoleSpec, RunSpec, WorkerSpec, WorkerStatus
from raytf.errors import FailureKind, WorkerFailure, WorkerStartError

logger = logging.getLogger(__name__)

HALT_ANSWER_S = 10.0  # how long a stopping run waits for its chief to say whether a checkpoint is on its way
_PLACEMENTS_AFTER_DEAD_NODES = 3  # new placements within one start after nodes died under the last one


class WorkerGroup:
    """The actors of one attempt of a run, in one placement group (kept across attempts where a
    callback asks and its nodes stay)."""

    def __init__(
        self,
        run: RunSpec,
        roles: Sequence[RoleSpec],
        shape: GroupShape,
        *,
        placement_strategy: str,
        elastic: ElasticPolicy,
        datasets: Optional[Mapping[str, Any]] = None,
        worker_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        notify: Callable[[str], None] = lambda message: None,
        callbacks: Sequence[GroupCallback] = (),
    ):
        if [r.name for r in roles].count(shape.train_role) != 1:
            raise ValueError(
                f"a worker group needs exactly one {shape.train_role!r} role, got {[r.name for r in roles]}"
            )
        self.run = run
        self.roles = list(roles)
        self.shape = shape
        self.placement_strategy = placement_strategy
        self.elastic = elastic
        self.datasets = dict(datasets or {})
        self.notify = notify  # the driver's progress display
        self.num_workers = elastic.max_workers  # this attempt's elastic size, once placed
        self.members: list[Member] = []  # by index: the watch's, the acks', the training ranks'
        self.watch: Optional[GroupWatch] = None
        self.times: dict[str, float] = {}  # this attempt's start-up: began, placed, actors_up
        self.run_shards: Optional[list[dict[str, Any]]] = None  # split once per run (shapes.py)
        self.attempt_shards: Optional[list[dict[str, Any]]] = None  # split for this attempt, by world rank
        self.shard_manifests: Any = None  # parameter-server workers' shard files, for the chief
        self.preempt_reason: Optional[str] = None  # the group's preemption, once requested
        self.restarting = True  # during shutdown: whether another attempt follows (Survivors)
        self.preempt_kind = FailureKind.PREEMPTED  # what the preemption is: RESIZED to grow
        self.run_ref: Optional[ray.ObjectRef] = None  # the RunSpec, put once: train_fn travels once
        self._callbacks = list(callbacks)
        self._worker_timeout_s = worker_timeout_s
        self._start_timeout_s = start_timeout_s
        self._attempt = 0
        self._resume = ResumePoint()
        self._pg: Any = None
        self._cluster: dict[str, list[str]] = {}
        self._relay: Any = None  # polls the members for the driver (relay.py: ThreadRelay or ActorRelay)
        self._preempted: dict[int, str] = {}  # member index -> why, for replaceable members on their way out

    @property
    def trainer_index(self) -> int:
        """The index of the first member that runs train_fn (the chief, or rank 0)."""
        return next(i for i, m in enumerate(self.members) if m.role.name == self.shape.train_role)

    # Starting an attempt.

    def start(self, attempt: int, resume: ResumePoint) -> None:
        """Place the group and start its actors. A node that dies under a bundle before its worker
        started (lost with the attempt that just ended, but not yet declared dead by Ray when the
        placement was reused or made) is not a new failure: the group is placed again on live nodes."""
        self._attempt, self._resume = attempt, resume
        self.times = {"began": time.monotonic()}
        for again in range(_PLACEMENTS_AFTER_DEAD_NODES, -1, -1):
            self.preempt_reason, self.preempt_kind, self._preempted = None, FailureKind.PREEMPTED, {}
            for callback in self._callbacks:
                callback.before_start(self, attempt)
            placed: set[str] = set()
            try:
                self.shape.prepare(self)
                self._place()
                placed = set(self.bundle_nodes().values())  # as placed: Ray moves a dead node's bundles
                self.times["placed"] = time.monotonic()
                self._start_members()
                return
            except BaseException as error:
                dead = placed - cluster.live_node_ids() if again and isinstance(error, WorkerStartError) else set()
                self.shutdown()
                if not dead:
                    raise
                placement.remove(self._pg)
                self._pg = None
                logger.warning(
                    "attempt %d: node(s) %s died under the placement before its workers started (%s); "
                    "placing the group again on live nodes",
                    attempt,
                    ", ".join(sorted(dead)),
                    error,
                )

    def _bundles(self, workers: int) -> list[dict[str, float]]:
        return [dict(role.bundle) for role in self.roles for _ in range(self.shape.count(role, workers))]

    def _place(self) -> None:
        """Place the group; an elastic one takes the largest size the cluster fits, down to its minimum."""
        if self._pg is not None:
            if self._keeps_placement() and self._reusable():
                return
            placement.remove(self._pg)
            self._pg = None
        tries = self.elastic.tries()
        for workers, timeout, set_by in tries:
            self._pg = placement.place(self._bundles(workers), self.placement_strategy, timeout, self.notify, set_by)
            if self._pg is not None:
                self.num_workers = workers
                shrunk = self.elastic.shrunk(workers, tries[0])
                if shrunk:
                    logger.warning("%s", shrunk)
                for callback in self._callbacks:
                    callback.after_placement(self)
                return
        raise self.shape.placement_error(self)

    def _keeps_placement(self) -> bool:
        return any(callback.keeps_placement for callback in self._callbacks)

    def _reusable(self) -> bool:
        """The last attempt's placement group can hold this one: it is placed, on live nodes none of
        which is draining, and it is as large as the group may be (an elastic group that shrank
        tries to grow back with a new one)."""
        return self.num_workers == self.elastic.max_workers and placement.on_live_nodes(self._pg)

    def bundle_nodes(self) -> dict[int, str]:
        """Bundle index -> the id of the node it was placed on."""
        return placement.bundle_nodes(self._pg)

    def _new_actor(self, member: Member) -> Any:
        """A new actor for ``member``'s bundle, which loads TensorFlow and train_fn when it starts."""
        if self.shape.named_tasks:  # "worker-1", then "worker-1:1" for its first replacement
            name = member.label.replace(" ", "-") + (f":{member.generation}" if member.generation else "")
        else:
            name = str(member.bundle)
        # Survivors hands a floating worker a bundle of the next placement group on its node.
        floating_on = self.bundle_nodes()[member.bundle] if self._floats(member) else None
        options = scheduling(member.role.bundle, self._pg, member.bundle, floating_on)
        return new_worker(self.run, f"raytf:{self.run.run_name}:{self._attempt}:{name}", max_restarts=0, **options)

    def _floats(self, member: Member) -> bool:
        """A member of the role a restart may keep (``shape.kept_role``) whose worker runs outside the
        placement group: a callback asks for it (``floats_workers``) and its bundle holds no GPU or
        other device Ray assigns by id (actors.floats). Not a replacement made while the attempt
        trains (a parameter-server worker's): its bundle's node may be the one just lost, and the
        bundle takes it wherever Ray places the bundle anew."""
        return (
            member.generation == 0
            and member.role.name == self.shape.kept_role
            and floats(member.role.bundle)
            and any(callback.floats_workers for callback in self._callbacks)
        )

    def _start_members(self) -> None:
        members, bundle = [], 0
        for role in self.roles:
            for task in range(self.shape.count(role, self.num_workers)):
                members.append(Member(role, task, bundle))
                bundle += 1
        for callback in self._callbacks:
            callback.arrange(self, members)
        for member in members:
            taken = next((t for t in (c.actor_for(self, member) for c in self._callbacks) if t is not None), None)
            if taken is not None:
                member.actor, member.reserve_args, member.warm = taken[0], taken[1], True
            else:
                member.actor = self._new_actor(member)
        self.members = members  # until they are ordered: all of them, for shutdown
        self._reserve(members)
        self.times["actors_up"] = time.monotonic()
        self.members = members = self.shape.order(members)
        self._cluster = addresses_by_role(members)
        kept: dict[str, Any] = {}
        for callback in self._callbacks:
            kept.update(callback.kept_shards(self))
        self.attempt_shards = self.shape.split_attempt(self, members, kept)
        if self.run_ref is None:
            self.run_ref = ray.put(self.run)  # train_fn and its config travel once, not once per actor
        call_each(
            [m.actor for m in members],
            "start",
            lambda i: (self.run_ref, self._spec(members[i]), members[i].role.payload),
            "start",
            self._start_timeout_s,
        )
        logger.info(
            "attempt %d: %s",
            self._attempt,
            ", ".join(f"{self.shape.describe(m, i)} {m.reserved.host_port}" for i, m in enumerate(members)),
        )
        finishers = self.shape.finishers
        self.watch = GroupWatch(
            {i: m.reserved.node_ip for i, m in enumerate(members)},
            start_timeout_s=self._start_timeout_s,
            worker_timeout_s=self._worker_timeout_s,
            hang_timeout_s=self.shape.hang_timeout_s,
            coordinator_timeout_s=self.shape.coordinator_timeout_s,
            finishers=None if finishers is None else [i for i, m in enumerate(members) if m.role.name in finishers],
            labels={i: m.label for i, m in enumerate(members)} if self.shape.named_tasks else None,
        )
        self._relayed({i: m.actor for i, m in enumerate(members)})
        for callback in self._callbacks:
            callback.after_start(self)

    def _spec(self, member: Member) -> WorkerSpec:
        return WorkerSpec(
            role=member.role.name,
            rank=member.given_rank,
            tf_config=build_tf_config(self._cluster, member.task, member.role.name),
            attempt=self._attempt,
            resume=self._resume,
            datasets=self.shape.datasets(self, member),
            task=task_id(member, self.shape),
            placement_group=self._pg.id.hex(),
        )

    def _reserve(self, members: Sequence[Member]) -> None:
        reserve(members, self._start_timeout_s, self._new_actor, self._attempt)

    def connect(self) -> None:
        """Release the start barrier: every member is ready, so all build the strategy together
        (unless the shape finds a member lost just now: the next polls name it)."""
        if not self.shape.before_connect(self, self._start_timeout_s):
            return
        watch_of(self).released = True
        for member in self.members:
            member.actor.connect.remote(self.shape.connect_message(self, member))

    # Watching it.

    def poll(self) -> GroupStatus:
        """What every member said since the last poll, in one call to the relay (relay.py), which
        polls them without waiting on any one: a member that does not answer for
        ``worker_timeout_s`` is lost; the others' reports keep flowing meanwhile."""
        watch = watch_of(self)
        now = time.monotonic()
        try:
            events, unanswered = self._relay.take(self._worker_timeout_s)
        except (RayActorError, GetTimeoutError) as error:  # a relay actor itself is gone: a new one
            logger.warning("the poll relay stopped answering (%s); starting a new one", type(error).__name__)
            self._relay.close()
            self._relay = None
            self._relayed({i: m.actor for i, m in enumerate(self.members)})
            events, unanswered = [], {}
        feed(watch, events, unanswered, now, self._answer)
        for reason in watch.preempt_reasons:
            if self.preempt_reason is None:
                self._request_preemption(reason)
        for callback in self._callbacks:
            callback.on_answers(self, now)
        status = dataclasses.replace(watch.round(self.preempt_reason), preempt_kind=self.preempt_kind)
        if self._preempted and status.failures:
            # A preempted member's end is the preemption, whatever it looked like from here.
            preempted = self._preempted
            status = dataclasses.replace(
                status,
                failures=tuple(
                    dataclasses.replace(f, kind=FailureKind.PREEMPTED, message=f"{preempted[f.rank]}; then {f.message}")
                    if f.rank in preempted
                    else f
                    for f in status.failures
                ),
            )
        for callback in self._callbacks:
            status = callback.after_poll(self, status)
        return status

    def _relayed(self, actors: dict[int, Any]) -> None:
        """Have the relay poll ``actors`` (index -> actor), and no others."""
        if self._relay is None:
            most = sum(role.max_count for role in self.roles)
            self._relay = relay_for(most, _env.get_float(_env.POLL_INTERVAL_S))
        self._relay.watch(actors)

    def _answer(self, index: int, status: WorkerStatus) -> WorkerStatus:
        """A replaceable member that got SIGTERM is replaced; any other's asks the group to stop."""
        if status.preempt_reason and self.members[index].role.name in self.shape.replaceable:
            self._preempt_member(index, status.preempt_reason)
            return dataclasses.replace(status, preempt_reason=None)
        return status

    def preempt(self, index: int, reason: str, kind: FailureKind = FailureKind.PREEMPTED) -> None:
        """Member ``index`` is going away: replace it, where its role is replaceable; else ask the
        group to checkpoint and stop (once). ``kind``: RESIZED where the group stops to grow."""
        if self.members[index].role.name in self.shape.replaceable:
            self._preempt_member(index, reason)
        elif self.preempt_reason is None:
            self._request_preemption(reason, kind)

    def _preempt_member(self, index: int, reason: str) -> None:
        """End the member now, so that it is replaced as a preemption."""
        if index in self._preempted:
            return
        member = self.members[index]
        self._preempted[index] = reason
        logger.warning("%s is being preempted (%s); replacing it", member.label, reason)
        ray.kill(member.actor, no_restart=True)

    def _request_preemption(self, reason: str, kind: FailureKind = FailureKind.PREEMPTED) -> None:
        """Tell every member that runs train_fn, so ``raytf.preemption_requested()`` agrees at once everywhere."""
        logger.warning("%s: %s; asking the %s actors to checkpoint and stop", kind, reason, self.shape.train_role)
        self.preempt_reason, self.preempt_kind = reason, kind
        for member in self.members:
            if member.role.name == self.shape.train_role:
                member.actor.preempt.remote(reason)

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None:
        if 0 <= rank < len(self.members):
            self.members[rank].actor.acknowledge.remote(seq, error)

    # Replacing a member in place.

    def can_replace(self, failure: WorkerFailure) -> bool:
        """Whether ``failure`` is a member's the group rides out (a parameter-server worker's or
        evaluator's, while the chief trains); a mirrored group restarts for any loss."""
        if self.watch is None or not 0 <= failure.rank < len(self.members):
            return False
        return self.members[failure.rank].role.name in self.shape.replaceable and self.watch.phases.get(
            self.trainer_index
        ) not in (Phase.FAILED, Phase.LOST)

    def replace(self, failure: WorkerFailure) -> None:
        """A new actor for the lost member: same bundle, same task index, its old port if free."""
        index = failure.rank
        member = self.members[index]
        silent = [member.address] if self.watch and index in self.watch.silent_ranks and member.address else []
        # Its port free again: the coordinator redials it (worker/ps.py).
        kill_and_wait([member.actor], "replaced", silent)
        self._preempted.pop(index, None)
        old = member.address
        member.generation += 1
        member.actor = self._new_actor(member)
        member.warm, member.reserve_args = False, {"port": old.port if old else 0}
        self._reserve([member])
        address = member.reserved
        if old is None or address.host_port != old.host_port:
            # The coordinator dials the new address before the new server answers there (a silent chief is lost).
            [honoured] = call_each(
                [self.members[self.trainer_index].actor],
                "retarget",
                lambda i: (member.role.name, member.task, address.host_port),
                "retarget the chief",
                self._worker_timeout_s,
                "FailureConfig.worker_timeout_s",
            )
            if not honoured:  # TensorFlow already redials the old address, and would wait there for ever
                raise WorkerStartError(
                    f"it came back at {address.host_port} while the coordinator redialed its old "
                    "address; the group restarts from the last checkpoint"
                )
        self._cluster[member.role.name][member.task] = address.host_port
        call_each(
            [member.actor],
            "start",
            lambda i: (self.run_ref, self._spec(member), member.role.payload),
            "start a replacement",
            self._start_timeout_s,
        )
        watch_of(self).replaced(index, address.node_ip)
        self._relay.replace(index, member.actor)
        member.actor.connect.remote(None)  # a launched script waits for this go; a server does not
        for callback in self._callbacks:
            callback.after_replace(self, member)
        self.notify(f"{member.label} lost ({failure.kind.value}); replaced at {address.host_port}, training goes on")

    # Ending it.

    def halt(self, uploading: bool = False) -> bool:
        """The run is stopping: the chief takes no further report (``raytf.report`` raises) and says
        whether a checkpoint of its is on its way to storage, which the relay's last answer
        (``uploading``) may be too old to show (a chief the watch found silent is told, not waited
        for). Where one is, the others are killed (training stops); the controller waits for its commit."""
        chief = self.members[self.trainer_index].actor if self.members else None
        silent = self.watch is not None and self.trainer_index in self.watch.silent_ranks
        try:
            answer = None if chief is None else chief.halt.remote()
            uploading = answer is not None and not silent and bool(ray.get(answer, timeout=HALT_ANSWER_S)) or uploading
        except (RayActorError, GetTimeoutError):  # gone, or silent since the watch last looked
            pass
        for index, member in enumerate(self.members if uploading else ()):
            if index != self.trainer_index and member.actor is not None:
                ray.kill(member.actor, no_restart=True)
        return uploading

    def shutdown(self, restarting: bool = True) -> None:
        """The attempt ended: let members that keep files on their node remove them, kill every
        actor and wait until they are gone; remove the placement group unless a callback keeps it
        for the next attempt. ``restarting``: whether another attempt follows (callbacks read it
        as ``group.restarting``: with none, nothing is kept for one)."""
        self.restarting = restarting
        for callback in self._callbacks:
            callback.before_shutdown(self)
        members, self.members = self.members, []
        silent = [
            members[i].address
            for i in sorted(self.watch.silent_ranks if self.watch else ())
            if i < len(members) and members[i].address is not None
        ]
        self.watch = None
        if self._relay is not None:
            self._relay.watch({})  # the killed actors' deaths are no news
        ask_each(
            [m.actor for m in members if m.role.name in self.shape.closes and m.actor is not None],
            "close",
            timeout_s=CLOSE_TIMEOUT_S,
        )
        kill_and_wait([m.actor for m in members if m.actor is not None], "worker", silent)
        if not self._keeps_placement():
            placement.remove(self._pg)
            self._pg = None

    def close(self) -> None:
        """The run is over: end what outlives attempts (callbacks' standbys), shut down, remove the
        placement group."""
        for callback in self._callbacks:
            callback.on_close(self)
        self.shutdown()
        placement.remove(self._pg)
        self._pg = None
        if self._relay is not None:
            self._relay.close()
            self._relay = None

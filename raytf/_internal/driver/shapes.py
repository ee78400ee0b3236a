"""The cluster shapes a worker group can have, as data and a few rules (group.py runs them).

A shape says what differs between TensorFlow's two ways of training on a
cluster; everything else about a group (placing it, starting its actors,
polling them, drains, preemption, replacing a task, shutting down) is written
once, in group.py.

- :class:`MirroredShape`: MultiWorkerMirroredStrategy. One role, "worker",
  whose actors all run ``train_fn`` and take world ranks by node; it may be
  elastic; a lost worker restarts the group (a collective cannot lose a member);
  its datasets are split anew for every attempt, by the ranks' nodes.
- :class:`ParameterServerShape`: ParameterServerStrategy. A chief that runs
  ``train_fn``, workers and parameter servers that serve, an optional
  evaluator; a lost worker or evaluator is replaced in place while the chief's
  coordinator rides it out; datasets are split once per run, by worker task, so
  a replacement reads what its predecessor read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from raytf._internal.data.split import split_for_ranks
from raytf._internal.driver.members import GroupView, Member
from raytf._internal.driver.preflight import placement_timeout_message
from raytf._internal.driver.topology import assign_ranks
from raytf._internal.protocol import PayloadKind, RankInfo, RoleSpec, TaskId, WorkerAddress
from raytf.errors import PlacementTimeoutError


@dataclass(frozen=True)
class GroupShape:
    """What one TensorFlow cluster shape asks of its worker group."""

    train_role: str  # the role whose actors run train_fn: they get preemption requests and acks
    replaceable: tuple[str, ...] = ()  # roles whose loss is ridden out with a new actor in place
    finishers: Optional[tuple[str, ...]] = None  # roles whose end is the group's end (None: every role)
    hang_timeout_s: Optional[float] = None  # FailureConfig.hang_timeout_s, where collectives can hang
    # FailureConfig.hang_timeout_s, where a coordinator can be held for ever (parameter servers)
    coordinator_timeout_s: Optional[float] = None
    closes: tuple[str, ...] = ()  # roles asked to close() (remove what they keep on their node) before the kill
    named_tasks: bool = False  # failures and logs name the task ("ps 0"); else the world rank
    # The role whose processes a restart may keep (driver/survivors.py): the mirrored workers, which
    # train the next attempt in their own processes, or a parameter-server group's workers, whose
    # servers serve its next chief. With named tasks, a kept process keeps its task index.
    kept_role: str = "worker"

    def count(self, role: RoleSpec, workers: int) -> int:
        """How many actors ``role`` has in an attempt of ``workers`` (the elastic size)."""
        return role.max_count

    def prepare(self, group: GroupView) -> None:
        """Before the group is placed (so it does not hold the CPUs Ray Data's tasks need)."""

    def order(self, members: list[Member]) -> list[Member]:
        """The members by their index in the group (which the watch, acks and ranks use), each given
        its task index and rank; called once every member has an address."""
        raise NotImplementedError

    def datasets(self, group: GroupView, member: Member) -> dict[str, Any]:
        """The dataset iterators ``member`` reads this attempt."""
        raise NotImplementedError

    def split_attempt(
        self, group: GroupView, members: Sequence[Member], kept: Mapping[str, Any]
    ) -> Optional[list[dict[str, Any]]]:
        """Per world rank, the datasets of this attempt (``kept``: what a callback kept of the last
        attempt's), where the shape splits per attempt; None where it split once (``prepare``)."""
        return None

    def before_connect(self, group: GroupView, timeout_s: float) -> bool:
        """Before the start barrier is released; False leaves it closed for now."""
        return True

    def connect_message(self, group: GroupView, member: Member) -> Any:
        """What ``connect`` hands ``member`` (see TrainWorker.connect)."""
        return None

    def placement_error(self, group: GroupView) -> PlacementTimeoutError:
        raise NotImplementedError

    def describe(self, member: Member, index: int) -> str:
        """How messages name a member."""
        return member.label if self.named_tasks else f"rank {index}"


def _by_role(members: Sequence[Member], role: str) -> list[Member]:
    return [m for m in members if m.role.name == role]


@dataclass(frozen=True)
class MirroredShape(GroupShape):
    """MultiWorkerMirroredStrategy: every "worker" runs train_fn, ranked by node."""

    train_role: str = "worker"

    def count(self, role: RoleSpec, workers: int) -> int:
        return workers if role.name == self.train_role else role.max_count

    def order(self, members: list[Member]) -> list[Member]:
        trained = _by_role(members, self.train_role)
        ranks = assign_ranks([m.reserved for m in trained])
        for member, rank in zip(trained, ranks):
            member.rank, member.task = rank, rank.world_rank
        trained.sort(key=lambda m: m.task)
        others = [m for m in members if m.role.name != self.train_role]
        for index, member in enumerate(others, start=len(trained)):
            member.rank = RankInfo(
                world_rank=index, world_size=len(members), local_rank=0, local_world_size=1, node_rank=0, num_nodes=1
            )
        return trained + others

    def datasets(self, group: GroupView, member: Member) -> dict[str, Any]:
        if member.role.name != self.train_role:
            return {}
        assert group.attempt_shards is not None  # split_attempt ran before the members start
        return group.attempt_shards[member.task]

    def split_attempt(
        self, group: GroupView, members: Sequence[Member], kept: Mapping[str, Any]
    ) -> Optional[list[dict[str, Any]]]:
        trained = _by_role(members, self.train_role)
        return split_for_ranks(group.datasets, group.run.split, [m.reserved.node_id for m in trained], kept)

    def placement_error(self, group: GroupView) -> PlacementTimeoutError:
        import ray

        from raytf._internal.driver import cluster

        last = group.elastic.tries()[-1]  # the smallest size the policy asked for, and its wait
        return PlacementTimeoutError(
            placement_timeout_message(
                group.roles[0].bundle,
                last.workers,
                group.placement_strategy,
                last.timeout_s or 0.0,
                ray.cluster_resources(),
                ray.available_resources(),
                cluster.live_node_resources(),
                last.set_by,
            )
        )


@dataclass(frozen=True)
class ParameterServerShape(GroupShape):
    """ParameterServerStrategy: the chief runs train_fn; workers and ps serve; lost workers are replaced."""

    train_role: str = "chief"
    replaceable: tuple[str, ...] = ("worker", "evaluator")
    finishers: Optional[tuple[str, ...]] = ("chief", "evaluator")
    closes: tuple[str, ...] = ("worker",)
    named_tasks: bool = True

    def prepare(self, group: GroupView) -> None:
        """Each worker's piece of every dataset, made once for the run: a replaced worker, and every
        attempt, reads the same rows. Datasets not split are given whole to every worker."""
        if group.run_shards is not None:
            return
        workers = sum(r.max_count for r in group.roles if r.name == "worker")
        pieces: list[dict[str, Any]] = [{} for _ in range(workers)]
        for name, dataset in group.datasets.items():
            parts = _split_in_order(dataset, workers) if name in group.run.split else [dataset] * workers
            for task, part in enumerate(parts):
                pieces[task][name] = _in_order(part)
        group.run_shards = pieces

    def order(self, members: list[Member]) -> list[Member]:
        for index, member in enumerate(members):  # in TF_CONFIG's role order; the chief first
            chief = member.role.name == self.train_role  # the one train_fn, so a group of one in its context
            member.rank = RankInfo(
                world_rank=0 if chief else index,
                world_size=1 if chief else len(members),
                local_rank=0,
                local_world_size=1,
                node_rank=0,
                num_nodes=1,
            )
        return members

    def datasets(self, group: GroupView, member: Member) -> dict[str, Any]:
        assert group.run_shards is not None  # prepare ran before the members start
        return group.run_shards[member.task] if member.role.name == "worker" else {}

    def before_connect(self, group: GroupView, timeout_s: float) -> bool:
        """Every worker's shard manifest, for the chief; a worker lost just now leaves the barrier
        closed (once it is replaced, the group is ready again)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        workers = _by_role(group.members, "worker")
        try:
            group.shard_manifests = ray.get([m.actor.shard_files.remote() for m in workers], timeout=timeout_s)
        except (RayActorError, GetTimeoutError):
            return False
        return True

    def connect_message(self, group: GroupView, member: Member) -> Any:
        return group.shard_manifests if member.role.name == self.train_role else None

    def placement_error(self, group: GroupView) -> PlacementTimeoutError:
        import ray

        timeout = group.elastic.placement_timeout_s
        return PlacementTimeoutError(
            f"the parameter-server group ({', '.join(f'{r.max_count} {r.name} x {r.bundle}' for r in group.roles)}"
            f", {group.placement_strategy}) could not be placed within {timeout or 0:g} s "
            f"(ParameterServerScaling.placement_timeout_s); the cluster has {ray.cluster_resources()}, "
            f"of which {ray.available_resources()} is free"
        )


def _split_in_order(dataset: Any, workers: int) -> list[Any]:
    """``dataset`` in ``workers`` equal pieces, split in the order of its blocks."""
    options = dataset.context.execution_options
    before, options.preserve_order = options.preserve_order, True
    try:
        return dataset.split(workers, equal=True)
    finally:
        options.preserve_order = before


def _in_order(dataset: Any) -> Any:
    """``dataset``, read in the order of its blocks (``preserve_order``): a worker replaced in place
    writes its piece's rows in its predecessor's order, so the positions the steps counted
    (data/ps_positions.py) name the same rows."""
    context = getattr(dataset, "context", None)
    if context is not None:
        context.execution_options.preserve_order = True
    return dataset


def task_id(member: Member, shape: GroupShape) -> Optional[TaskId]:
    """Its TF_CONFIG task, where the shape names tasks."""
    return TaskId(member.role.name, member.task) if shape.named_tasks else None


def evaluates(role: RoleSpec) -> bool:
    """An evaluator of raytf's (not a launched script's): told when training ends."""
    return role.name == "evaluator" and role.payload == PayloadKind.EVALUATOR


def addresses_by_role(members: Sequence[Member]) -> dict[str, list[str]]:
    """TF_CONFIG's cluster: each role's tasks' ``host:port``, in task order."""
    cluster: dict[str, list[str]] = {}
    for member in sorted(members, key=lambda m: m.task):
        address: Optional[WorkerAddress] = member.address
        cluster.setdefault(member.role.name, []).append(address.host_port if address else "")
    return cluster

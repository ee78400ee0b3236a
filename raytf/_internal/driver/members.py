"""A worker group's members, and the view of a group that its shapes and callbacks are given.

Kept apart from group.py (which needs Ray) so that shapes.py and callbacks.py
depend on this small interface, not on the group that calls them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

from raytf._internal.driver.scaling import ElasticPolicy
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import RankInfo, RoleSpec, RunSpec, WorkerAddress
from raytf.errors import FailureKind


@dataclass(eq=False)
class Member:
    """One task of the group: its role, task index, bundle, and the actor that holds it now."""

    role: RoleSpec
    task: int  # its index in its role: TF_CONFIG's task index (a mirrored worker's: its world rank)
    bundle: int  # its placement-group bundle, kept by every replacement
    actor: Any = None
    address: Optional[WorkerAddress] = None
    rank: Optional[RankInfo] = None
    generation: int = 0  # replacements so far
    warm: bool = False  # a warm standby was handed this bundle
    reserve_args: dict = field(default_factory=dict)  # its reserve() call's

    @property
    def label(self) -> str:
        return f"{self.role.name} {self.task}"

    @property
    def reserved(self) -> WorkerAddress:
        """Its address, which its actor reports once it reserved its port: every member has one
        from the group's start on (ranks, TF_CONFIG and the watch are made of them)."""
        if self.address is None:
            raise RuntimeError(f"{self.label} has no address yet: it is asked for one before the group starts")
        return self.address

    @property
    def given_rank(self) -> RankInfo:
        """Its rank, which the group's shape gives every member before it starts (shapes.py)."""
        if self.rank is None:
            raise RuntimeError(f"{self.label} has no rank yet: the group's shape orders its members first")
        return self.rank


class GroupView(Protocol):
    """What a shape or a callback may read of a worker group, and ask of it."""

    run: RunSpec
    roles: list[RoleSpec]
    shape: Any  # its GroupShape
    placement_strategy: str
    elastic: ElasticPolicy
    datasets: dict[str, Any]
    num_workers: int  # this attempt's elastic size
    members: list[Member]  # by index: the watch's, the acks', the training ranks'
    watch: Optional[GroupWatch]
    times: dict[str, float]  # this attempt's start-up: began, placed, actors_up (time.monotonic)
    run_shards: Optional[list[dict[str, Any]]]
    attempt_shards: Optional[list[dict[str, Any]]]
    shard_manifests: Any
    preempt_reason: Optional[str]
    restarting: bool  # during shutdown: whether another attempt follows this one
    run_ref: Any
    notify: Callable[[str], None]

    @property
    def trainer_index(self) -> int: ...  # the first member that runs train_fn

    def bundle_nodes(self) -> Mapping[int, str]: ...  # bundle index -> node id

    def preempt(
        self, index: int, reason: str, kind: FailureKind = FailureKind.PREEMPTED
    ) -> None: ...  # member ``index`` is going away (RESIZED: the group stops to grow)


def watch_of(group: GroupView) -> GroupWatch:
    """The group's watch, which exists from its attempt's start to its shutdown: the only time
    shapes and callbacks read it."""
    if group.watch is None:
        raise RuntimeError("the worker group's watch was read outside an attempt")
    return group.watch

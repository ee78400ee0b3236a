"""What a worker group does at points of its lifecycle, beyond the lifecycle itself: its callbacks.

The group (group.py) places, starts, polls, preempts, replaces and shuts down
its actors; a feature that needs to act at one of those points is a
:class:`GroupCallback` handed to the group, as Ray Train V2's worker-group
callbacks are, so adding one never means editing the group. The group calls
its callbacks in the order given. Each method's default does nothing.

The interface, in the order of a group's life:

- ``before_start(group, attempt)``: an attempt begins (nothing is placed yet).
- ``after_placement(group)``: a new placement group holds the attempt's bundles.
- ``arrange(group, members)``: the attempt's members and their bundles, before any
  has an actor; members of one role may trade bundles (survivors.py).
- ``actor_for(group, member)``: an actor to use for ``member`` instead of a new
  one, with the arguments of its ``reserve`` call (warm standbys), or None.
- ``kept_shards(group)``: datasets this attempt may read as an earlier one did,
  instead of a new split (name -> one per rank, or one for all).
- ``after_start(group)``: every actor has its address, rank and payload.
- ``on_answers(group, now)``: a poll's answers are in; what the callback asks of
  the group now (``group.preempt``) shows in this poll's status.
- ``after_poll(group, status)``: returns the status the controller gets.
- ``after_replace(group, member)``: ``member`` has a new actor, started.
- ``before_shutdown(group)`` / ``on_close(group)``: the attempt ends / the run ends.

A callback that sets ``keeps_placement`` keeps the placement group across
attempts while its nodes stay (the group checks that), for what lives on them.
One that sets ``floats_workers`` has the group start the CPU-only workers of the
role a restart may keep (its shape's ``kept_role``) outside the placement group,
pinned to their bundles' nodes while the bundles reserve their CPUs, so that a
worker can outlive the group.

Here: :class:`StartupTiming`, :class:`DrainWatch`, :class:`FinishEvaluator` and
:class:`MemoryCopies`; warm standbys and their kept shards are in warm.py.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Optional

from raytf._internal.driver import cluster
from raytf._internal.driver.members import GroupView, Member, watch_of
from raytf._internal.driver.shapes import evaluates
from raytf._internal.driver.watch import Milestone
from raytf._internal.protocol import GroupStatus, Phase

_DRAIN_CHECK_INTERVAL_S = 1.0  # how often the driver asks Ray which nodes are draining
_DROP_TIMEOUT_S = 5.0  # how long the members get to remove their nodes' checkpoint copies at the run's end


class GroupCallback:
    """A feature of a worker group, acting at points of its lifecycle (see the module docstring)."""

    keeps_placement = False
    floats_workers = False

    def before_start(self, group: GroupView, attempt: int) -> None:
        pass

    def after_placement(self, group: GroupView) -> None:
        pass

    def arrange(self, group: GroupView, members: list[Member]) -> None:
        """The attempt's members, each with its bundle, before any has an actor: a callback may
        swap the bundles of members of one role (they ask for the same resources)."""

    def actor_for(self, group: GroupView, member: Member) -> Optional[tuple[Any, dict]]:
        return None

    def kept_shards(self, group: GroupView) -> Mapping[str, Any]:
        return {}

    def after_start(self, group: GroupView) -> None:
        pass

    def on_answers(self, group: GroupView, now: float) -> None:
        pass

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        return status

    def after_replace(self, group: GroupView, member: Member) -> None:
        pass

    def before_shutdown(self, group: GroupView) -> None:
        pass

    def on_close(self, group: GroupView) -> None:
        pass


class StartupTiming(GroupCallback):
    """``GroupStatus.startup`` once per attempt, when it trained its first step (or report) or
    finished: seconds per start-up phase (placement, actors, loading, connect, first step)."""

    def __init__(self) -> None:
        self._sent = False

    def before_start(self, group: GroupView, attempt: int) -> None:
        self._sent = False

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        watch = watch_of(group)
        if (
            self._sent
            or Milestone.CONNECTED not in watch.reached
            or (watch.trained_since() is None and not status.finished)
        ):
            return status
        self._sent = True
        times = group.times
        startup: dict[str, Any] = watch.startup(times["began"], times["placed"], times["actors_up"])
        if status.progress is not None and status.progress.restored_from is not None:
            startup["restored_from"] = status.progress.restored_from  # rank 0's: "memory" or "storage"
        return dataclasses.replace(status, startup=startup)


class DrainWatch(GroupCallback):
    """A member whose node Ray is draining (a spot node's notice, an autoscaler's scale-down) is a
    preemption: a replaceable member is replaced, otherwise the group checkpoints and stops."""

    def __init__(self, interval_s: float = _DRAIN_CHECK_INTERVAL_S):
        self._interval_s = interval_s
        self._checked_at = 0.0

    def on_answers(self, group: GroupView, now: float) -> None:
        if now - self._checked_at < self._interval_s or (group.preempt_reason and not group.shape.replaceable):
            return
        self._checked_at = now
        draining = cluster.draining_nodes()
        for index, member in enumerate(group.members):
            if member.address is None or member.address.node_id not in draining:
                continue
            deadline_ms = draining[member.address.node_id]
            left = f"; it goes in {max(0.0, deadline_ms / 1000 - time.time()):.0f} s" if deadline_ms else ""
            group.preempt(
                index, f"node {member.address.node_ip} of {group.shape.describe(member, index)} is draining{left}"
            )


class FinishEvaluator(GroupCallback):
    """Once the chief's train_fn returned, raytf's evaluator evaluates the last checkpoint and ends."""

    def __init__(self) -> None:
        self._told = False

    def before_start(self, group: GroupView, attempt: int) -> None:
        self._told = False

    def on_answers(self, group: GroupView, now: float) -> None:
        if self._told or watch_of(group).phases.get(group.trainer_index) != Phase.FINISHED:
            return
        for member in group.members:
            if evaluates(member.role):
                member.actor.finish.remote()
        self._told = True

    def after_replace(self, group: GroupView, member: Member) -> None:
        if self._told and evaluates(member.role):
            member.actor.finish.remote()


class MemoryCopies(GroupCallback):
    """``CheckpointConfig(restore_from_memory=True)``: the chief keeps the newest committed
    checkpoint in host memory on its node (checkpoint/memory.py). The placement group is kept
    across attempts (while its nodes stay), so a restarted rank lands on the node it left and finds
    the copy. When the run ends, every node the run placed a worker on drops the run's copy: the
    members still up on theirs, a task of no resources on each other live one (a run that failed
    has no member left: its last attempt's actors are gone before the run ends)."""

    keeps_placement = True

    def __init__(self) -> None:
        self._nodes: set[str] = set()  # every node any attempt placed a bundle on

    def after_placement(self, group: GroupView) -> None:
        self._nodes.update(group.bundle_nodes().values())

    def on_close(self, group: GroupView) -> None:
        from raytf._internal.driver.actors import ask_each, drop_copies_on

        if group.run.storage is None:
            return
        members = [m for m in group.members if m.actor is not None]
        ask_each([m.actor for m in members], "drop_checkpoint_copies", group.run.storage, timeout_s=_DROP_TIMEOUT_S)
        covered = {m.address.node_id for m in members if m.address is not None}
        drop_copies_on(
            sorted((self._nodes & cluster.live_node_ids()) - covered), group.run.storage, timeout_s=_DROP_TIMEOUT_S
        )

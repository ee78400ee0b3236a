"""Survivors: the ranks that outlived an attempt train the next one in their own processes
(``FailureConfig.keep_survivors``).

A restart used to end every worker and start the group anew, so a restart after one rank's loss
cost as many TensorFlow imports as the group has workers, on nodes that had them loaded. Now, as
an attempt of a MultiWorkerMirroredStrategy group ends, every member that still answers is asked to
``recycle`` (worker/recycle.py: its ``train_fn`` stopped, its collectives aborted, TensorFlow's
eager context new) instead of being killed, and the next attempt hands each kept process a bundle
on its node, as a warm standby is handed one: only the lost ranks start cold, and a restart's
imports no longer grow with the group. When the next attempt reuses the placement group (same
size, live nodes), a kept process gets its own bundle back. CPU workers run outside the placement
group (``floats_workers``: the bundle only reserves their CPUs), so they outlive it too: after a
shrink, a growth or a lost node, the new group's bundles on a kept process's node go to it first.
A GPU worker holds its GPUs in the group and dies with it. A process that cannot be recycled (its
``train_fn`` does not end once its collectives fail, an asynchronous checkpoint still uploading) is
killed as before. On by default for CPU workers; for GPU workers where asked.

A parameter-server group's restart (a lost chief or ps) keeps its workers' processes the same way,
with their servers: TensorFlow cannot stop a server, and need not, for a server serves whichever
coordinator connects to it, and the next chief's cluster names the kept worker at its own address
again, each kept process its own task index (``shape.named_tasks``: a bundle of the new placement
group on the kept process's node is given to its task, ``arrange``). The chief, the parameter
servers and the evaluator start anew: a parameter server holds the last coordinator's variables,
and the steps it was running could still hold its threads. A kept worker's server keeps the last
coordinator's context until TensorFlow's keep-alive lets it go (its per-worker datasets' buffers);
the dead parameter servers fail whatever of that coordinator's steps it still ran.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import ray

from raytf._internal.driver.actors import CLOSE_TIMEOUT_S, ask_each, floats, kill_and_wait
from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.members import GroupView, Member
from raytf._internal.driver.relay import first_line
from raytf._internal.protocol import GroupStatus, Phase

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 3.0  # how long a survivor's train_fn gets to end once its collectives are aborted
_ANSWER_MARGIN_S = 5.0  # on top of it, for the recycle call's answer


class Survivors(GroupCallback):
    """Keeps the members that outlive an attempt for the next one, on bundles of their nodes."""

    keeps_placement = True
    floats_workers = True

    def __init__(self, stop_timeout_s: float = STOP_TIMEOUT_S):
        self._stop_timeout_s = stop_timeout_s
        self._kept: list[_Kept] = []  # recycled actors waiting for a bundle
        self._placed_anew = False  # this attempt has a new placement group: bundles go by node
        self._bundle_nodes: Optional[dict[int, str]] = None  # this attempt's, once asked
        self._closing = False
        self.handed = 0  # members this attempt started on a kept process

    def before_start(self, group: GroupView, attempt: int) -> None:
        self.handed = 0
        self._placed_anew = False
        self._bundle_nodes = None

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        if status.startup is None or self.handed == 0:  # StartupTiming's, once per attempt
            return status
        return dataclasses.replace(status, startup={**status.startup, "kept_processes": self.handed})

    def before_shutdown(self, group: GroupView) -> None:
        watch = group.watch
        if self._closing or not group.restarting:  # the run's end: its last shutdown kills every member
            return

        def alive(index: int) -> bool:
            # Once the attempt started, a member that answered its polls and is neither lost nor
            # silent. Before (a start that failed: a node that died under the placement, an actor
            # that did not start in time), any: one that is gone or stuck does not answer the ask.
            return watch is None or (
                watch.phases.get(index, Phase.LOST) != Phase.LOST and index not in watch.silent_ranks
            )

        asked = [
            (member, member.address.node_id, member.actor.recycle.remote(self._stop_timeout_s))
            for index, member in enumerate(group.members)
            if member.actor is not None
            and member.address is not None  # a start that failed before it reserved a port: not kept
            and member.role.name == group.shape.kept_role
            and alive(index)
        ]
        if not asked:
            return
        refs = [ref for _, _, ref in asked]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._stop_timeout_s + _ANSWER_MARGIN_S)
        for member, node_id, ref in asked:
            why = "no answer" if ref not in ready else _answer(ref)
            if why is None:
                floating = floats(member.role.bundle) and member.generation == 0  # as group._floats
                self._kept.append(_Kept(member.actor, member.bundle, node_id, floating, member.task))
                member.actor = None  # spared: the group's shutdown kills only the members it still holds
            else:
                logger.info("%s is not kept for the next attempt: %s", member.label, why)

    def after_placement(self, group: GroupView) -> None:
        # A new placement group: a kept GPU worker's bundle is gone with the old one (and the
        # worker with it); a CPU worker, outside the group, takes a new bundle on its node.
        self._placed_anew = True
        self._drop(group, lambda kept: not kept.floating)

    def arrange(self, group: GroupView, members: list[Member]) -> None:
        """Named tasks placed anew: give each kept process's task a bundle on the process's node
        (the role's bundles ask for the same resources), so that it keeps its task index; the
        role's other tasks take the bundles left, their own first."""
        if not (group.shape.named_tasks and self._placed_anew and self._kept):
            return
        nodes = self._nodes(group)
        role = [m for m in members if m.role.name == group.shape.kept_role]
        wanted = {k.task: k.node_id for k in self._kept if k.floating}
        free = [m.bundle for m in role]
        given: dict[int, int] = {}
        for member in sorted(role, key=lambda m: nodes.get(m.bundle) != wanted.get(m.task)):  # those in place first
            if member.task in wanted:
                on_node = [b for b in free if nodes.get(b) == wanted[member.task]]
                bundle = member.bundle if member.bundle in on_node else next(iter(on_node), None)
                if bundle is not None:
                    given[member.task] = bundle
                    free.remove(bundle)
        for member in role:
            if member.task not in given:
                given[member.task] = member.bundle if member.bundle in free else free[0]
                free.remove(given[member.task])
        for member in role:
            member.bundle = given[member.task]

    def actor_for(self, group: GroupView, member: Member) -> Optional[tuple[Any, dict]]:
        if member.role.name != group.shape.kept_role or not self._kept:
            return None
        # A named task's process serves as that task (its index is its server's): only its own.
        candidates = [k for k in self._kept if k.task == member.task] if group.shape.named_tasks else self._kept
        if self._placed_anew:
            node = self._nodes(group).get(member.bundle)
            found = next((k for k in candidates if k.floating and k.node_id == node), None)
        else:
            found = next((k for k in candidates if k.bundle == member.bundle), None)
        if found is None:
            return None
        self._kept.remove(found)
        self.handed += 1
        return found.actor, {}

    def after_start(self, group: GroupView) -> None:
        self._drop(group)  # any not handed a bundle

    def on_close(self, group: GroupView) -> None:
        self._closing = True  # the run's end: its last shutdown kills every member
        kept, self._kept = [k.actor for k in self._kept], []
        if kept:  # gone, as every member is, when fit() returns
            _close(group, kept)
            kill_and_wait(kept, "kept worker")

    def _nodes(self, group: GroupView) -> dict[int, str]:
        if self._bundle_nodes is None:
            self._bundle_nodes = dict(group.bundle_nodes())
        return self._bundle_nodes

    def _drop(self, group: GroupView, which: Callable[[_Kept], bool] = lambda kept: True) -> None:
        dropped = [k for k in self._kept if which(k)]
        self._kept = [k for k in self._kept if not which(k)]
        _close(group, [k.actor for k in dropped])
        for kept in dropped:
            ray.kill(kept.actor, no_restart=True)


@dataclasses.dataclass
class _Kept:
    """A recycled process waiting for the next attempt."""

    actor: Any
    bundle: int  # the bundle it held: its own again while the placement group is kept
    node_id: str
    floating: bool  # outside the placement group (a CPU worker): it outlives the group
    task: int  # its task index: a named task's process serves as that task only


def _close(group: GroupView, actors: list[Any]) -> None:
    """Before kept processes are killed: let those of a role that keeps files on its node (a
    parameter-server worker's shard files) remove them, as the group's shutdown does."""
    if group.shape.kept_role in group.shape.closes:
        ask_each(actors, "close", timeout_s=CLOSE_TIMEOUT_S)


def _answer(ref: Any) -> Optional[str]:
    """A recycle call's answer: None (kept) or why not; a call that failed is its error."""
    try:
        return ray.get(ref, timeout=0)
    except Exception as error:  # noqa: BLE001 - a dead actor, or one whose recycle raised: not kept
        return f"{type(error).__name__}: {first_line(error)}"

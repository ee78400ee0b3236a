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

The same recycling keeps a finished run's CPU workers for the driver's next run, where
``RAYTF_REUSE_WORKERS_S`` asks for it: they wait in the driver's pool (driver/pool.py), and the
next run's first attempt takes them, bundle by bundle on their nodes, before it starts new ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Optional

import ray

from raytf._internal import env as _env
from raytf._internal.driver import pool as _pool
from raytf._internal.driver.actors import floats, kill_and_wait
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

    def __init__(self, stop_timeout_s: float = STOP_TIMEOUT_S, reuse_s: Optional[float] = None):
        self._stop_timeout_s = stop_timeout_s
        self._reuse_s = _env.reuse_workers_s() if reuse_s is None else reuse_s  # driver/pool.py; 0: off
        self._kept: list[_Kept] = []  # recycled actors waiting for a bundle
        self._placed_anew = False  # this attempt has a new placement group: bundles go by node
        self._bundle_nodes: Optional[dict[int, str]] = None  # this attempt's, once asked
        self._closing = False
        self._first = True  # the run's first attempt has not started yet: it may take parked processes
        self._key: Optional[tuple] = None  # the run's pool key (pool.environment_key), once asked
        self.handed = 0  # members this attempt started on a kept process
        self.reused = 0  # members this attempt started on a process parked by an earlier run

    def before_start(self, group: GroupView, attempt: int) -> None:
        self.handed = self.reused = 0
        self._placed_anew = False
        self._bundle_nodes = None

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        if status.startup is None or not (self.handed or self.reused):  # StartupTiming's, once per attempt
            return status
        startup = dict(status.startup)
        if self.handed:
            startup["kept_processes"] = self.handed
        if self.reused:
            startup["reused_processes"] = self.reused
        return dataclasses.replace(status, startup=startup)

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
            (member, member.actor.recycle.remote(self._stop_timeout_s))
            for index, member in enumerate(group.members)
            if member.actor is not None and member.role.name == group.shape.train_role and alive(index)
        ]
        if not asked:
            return
        refs = [ref for _, ref in asked]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._stop_timeout_s + _ANSWER_MARGIN_S)
        for member, ref in asked:
            why = "no answer" if ref not in ready else _answer(ref)
            if why is None:
                floating = floats(member.role.bundle)
                self._kept.append(
                    _Kept(member.actor, member.bundle, member.address.node_id, floating, member.actor_name)
                )
                member.actor = None  # spared: the group's shutdown kills only the members it still holds
            else:
                logger.info("%s is not kept for the next attempt: %s", member.label, why)

    def after_placement(self, group: GroupView) -> None:
        # A new placement group: a kept GPU worker's bundle is gone with the old one (and the
        # worker with it); a CPU worker, outside the group, takes a new bundle on its node.
        self._placed_anew = True
        self._drop(lambda kept: not kept.floating)

    def actor_for(self, group: GroupView, member: Member) -> Optional[tuple[Any, dict]]:
        if member.role.name != group.shape.train_role:
            return None
        if self._kept:
            if self._placed_anew:
                node = self._node_of(group, member.bundle)
                found = next((k for k in self._kept if k.floating and k.node_id == node), None)
            else:
                found = next((k for k in self._kept if k.bundle == member.bundle), None)
            if found is not None:
                self._kept.remove(found)
                member.actor_name = found.name
                self.handed += 1
                return found.actor, {}
        if self._first and self._reuse_s > 0 and floats(member.role.bundle):
            parked = _pool.driver_pool().take(self._pool_key(group), self._node_of(group, member.bundle))
            if parked is not None:
                member.actor_name = parked.name
                self.reused += 1
                return parked.actor, {}
        return None

    def after_start(self, group: GroupView) -> None:
        self._first = False
        self._drop()  # any not handed a bundle

    def on_close(self, group: GroupView) -> None:
        self._closing = True  # the run's end: its last shutdown kills every member
        kept, self._kept = [k.actor for k in self._kept], []
        if kept:  # gone, as every member is, when fit() returns
            kill_and_wait(kept, "kept worker")
        if self._reuse_s > 0 and group.reusing:
            self._park(group)

    def _park(self, group: GroupView) -> None:
        """The run finished: its CPU workers, recycled, wait in the driver's pool for its next run."""
        asked = [
            (member, member.actor.recycle.remote(self._stop_timeout_s, True))
            for member in group.members
            if member.actor is not None
            and member.address is not None
            and member.role.name == group.shape.train_role
            and floats(member.role.bundle)
        ]
        if not asked:
            return
        refs = [ref for _, ref in asked]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._stop_timeout_s + _ANSWER_MARGIN_S)
        key, now, parked = self._pool_key(group), time.monotonic(), []
        for member, ref in asked:
            why = "no answer" if ref not in ready else _answer(ref)
            if why is None:
                parked.append(_pool.Parked(member.actor, member.actor_name, member.address.node_id, key, now))
                member.actor = None  # spared: the group's shutdown kills only the members it still holds
            else:
                logger.info("%s is not kept for the next run: %s", member.label, why)
        _pool.driver_pool().park(parked, self._reuse_s)

    def _pool_key(self, group: GroupView) -> tuple:
        if self._key is None:
            from raytf._internal.worker.tensorflow import run_environment

            self._key = _pool.environment_key(run_environment(group.run))
        return self._key

    def _node_of(self, group: GroupView, bundle: int) -> Optional[str]:
        if self._bundle_nodes is None:
            self._bundle_nodes = dict(group.bundle_nodes())
        return self._bundle_nodes.get(bundle)

    def _drop(self, which: Callable[[_Kept], bool] = lambda kept: True) -> None:
        dropped = [k for k in self._kept if which(k)]
        self._kept = [k for k in self._kept if not which(k)]
        for kept in dropped:
            ray.kill(kept.actor, no_restart=True)


@dataclasses.dataclass
class _Kept:
    """A recycled process waiting for the next attempt."""

    actor: Any
    bundle: int  # the bundle it held: its own again while the placement group is kept
    node_id: str
    floating: bool  # outside the placement group (a CPU worker): it outlives the group
    name: str = ""  # its Ray actor name


def _answer(ref: Any) -> Optional[str]:
    """A recycle call's answer: None (kept) or why not; a call that failed is its error."""
    try:
        return ray.get(ref, timeout=0)
    except Exception as error:  # noqa: BLE001 - a dead actor, or one whose recycle raised: not kept
        return f"{type(error).__name__}: {first_line(error)}"

"""Warm standbys: processes with TensorFlow and ``train_fn`` loaded, waiting on each training
node to take a rank when the group restarts (``FailureConfig.warm_standby``).

Each training worker's node gets a standby actor that loads TensorFlow and
``train_fn`` and waits, with no CPU or GPU of its own: for GPU workers as soon
as the attempt's workers have started (a GPU node's cores are mostly idle, and
a failure in the attempt's first seconds should already restart warm), for CPU
workers once the attempt trains (its first step or report, so that the
standbys' imports never slow its start). The next attempt hands a bundle on
that node to it instead of starting a cold actor, on the CPUs and GPUs the
bundle holds (its GPUs' ids as the bundle's last actor had them). Once an
attempt trains, the shards its ranks read are kept too (kept_shards.py; a CPU
worker's standby is made once the ranks have answered for them), and a restart
of the same size reads them. The placement group is kept across such restarts
while its nodes stay: a new one could land on other nodes than the standbys
and the kept shards.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytf._internal.driver.actors import new_worker
from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.kept_shards import ShardKeeper
from raytf._internal.driver.members import GroupView, Member, watch_of
from raytf._internal.driver.watch import GroupWatch, Milestone
from raytf._internal.protocol import GroupStatus

# Warm standbys wait for an attempt's first step or report, so that their imports do not slow its
# start; a loop that tells raytf of neither gets them this long after its strategy connected.
_WARM_AFTER_S = 10.0
# Asked that early, a rank may still be reading its shard: the standbys then wait for its first step
# or report (when the ranks that had not read their shards whole are asked again), or this long for
# a loop that tells raytf of neither.
_UNTOLD_WAIT_S = 60.0


class WarmStandbys(GroupCallback):
    """One standby per training worker, on its node, made once each attempt trains."""

    keeps_placement = True

    def __init__(self, datasets: Collection[str], split: Collection[str], at_start: bool = False):
        self._standby: list[tuple[str, Any]] = []  # (node id, actor): warm, waiting for a rank
        self._at_start = at_start  # start the standbys with the attempt's workers, not once it trains
        self._made = False  # standbys, for this attempt
        self._kept = False  # the ranks' shards, for this attempt
        self._asked_at: Optional[float] = None  # when the ranks were asked for their shards (watch.now)
        self._asked_early = False  # asked before the attempt's first step or report
        self._count = 0  # names them apart
        self._bundle_gpus: dict[int, tuple[str, ...]] = {}  # bundle index -> its GPUs' ids (standbys take them)
        self._bundle_nodes: Optional[dict[int, str]] = None  # bundle index -> node id, this attempt
        self._keeper = ShardKeeper(datasets, split)

    def before_start(self, group: GroupView, attempt: int) -> None:
        self._made = self._kept = self._asked_early = False
        self._bundle_nodes = None

    def after_placement(self, group: GroupView) -> None:
        self._bundle_gpus = {}  # a new group's bundles may hold other GPUs

    def actor_for(self, group: GroupView, member: Member) -> Optional[tuple[Any, dict]]:
        if member.role.name != group.shape.train_role or not self._standby:
            return None
        gpus = self._bundle_gpus.get(member.bundle) if member.role.bundle.get("GPU") else ()
        if gpus is None:
            return None  # a GPU bundle whose GPUs no actor of this placement group has named yet
        if self._bundle_nodes is None:
            self._bundle_nodes = dict(group.bundle_nodes())
        node = self._bundle_nodes.get(member.bundle)
        for i, (standby_node, actor) in enumerate(self._standby):
            if standby_node == node:
                del self._standby[i]
                return actor, ({"gpu_ids": gpus} if gpus else {})
        return None

    def kept_shards(self, group: GroupView) -> Mapping[str, Any]:
        return self._keeper.take(group.num_workers)

    def after_start(self, group: GroupView) -> None:
        # Bundle i's GPUs, as its actor named them: a standby handed bundle i later takes these.
        self._bundle_gpus = {m.bundle: m.reserved.gpu_ids for m in group.members if m.reserved.gpu_ids}
        if self._at_start:
            self._make_standbys(group)

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        watch = watch_of(group)
        told = watch.trained_since() is not None  # the attempt's first step or report came
        if not self._kept and not status.finished and _trains(watch):
            self._kept, self._asked_at, self._asked_early = True, watch.now(), not told
            trained = self._trained(group)
            self._keeper.ask([m.actor for m in trained], [m.reserved.node_id for m in trained])
        elif self._asked_early and told and not status.finished:
            # Asked a while after the connect with no step or report yet, a rank may have been
            # still reading its shard (a slow read: Ray Data's tasks waiting for a CPU the workers
            # hold): what it had not read whole then, it is asked for again now.
            self._asked_early = False
            self._keeper.ask_again([m.actor for m in self._trained(group)])
        # The standbys come once every rank has answered for its shards (or died): a rank lost
        # after its standby is up is then always one whose shards are kept, however slow its answer
        # was. No wait bounds this: a rank answers its calls in order, so one that answers the polls
        # after the ask has answered the ask, and one that answers nothing is found unresponsive.
        # Answers from before the first step or report that a shard was not read whole are waited
        # past (for that step or report, or _UNTOLD_WAIT_S for a loop that tells raytf of neither).
        if self._kept and not self._made and self._keeper.answered() and self._answers_final(watch):
            self._make_standbys(group)
        return status

    def _answers_final(self, watch: GroupWatch) -> bool:
        if not self._asked_early or self._keeper.all_whole():
            return True
        return self._asked_at is not None and watch.now() - self._asked_at > _UNTOLD_WAIT_S

    @staticmethod
    def _trained(group: GroupView) -> list[Member]:
        return [m for m in group.members if m.role.name == group.shape.train_role]

    def _make_standbys(self, group: GroupView) -> None:
        """One standby per training worker on its node, less those still waiting from before."""
        if self._made:
            return
        self._made = True
        trained = self._trained(group)
        waiting: dict[str, int] = {}
        for node, _ in self._standby:
            waiting[node] = waiting.get(node, 0) + 1
        run_name = group.run.run_name
        for member in trained:
            node = member.reserved.node_id
            if waiting.get(node, 0) > 0:
                waiting[node] -= 1
                continue
            self._count += 1
            actor = new_worker(
                group.run,
                f"raytf:{run_name}:standby:{self._count}",
                num_cpus=0,
                num_gpus=0,
                max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            )
            actor.warm.remote(group.run_ref)  # not waited on: a restart's reserve() queues behind it
            self._standby.append((node, actor))

    def on_close(self, group: GroupView) -> None:
        standby, self._standby = [actor for _, actor in self._standby], []
        for actor in standby:
            ray.kill(actor, no_restart=True)
        self._keeper.clear()


def _trains(watch: GroupWatch) -> bool:
    """The attempt is past its start: its first step or report, or (a loop that tells raytf of
    neither) connected for a while."""
    connected = watch.reached.get(Milestone.CONNECTED)
    return watch.trained_since() is not None or (connected is not None and watch.now() - connected > _WARM_AFTER_S)

"""The Ray side of a worker group: one placement group, one actor per bundle, polls, teardown.

A group is made of roles (:class:`~raytf._internal.protocol.RoleSpec`): each
places its own bundles, and each of its actors runs the role's payload.
Training today is one role, "worker", whose actors run ``train_fn`` under
MultiWorkerMirroredStrategy; TF_CONFIG names every role (topology.py). What
the answers to a poll mean is decided in watch.py, how many workers an
elastic group asks for in scaling.py, and how a dataset is cut per rank in
data/split.py; this module does what needs Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from raytf._internal.data.split import split_for_ranks
from raytf._internal.driver import cluster, placement
from raytf._internal.driver.actors import kill_and_wait, new_worker, poll_round
from raytf._internal.driver.kept_shards import ShardKeeper
from raytf._internal.driver.preflight import placement_timeout_message
from raytf._internal.driver.scaling import ElasticPolicy
from raytf._internal.driver.topology import assign_ranks, build_tf_config
from raytf._internal.driver.watch import GroupWatch, Milestone
from raytf._internal.protocol import GroupStatus, ResumePoint, RoleSpec, RunSpec, WorkerAddress, WorkerSpec
from raytf.errors import PlacementTimeoutError, WorkerStartError

logger = logging.getLogger(__name__)

_DRAIN_CHECK_INTERVAL_S = 1.0  # how often the driver asks Ray which nodes are draining
# Warm standbys wait for an attempt's first step or report, so that their imports do not slow its
# start; a loop that tells raytf of neither gets them this long after its strategy connected.
_WARM_AFTER_S = 10.0
TRAINING_ROLE = "worker"  # the role whose actors run train_fn and have world ranks


class RayWorkerGroup:
    """One placement group and one actor per bundle, started afresh for every attempt (but see
    warm standbys below).

    With ``warm_standby``, once an attempt trains, each training worker's node also gets a
    standby actor that loads TensorFlow and ``train_fn`` and waits (no CPU or GPU of its own);
    the next attempt hands a bundle on that node to it instead of starting a cold actor. The
    shards the ranks read are kept too (kept_shards.py), and a restart of the same size reads them.
    The placement group is kept across such restarts while its nodes stay (``_reusable``): a new
    one could land on other nodes than the standbys and the kept shards.
    """

    def __init__(
        self,
        run: RunSpec,
        roles: Sequence[RoleSpec],
        *,
        placement_strategy: str,
        elastic: ElasticPolicy,
        datasets: Optional[Mapping[str, Any]] = None,
        worker_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        hang_timeout_s: Optional[float] = None,
        notify: Callable[[str], None] = lambda message: None,
        warm_standby: bool = False,
    ):
        if [r.name for r in roles].count(TRAINING_ROLE) != 1:
            raise ValueError(f"a worker group needs exactly one {TRAINING_ROLE!r} role, got {[r.name for r in roles]}")
        self._run = run
        self._run_ref: Optional[ray.ObjectRef] = None
        self._roles = list(roles)
        self._strategy = placement_strategy
        self._elastic = elastic
        self._datasets = dict(datasets or {})
        self._worker_timeout_s = worker_timeout_s
        self._start_timeout_s = start_timeout_s
        self._hang_timeout_s = hang_timeout_s
        self._notify = notify  # the driver's progress display
        self._pg: Any = None
        self._actors: list = []  # the training role's, by world rank
        self._others: list = []  # other roles' actors
        self._addresses: list[WorkerAddress] = []  # by world rank
        self._in_flight: dict[int, tuple[Any, float]] = {}  # world rank -> (poll ref, sent at)
        self._watch: Optional[GroupWatch] = None
        self._preempt_reason: Optional[str] = None
        self._drain_checked_at = 0.0
        self._began = self._placed = self._actors_up = 0.0  # this attempt's start-up, as it went
        self._startup_sent = False
        self.num_workers = elastic.max_workers  # this attempt's, once placed
        self._warm_standby = warm_standby
        self._standby: list[tuple[str, Any]] = []  # (node id, actor): warm, waiting for a rank
        self._standby_made = False  # for this attempt
        self._standby_count = 0  # names them apart
        self._bundle_gpus: dict[int, tuple[str, ...]] = {}  # bundle index -> its GPUs' ids (standbys take them)
        self._keeper = ShardKeeper(self._datasets, run.split) if warm_standby else None

    def _bundles(self, workers: int) -> list[dict[str, float]]:
        return [dict(role.bundle) for role in self._roles
                for _ in range(workers if role.name == TRAINING_ROLE else role.max_count)]

    def start(self, attempt: int, resume: ResumePoint) -> None:
        self._preempt_reason = None
        self._began = time.monotonic()
        self._startup_sent = False
        try:
            self._place()
            self._placed = time.monotonic()
            self._start_actors(attempt, resume)
        except BaseException:
            self.shutdown()
            raise

    def _place(self) -> None:
        """Place the group; an elastic one takes the largest size the cluster fits, down to its minimum."""
        if self._pg is not None:
            if self._reusable():
                return
            placement.remove(self._pg)
            self._pg = None
        self._bundle_gpus = {}  # a new group's bundles may hold other GPUs
        for workers, timeout in self._elastic.tries():
            self._pg = placement.place(self._bundles(workers), self._strategy, timeout, self._notify)
            if self._pg is not None:
                self.num_workers = workers
                shrunk = self._elastic.shrunk(workers)
                if shrunk:
                    logger.warning("%s", shrunk)
                return
        raise PlacementTimeoutError(placement_timeout_message(
            self._roles[0].bundle, self._elastic.min_workers, self._strategy,
            self._elastic.placement_timeout_s or 0.0, ray.cluster_resources(), ray.available_resources(),
            cluster.live_node_resources(),
        ))

    def _start_actors(self, attempt: int, resume: ResumePoint) -> None:
        actors, index = [], 0
        bundle_nodes = self._bundle_nodes() if self._standby else {}
        reserves = []  # by actor: its reserve() call's arguments
        warm: set[int] = set()  # positions in actors that are warm standbys
        for role in self._roles:
            count = self.num_workers if role.name == TRAINING_ROLE else role.max_count
            for task in range(count):
                gpus = self._bundle_gpus.get(index) if role.bundle.get("GPU") else ()
                standby = None
                if role.name == TRAINING_ROLE and gpus is not None:
                    standby = self._take_standby(bundle_nodes.get(index))
                if standby is not None:
                    # Warm: TensorFlow and train_fn are loaded. It runs on this bundle's node, on the
                    # CPUs and GPUs the bundle holds for it (its GPUs' ids as the bundle's last actor had them).
                    warm.add(len(actors))
                    actors.append((role, task, standby))
                    reserves.append({"gpu_ids": gpus} if gpus else {})
                    index += 1
                    continue
                reserves.append({})
                actors.append((role, task, self._cold_actor(role, attempt, index)))
                index += 1
        self._others = [actor for _, _, actor in actors]  # until ranks are known: all, for shutdown
        timeout = self._start_timeout_s
        addresses = self._reserve(actors, reserves, warm, attempt, timeout)
        self._actors_up = time.monotonic()
        # Bundle i is actors[i]'s; a warm standby handed bundle i later takes these GPUs.
        self._bundle_gpus = {i: address.gpu_ids for i, address in enumerate(addresses) if address.gpu_ids}
        trained = [(a, address) for a, address in zip(actors, addresses) if a[0].name == TRAINING_ROLE]
        ranks = assign_ranks([address for _, address in trained])
        by_rank = sorted(zip(ranks, trained), key=lambda pair: pair[0].world_rank)
        self._actors = [actor for _, ((_, _, actor), _) in by_rank]
        self._addresses = [address for _, (_, address) in by_rank]
        self._others = [actor for (role, _, actor) in actors if role.name != TRAINING_ROLE]
        cluster_spec: dict[str, list[str]] = {TRAINING_ROLE: [a.host_port for a in self._addresses]}
        for (role, task, _), address in zip(actors, addresses):
            if role.name != TRAINING_ROLE:
                cluster_spec.setdefault(role.name, []).append(address.host_port)
        kept = self._keeper.take(len(self._addresses)) if self._keeper is not None else {}
        shards = split_for_ranks(self._datasets, self._run.split, [a.node_id for a in self._addresses], kept)
        starts = []
        if self._run_ref is None:
            self._run_ref = ray.put(self._run)  # train_fn and its config travel once, not once per actor
        for rank, ((role, task, actor), address) in by_rank:
            spec = WorkerSpec(role=role.name, rank=rank, tf_config=build_tf_config(cluster_spec, rank.world_rank),
                              attempt=attempt, resume=resume, datasets=shards[rank.world_rank])
            starts.append(actor.start.remote(self._run_ref, spec, role.payload))
        logger.info("attempt %d: %d workers on %d node(s): %s", attempt, len(self._actors), ranks[0].num_nodes,
                    ", ".join(f"rank {i} {a.host_port}" for i, a in enumerate(self._addresses)))
        ray.get(starts, timeout=timeout)
        self._in_flight = {}
        self._watch = GroupWatch(dict(enumerate(a.node_ip for a in self._addresses)),
                                 start_timeout_s=self._start_timeout_s, worker_timeout_s=self._worker_timeout_s,
                                 hang_timeout_s=self._hang_timeout_s)

    def poll(self) -> GroupStatus:
        """Collect what every worker has to say, without waiting on any one of them (poll_round):
        a worker that does not answer for ``worker_timeout_s`` is lost; the others' reports keep
        flowing meanwhile."""
        watch = self._watch
        now = poll_round(self._actors, self._in_flight, watch)
        for reason in watch.preempt_reasons:
            if self._preempt_reason is None:
                self._request_preemption(reason)
        self._watch_drains(now)
        status = watch.round(self._preempt_reason)
        if not self._startup_sent and Milestone.CONNECTED in watch.reached and (
                watch.trained_since() is not None or status.finished):
            self._startup_sent = True
            status = dataclasses.replace(status, startup=watch.startup(self._began, self._placed, self._actors_up))
        if self._warm_standby and not self._standby_made and not status.finished and self._trains(watch):
            self._prepare_warm_restart()
        return status

    def _trains(self, watch: GroupWatch) -> bool:
        """The attempt is past its start: its first step or report, or (a loop that tells raytf of
        neither) connected for a while."""
        connected = watch.reached.get(Milestone.CONNECTED)
        return self._startup_sent or (connected is not None and time.monotonic() - connected > _WARM_AFTER_S)

    def _prepare_warm_restart(self) -> None:
        """Once this attempt trains (so none of this slows its start): keep the shards its ranks
        read, and start one warm standby per training worker on its node, less those still
        waiting from before."""
        self._standby_made = True
        if self._keeper is not None:
            self._keeper.ask(self._actors, [a.node_id for a in self._addresses])
        waiting: dict[str, int] = {}
        for node, _ in self._standby:
            waiting[node] = waiting.get(node, 0) + 1
        for address in self._addresses:
            if waiting.get(address.node_id, 0) > 0:
                waiting[address.node_id] -= 1
                continue
            self._standby_count += 1
            actor = new_worker(
                self._run.run_name, f"raytf:{self._run.run_name}:standby:{self._standby_count}",
                num_cpus=0, num_gpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(address.node_id, soft=False),
            )
            actor.warm.remote(self._run_ref)  # not waited on: a restart's reserve() queues behind it
            self._standby.append((address.node_id, actor))

    def _reusable(self) -> bool:
        """The last attempt's placement group can hold this one: it is placed, on live nodes none of
        which is draining, and it is as large as the group may be (an elastic group that shrank
        tries to grow back with a new one)."""
        table = ray.util.placement_group_table(self._pg)
        nodes = set((table.get("bundles_to_node_id") or {}).values())
        return (table.get("state") == "CREATED" and self.num_workers == self._elastic.max_workers
                and bool(nodes) and nodes <= cluster.live_node_ids() and not nodes & set(cluster.draining_nodes()))

    def _cold_actor(self, role: RoleSpec, attempt: int, index: int) -> Any:
        """A new actor for bundle ``index``, which loads TensorFlow and train_fn when it starts."""
        return new_worker(
            self._run.run_name, f"raytf:{self._run.run_name}:{attempt}:{index}",
            num_cpus=role.bundle.get("CPU", 0), num_gpus=role.bundle.get("GPU", 0),
            resources={k: v for k, v in role.bundle.items() if k not in ("CPU", "GPU")}, max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=self._pg,
                                                                 placement_group_bundle_index=index),
        )

    def _reserve(self, actors: list, reserves: list[dict], warm: set[int], attempt: int,
                 timeout: float) -> list[WorkerAddress]:
        """Each actor's address, once it reserved its port. A warm standby that turns out dead (a
        node's OOM killer, a stray ``ray.kill``) is replaced by a cold actor for its bundle; it
        costs a slower start, never the attempt. A started actor that dies is a WorkerStartError."""
        deadline = time.monotonic() + timeout
        pending = {actor.reserve.remote(**kw): i for i, ((_, _, actor), kw) in enumerate(zip(actors, reserves))}
        addresses: list[Any] = [None] * len(actors)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                raise WorkerStartError(
                    f"worker actors did not start within {timeout:g} s (FailureConfig.start_timeout_s); "
                    "check the actors' logs for import errors or a slow runtime environment"
                )
            i = pending.pop(ready[0])
            try:
                addresses[i] = ray.get(ready[0])
            except RayActorError as error:
                if i not in warm:
                    raise WorkerStartError(f"a worker actor died while starting: {error}") from None
                warm.discard(i)
                role, task, _ = actors[i]
                logger.warning("attempt %d: the warm standby for bundle %d is dead; starting a new worker there "
                               "instead", attempt, i)
                replacement = self._cold_actor(role, attempt, i)
                actors[i] = (role, task, replacement)
                self._others = [actor for _, _, actor in actors]
                pending[replacement.reserve.remote(**{k: v for k, v in reserves[i].items() if k != "gpu_ids"})] = i
            except RayTaskError as error:  # a warm standby that could not take its bundle's GPUs
                raise WorkerStartError(f"a worker actor could not start: {error.cause}") from None
        return addresses

    def _bundle_nodes(self) -> dict[int, str]:
        """Bundle index -> the id of the node it was placed on."""
        table = ray.util.placement_group_table(self._pg)
        return {int(i): node for i, node in (table.get("bundles_to_node_id") or {}).items()}

    def _take_standby(self, node_id: Optional[str]) -> Any:
        for i, (node, actor) in enumerate(self._standby):
            if node == node_id:
                del self._standby[i]
                return actor
        return None

    def connect(self) -> None:
        """Release the start barrier: every worker is ready, so all build the strategy together."""
        if self._watch is not None:
            self._watch.released = True
        for actor in self._actors:
            actor.connect.remote()

    def _watch_drains(self, now: float) -> None:
        if self._preempt_reason is not None or now - self._drain_checked_at < _DRAIN_CHECK_INTERVAL_S:
            return
        self._drain_checked_at = now
        draining = cluster.draining_nodes()
        for rank, address in enumerate(self._addresses):
            if address.node_id in draining:
                deadline_ms = draining[address.node_id]
                left = f"; it goes in {max(0.0, deadline_ms / 1000 - time.time()):.0f} s" if deadline_ms else ""
                self._request_preemption(f"node {address.node_ip} of rank {rank} is draining{left}")
                return

    def _request_preemption(self, reason: str) -> None:
        """Tell every worker, so ``raytf.preemption_requested()`` agrees at once everywhere."""
        logger.warning("preemption: %s; asking the workers to checkpoint and stop", reason)
        self._preempt_reason = reason
        for actor in self._actors:
            actor.preempt.remote(reason)

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None:
        self._actors[rank].acknowledge.remote(seq, error)

    def can_replace(self, failure: Any) -> bool:
        """MultiWorkerMirroredStrategy cannot lose a member: a loss restarts the group."""
        return False

    def replace(self, failure: Any) -> None:
        raise NotImplementedError("a synchronous group restarts; it replaces no worker in place")

    def close(self) -> None:
        """The run is over: shut the group down, kill the standbys and remove the placement group."""
        standby, self._standby = [actor for _, actor in self._standby], []
        for actor in standby:
            ray.kill(actor, no_restart=True)
        self.shutdown()
        placement.remove(self._pg)
        self._pg = None
        if self._keeper is not None:
            self._keeper.clear()

    def shutdown(self) -> None:
        """Kill every actor of this attempt, wait until they are gone, and remove the placement
        group. With warm standbys, the standbys and the placement group stay, for the next attempt
        (close() ends them)."""
        self._standby_made = False
        actors, self._actors, self._others = self._actors + self._others, [], []
        self._in_flight, self._watch = {}, None
        kill_and_wait(actors, "worker")
        if not self._warm_standby:
            placement.remove(self._pg)
            self._pg = None

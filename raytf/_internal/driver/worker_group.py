"""The Ray side of a worker group: placement group, actors, ranks, polling, teardown."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytf._internal.driver import cluster as _autoscaler
from raytf._internal import env as _env
from raytf._internal.driver.preflight import placement_timeout_message
from raytf._internal.driver.hang import blame_collective, find_hangs
from raytf._internal.protocol import Activity, GroupStatus, Progress, Report
from raytf._internal.driver.topology import WorkerAddress, assign_ranks, build_tf_config, worker_list
from raytf._internal.worker.actor import TrainWorker, WorkerSpec
from raytf.config import ScalingConfig, TensorflowConfig
from raytf.errors import PlacementTimeoutError, WorkerFailure, WorkerStartError

logger = logging.getLogger(__name__)

_RemoteTrainWorker = ray.remote(TrainWorker)
_POLL_WAIT_S = 0.05  # how long one poll waits for answers before returning what it has
_DRAIN_CHECK_INTERVAL_S = 1.0  # how often the driver asks Ray which nodes are draining
_SHRINK_TRY_S = 5.0  # elastic: how long each smaller group gets to be placed
_PLACE_STEP_S = 1.0  # placement: how often to look at the autoscaler while waiting
_PLACE_NOTE_INTERVAL_S = 30.0  # placement: how often to say that it still waits
_PHASE_ORDER = ("created", "starting", "ready", "connecting")  # before a worker has joined the group


def live_node_resources() -> list[dict[str, float]]:
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch, 0 for none) of every node Ray is draining.

    Autoscalers and spot-instance handlers drain a node before taking it away
    (``ray drain-node``, autoscaler v2, KubeRay). Ray has no public API for
    this yet, so a Ray without it reads as "nothing draining".
    """
    try:
        from ray._private.state import state

        return dict(state.get_draining_nodes())
    except Exception:  # noqa: BLE001 - an optional signal; training goes on without it
        return {}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class RayWorkerGroup:
    """One placement group and one actor per worker, started afresh for every attempt."""

    def __init__(
        self,
        scaling: ScalingConfig,
        tensorflow: TensorflowConfig,
        payload: bytes,
        run_name: str,
        run_path: str,
        datasets: Optional[dict[str, Any]] = None,
        split: frozenset[str] = frozenset(),
        resume_point: Optional[Callable[[], tuple[Optional[dict[str, Any]], int]]] = None,
        storage: Any = None,
        worker_timeout_s: float = 30.0,
        start_timeout_s: float = 120.0,
        checkpoint_every: Optional[tuple[str, int]] = None,
        lease_token: Optional[str] = None,
        hang_timeout_s: Optional[float] = None,
        notify: Callable[[str], None] = lambda message: None,
    ):
        self._scaling = scaling
        self._tensorflow = tensorflow
        self._communication = tensorflow.resolve_communication(scaling)
        self._payload = payload
        self._payload_ref: Optional[ray.ObjectRef] = None
        self._run_name = run_name
        self._run_path = run_path
        self._datasets = dict(datasets or {})
        self._split = split
        self._resume_point = resume_point or (lambda: (None, 0))
        self._storage = storage
        self._pg: Optional[PlacementGroup] = None
        self._actors: list = []
        self._addresses: list[WorkerAddress] = []
        self._world_ranks: list[int] = []
        self._in_flight: dict[int, tuple[Any, float]] = {}  # actor index -> (poll ref, sent at)
        self._phases: dict[int, str] = {}  # world rank -> last phase heard
        self._worker_timeout_s = worker_timeout_s
        self._start_timeout_s = start_timeout_s
        self._checkpoint_every = checkpoint_every
        self._lease_token = lease_token
        self._hang_timeout_s = hang_timeout_s
        self._notify = notify  # the driver's progress display
        self._activities: dict[int, tuple[Activity, float]] = {}  # world rank -> (last activity, heard at)
        self._progress: Optional[Progress] = None  # rank 0's, as last heard
        self.num_workers = scaling.max_workers  # this attempt's, once placed
        self._started_at: Optional[float] = None
        self._preempt_reason: Optional[str] = None
        self._drain_checked_at = 0.0
        self._connected = False

    @property
    def placement_group(self) -> Optional[PlacementGroup]:
        return self._pg

    def start(self, attempt: int) -> None:
        self._preempt_reason = None
        self._started_at = None
        self._connected = False
        try:
            self._place()
            self._start_actors(attempt)
        except BaseException:
            self.shutdown()
            raise
        self._started_at = time.monotonic()

    def _try_place(self, workers: int, timeout: Optional[float]) -> bool:
        """Place ``workers`` bundles within ``timeout`` seconds, not counting time in which
        the autoscaler is launching nodes (a cloud GPU node takes minutes to come up)."""
        scaling = self._scaling
        self._pg = placement_group([scaling.bundle()] * workers, strategy=scaling.placement)
        waited, said, said_at = 0.0, "", 0.0
        while not self._pg.wait(_PLACE_STEP_S):
            launching = _autoscaler.launching()
            if not launching:
                waited += _PLACE_STEP_S
            message = (f"waiting for room for {workers} x {scaling.bundle()}: the autoscaler is launching "
                       + ", ".join(f"{n} x {t}" for t, n in sorted(launching.items()))) if launching else (
                       f"waiting for room for {workers} x {scaling.bundle()} ({waited:.0f} s of "
                       f"ScalingConfig.placement_timeout_s={timeout if timeout is not None else 'None'})")
            now = time.monotonic()
            if message.split(" (")[0] != said.split(" (")[0] or now - said_at >= _PLACE_NOTE_INTERVAL_S:
                self._notify(message)
                said, said_at = message, now
            if timeout is not None and waited >= timeout:
                remove_placement_group(self._pg)
                self._pg = None
                return False
        self.num_workers = workers
        return True

    def _place(self) -> None:
        """Place ``max`` workers; an elastic group that cannot have them within
        ``resize_timeout_s`` takes the largest size that fits, down to ``min``."""
        scaling = self._scaling
        high, low = scaling.max_workers, scaling.min_workers
        if not scaling.elastic:
            if self._try_place(high, scaling.placement_timeout_s):
                return
        else:
            if self._try_place(high, scaling.resize_timeout_s):
                return
            for workers in range(high - 1, low - 1, -1):
                timeout = scaling.placement_timeout_s if workers == low else _SHRINK_TRY_S
                if self._try_place(workers, timeout):
                    logger.warning(
                        "%d workers could not be placed within %g s (ScalingConfig.resize_timeout_s); "
                        "training with %d", high, scaling.resize_timeout_s, workers,
                    )
                    return
        raise PlacementTimeoutError(
            placement_timeout_message(
                scaling.bundle(),
                low,
                scaling.placement,
                scaling.placement_timeout_s or 0.0,
                ray.cluster_resources(),
                ray.available_resources(),
                live_node_resources(),
            )
        )

    def _start_actors(self, attempt: int) -> None:
        scaling, tensorflow = self._scaling, self._tensorflow
        custom = {k: v for k, v in scaling.bundle().items() if k not in ("CPU", "GPU")}
        self._actors = [
            _RemoteTrainWorker.options(
                # Named for the dashboard and `ray.get_actor`; a second driver running the
                # same run at the same time fails here instead of sharing its checkpoints.
                name=f"raytf:{self._run_name}:{attempt}:{index}",
                num_cpus=scaling.cpus_per_worker,
                num_gpus=scaling.gpus_per_worker,
                resources=custom,
                max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=index
                ),
            ).remote()
            for index in range(self.num_workers)
        ]
        timeout = self._start_timeout_s
        try:
            self._addresses = ray.get([a.reserve.remote() for a in self._actors], timeout=timeout)
        except GetTimeoutError:
            raise WorkerStartError(
                f"worker actors did not start within {timeout:g} s (FailureConfig.start_timeout_s); "
                "check the actors' logs for import errors or a slow runtime environment"
            ) from None
        except RayActorError as error:
            raise WorkerStartError(f"a worker actor died while starting: {error}") from None

        ranks = assign_ranks(self._addresses)
        workers = worker_list(self._addresses, ranks)
        self._world_ranks = [r.world_rank for r in ranks]
        intra, inter = tensorflow.threads(scaling)
        resume, next_seq = self._resume_point()
        by_rank = sorted(zip(ranks, self._addresses), key=lambda pair: pair[0].world_rank)
        shards = self._shard_datasets([address for _, address in by_rank])
        specs = [
            WorkerSpec(
                rank=rank,
                tf_config=build_tf_config(workers, rank.world_rank),
                attempt=attempt,
                run_name=self._run_name,
                run_path=self._run_path,
                communication=self._communication,
                collective_timeout_s=tensorflow.collective_timeout_s,
                intra_op_threads=intra,
                inter_op_threads=inter,
                use_gpu=scaling.use_gpu,
                gpu_memory_growth=tensorflow.gpu_memory_growth,
                env=dict(tensorflow.worker_env),
                datasets=shards[rank.world_rank],
                resume=resume,
                next_checkpoint_seq=next_seq,
                storage=self._storage,
                checkpoint_every=self._checkpoint_every,
                lease_token=self._lease_token,
                split=tuple(sorted(self._split)),
                keras=tensorflow.keras,
                mixed_precision=tensorflow.mixed_precision,
                log_level=tensorflow.log_level,
            )
            for rank in ranks
        ]
        logger.info(
            "attempt %d: %d workers on %d node(s): %s",
            attempt,
            len(workers),
            ranks[0].num_nodes,
            ", ".join(f"rank {i} {w}" for i, w in enumerate(workers)),
        )
        if self._payload_ref is None:
            self._payload_ref = ray.put(self._payload)
        ray.get(
            [a.start.remote(s, self._payload_ref) for a, s in zip(self._actors, specs)],
            timeout=timeout,
        )

    def _shard_datasets(self, by_rank: list[WorkerAddress]) -> list[dict[str, Any]]:
        """Per world rank, an iterator for each dataset: its equal split, or the whole dataset.

        Splits are made afresh for every attempt, with each rank's node as its
        locality hint, so a restarted group never reads from a dead split.
        """
        shards: list[dict[str, Any]] = [{} for _ in by_rank]
        for name, dataset in self._datasets.items():
            if name in self._split:
                iterators = dataset.streaming_split(
                    len(by_rank), equal=True, locality_hints=[a.node_id for a in by_rank]
                )
            else:
                iterators = [dataset.iterator() for _ in by_rank]
            for rank, iterator in enumerate(iterators):
                shards[rank][name] = iterator
        return shards

    def poll(self) -> GroupStatus:
        """Collect what every worker has to say, without waiting on any one of them.

        Each actor has at most one poll in flight. A poll that has not come
        back after ``worker_timeout_s`` makes that worker lost; the others'
        reports keep flowing meanwhile.
        """
        now = time.monotonic()
        for index, actor in enumerate(self._actors):
            if index not in self._in_flight:
                self._in_flight[index] = (actor.poll.remote(), now)
        refs = [ref for ref, _ in self._in_flight.values()]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_POLL_WAIT_S)
        ready_set = set(ready)
        reports: list[Report] = []
        failures: list[WorkerFailure] = []
        for index, (ref, sent) in list(self._in_flight.items()):
            rank = self._world_ranks[index]
            node_ip = self._addresses[index].node_ip
            if ref not in ready_set:
                if now - sent > self._worker_timeout_s:
                    failures.append(WorkerFailure(
                        rank=rank, kind="unresponsive", error_type="WorkerTimeout",
                        message=f"no answer to the driver for {self._worker_timeout_s:g} s "
                                "(FailureConfig.worker_timeout_s)",
                        traceback="", time=time.time(), node_ip=node_ip,
                    ))
                    self._phases[rank] = "lost"
                continue
            del self._in_flight[index]
            try:
                status = ray.get(ref)
            except RayActorError as error:
                failures.append(WorkerFailure(
                    rank=rank, kind="died", error_type=type(error).__name__,
                    message=_first_line(error), traceback="", time=time.time(), node_ip=node_ip,
                ))
                self._phases[rank] = "lost"
                continue
            reports.extend(status.reports)
            self._phases[rank] = status.phase
            if rank == 0 and status.progress is not None:
                self._progress = status.progress
            if status.activity is not None:
                self._activities[rank] = (status.activity, now)
            if status.failure is not None:
                failures.append(status.failure)
                if status.failure.kind == "collective":  # a peer that stopped taking part is the cause
                    failures.extend(blame_collective(status.failure, self._activities_now(now), self._node_ips()))
            if status.preempt_reason and self._preempt_reason is None:
                self._request_preemption(f"rank {rank}: {status.preempt_reason}")
        failures.extend(self._not_joined(now))
        if not failures:
            failures.extend(find_hangs(self._activities_now(now), self._hang_timeout_s, self._node_ips()))
        self._watch_drains(now)
        if not self._connected and len(self._phases) == len(self._actors) and all(
            p not in ("created", "starting") for p in self._phases.values()
        ):
            self._connected = True
            for actor in self._actors:
                actor.connect.remote()
        reports.sort(key=lambda r: (r.time, r.rank, r.seq))
        phases = dict(self._phases)
        done = len(phases) == len(self._actors)
        finished = done and all(p == "finished" for p in phases.values())
        stopped = done and all(p in ("finished", "preempted") for p in phases.values()) and not finished
        return GroupStatus(
            tuple(reports), tuple(failures), finished, phases,
            preempting=self._preempt_reason is not None, preempt_reason=self._preempt_reason,
            stopped=stopped, progress=self._progress,
        )

    def _activities_now(self, now: float) -> dict[int, Activity]:
        """Each rank's last activity, aged by the time since it was heard."""
        return {
            rank: Activity(a.kind, a.seconds + (now - heard), a.where)
            for rank, (a, heard) in self._activities.items()
        }

    def _node_ips(self) -> dict[int, str]:
        return {rank: address.node_ip for rank, address in zip(self._world_ranks, self._addresses)}

    def _not_joined(self, now: float) -> list[WorkerFailure]:
        """After start_timeout_s, the workers furthest from joining the group (a peer that never arrives)."""
        if self._started_at is None or now - self._started_at <= self._start_timeout_s:
            return []
        behind = {r: p for r, p in self._phases.items() if p in _PHASE_ORDER}
        if not behind:
            self._started_at = None  # everyone joined: stop checking
            return []
        slowest = min(_PHASE_ORDER.index(p) for p in behind.values())
        return [
            WorkerFailure(
                rank=rank, kind="not_started", error_type="StartTimeout",
                message=f"did not join the worker group within {self._start_timeout_s:g} s "
                        f"(FailureConfig.start_timeout_s); it was still {phase} "
                        + {"starting": "(loading train_fn and its modules, importing TensorFlow)",
                           "ready": "(waiting for the others)"}.get(phase, "(connecting to its peers)"),
                traceback="", time=time.time(), node_ip=self._addresses[self._world_ranks.index(rank)].node_ip,
            )
            for rank, phase in sorted(behind.items())
            if _PHASE_ORDER.index(phase) == slowest
        ]

    def _watch_drains(self, now: float) -> None:
        if self._preempt_reason is not None or now - self._drain_checked_at < _DRAIN_CHECK_INTERVAL_S:
            return
        self._drain_checked_at = now
        draining = draining_nodes()
        for rank, address in sorted(zip(self._world_ranks, self._addresses)):
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
        actor = self._actors[self._world_ranks.index(rank)]
        actor.acknowledge.remote(seq, error)

    def shutdown(self) -> None:
        """Kill every actor, wait until they are gone, and remove the placement group."""
        actors, self._actors = self._actors, []
        self._in_flight, self._phases, self._activities, self._progress = {}, {}, {}, None
        self._started_at = None
        for actor in actors:
            ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + _env.get_float(_env.SHUTDOWN_TIMEOUT_S)
        for actor in actors:
            try:
                ray.get(actor.poll.remote(), timeout=max(0.1, deadline - time.monotonic()))
            except RayActorError:
                pass  # gone, as asked
            except GetTimeoutError:
                logger.warning("a killed worker actor is still alive after the shutdown timeout")
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None

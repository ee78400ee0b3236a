"""The Ray side of a worker group: placement group, actors, ranks, polling, teardown."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytf import _env
from raytf._placement import placement_timeout_message
from raytf._status import GroupStatus, Report
from raytf._topology import WorkerAddress, assign_ranks, build_tf_config, worker_list
from raytf._worker import TrainWorker, WorkerSpec
from raytf.config import ScalingConfig, TensorflowConfig
from raytf.errors import PlacementTimeoutError, WorkerFailure, WorkerStartError

logger = logging.getLogger(__name__)

_RemoteTrainWorker = ray.remote(TrainWorker)
_POLL_WAIT_S = 0.05  # how long one poll waits for answers before returning what it has


def live_node_resources() -> list[dict[str, float]]:
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


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

    @property
    def placement_group(self) -> Optional[PlacementGroup]:
        return self._pg

    def start(self, attempt: int) -> None:
        try:
            self._place()
            self._start_actors(attempt)
        except BaseException:
            self.shutdown()
            raise

    def _place(self) -> None:
        scaling = self._scaling
        bundle = scaling.bundle()
        self._pg = placement_group([bundle] * scaling.num_workers, strategy=scaling.placement)
        try:
            ray.get(self._pg.ready(), timeout=scaling.placement_timeout_s)
        except GetTimeoutError:
            raise PlacementTimeoutError(
                placement_timeout_message(
                    bundle,
                    scaling.num_workers,
                    scaling.placement,
                    scaling.placement_timeout_s or 0.0,
                    ray.cluster_resources(),
                    ray.available_resources(),
                    live_node_resources(),
                )
            ) from None

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
            for index in range(scaling.num_workers)
        ]
        timeout = _env.get_float(_env.WORKER_START_TIMEOUT_S)
        try:
            self._addresses = ray.get([a.reserve.remote() for a in self._actors], timeout=timeout)
        except GetTimeoutError:
            raise WorkerStartError(
                f"worker actors did not start within {timeout:g} s ({_env.WORKER_START_TIMEOUT_S}); "
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
            if status.failure is not None:
                failures.append(status.failure)
        reports.sort(key=lambda r: (r.time, r.rank, r.seq))
        phases = dict(self._phases)
        finished = len(phases) == len(self._actors) and all(p == "finished" for p in phases.values())
        return GroupStatus(tuple(reports), tuple(failures), finished, phases)

    def acknowledge(self, rank: int, seq: int, error: Optional[str]) -> None:
        actor = self._actors[self._world_ranks.index(rank)]
        actor.acknowledge.remote(seq, error)

    def shutdown(self) -> None:
        """Kill every actor, wait until they are gone, and remove the placement group."""
        actors, self._actors = self._actors, []
        self._in_flight, self._phases = {}, {}
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

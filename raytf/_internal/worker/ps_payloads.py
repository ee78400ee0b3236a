"""What a parameter-server group's actors run (payloads.py's :class:`Host` gives each its actor):
the chief's ``train_fn`` with ParameterServerStrategy and its ClusterCoordinator, a worker's or
a parameter server's TensorFlow server, which waits, and the sidecar evaluator."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Optional

from raytf._internal import env as _env
from raytf._internal import hooks as _hooks
from raytf._internal.protocol import CoordinatorHeld, Phase, Report, RunSpec, TrainContext, UserCode, WorkerSpec
from raytf._internal.worker import activity as _activity
from raytf._internal.worker import session as _session
from raytf._internal.worker import tensorflow as _tensorflow
from raytf._internal.worker.loading import paused_collector
from raytf._internal.worker.payloads import Host, new_session, user_code
from raytf._internal.worker.session import WorkerSession
from raytf.errors import ConfigError


def _load(run: RunSpec, spec: WorkerSpec, host: Host) -> UserCode:
    """Set a parameter-server actor's environment, load its user code, set TensorFlow up."""
    os.environ.update(_tensorflow.worker_environment(run, spec))
    # A call to a worker or ps that is down fails at once, so the coordinator can reschedule it.
    os.environ[_env.GRPC_FAIL_FAST] = "use_caller"
    _tensorflow.check_storage_visible(run, host.node_ip)
    with paused_collector():
        code = user_code(run)
        _activity.note_user_code(code.train_fn)
        _tensorflow.configure_tensorflow(run)
        _tensorflow.configure_keras(run)
    _hooks.require(
        *_hooks.needed(
            keras3=False,
            tf_keras="tf_keras" in sys.modules,
            compression=False,
            gpu=run.tensorflow.use_gpu,
            parameter_server=True,
        )
    )
    return code


def ps_context(run: RunSpec, spec: WorkerSpec) -> TrainContext:
    return TrainContext(
        **asdict(spec.rank),
        attempt=spec.attempt,
        run_name=run.run_name,
        run_path=run.run_path,
        tf_config=spec.tf_config,
        task_type=spec.ps_task.type,
        task_index=spec.ps_task.index,
    )


class ChiefPayload:
    """The parameter-server chief: ``train_fn(config)`` with ParameterServerStrategy and its
    ClusterCoordinator, once every worker and ps serves."""

    _clock = staticmethod(time.monotonic)

    def __init__(self) -> None:
        self.session: Optional[WorkerSession] = None
        self._coordinator: Any = None
        self._ended = 0  # the coordinator's scheduled functions that ended (TensorFlow's threads count them)
        self._ended_seen = 0
        self._reconnecting_since: Optional[float] = None
        self._idle_since: Optional[float] = None  # functions pending and none ended since

    @property
    def preempted(self) -> bool:
        return self.session is not None and self.session.preempted

    def coordinator_held(self) -> Optional[CoordinatorHeld]:
        """How long the coordinator has been held, as seen at each poll (the driver ends a hold that
        outlasts FailureConfig.hang_timeout_s): reconnecting to the cluster (TensorFlow redials a
        lost task's address with no timeout), or holding scheduled functions of which none ends (a
        step waiting on a peer that will never answer); None while neither."""
        if self._coordinator is None:
            return None
        from raytf._internal.hooks import tensorflow as tf_hooks

        now = self._clock()
        if not tf_hooks.coordinator_recovering(self._coordinator):
            self._reconnecting_since = None
        elif self._reconnecting_since is None:
            self._reconnecting_since = now
        pending, ended = tf_hooks.closures_pending(self._coordinator), self._ended
        moved, self._ended_seen = ended != self._ended_seen, ended
        if not pending or not ended:  # none ended yet: the first step may still compile
            self._idle_since = None
        elif moved or self._idle_since is None:
            self._idle_since = now
        holds = [
            (now - since, why)
            for since, why in (
                (self._reconnecting_since, "reconnecting to the cluster after a step failed on a lost task"),
                (
                    None if moved else self._idle_since,
                    f"holding {pending} scheduled function(s) of which none has ended",
                ),
            )
            if since is not None
        ]
        return CoordinatorHeld(*max(holds, key=lambda hold: hold[0])) if holds else None

    def _closure_ended(self) -> None:
        self._ended += 1  # a lost update between threads still changes it, all coordinator_held asks

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        from raytf._internal.worker import ps as _ps

        code = _load(run, spec, host)
        host.set_phase(Phase.READY)
        shard_files = host.wait_for_go()  # every worker's manifest, by task index
        host.set_phase(Phase.CONNECTING)
        host.release_port()
        from raytf._internal.data import ps_positions

        ps_positions.hold_updates = code.hold_updates
        strategy, coordinator = _ps.make_strategy(code.variable_partitioner)
        from raytf._internal.hooks import tensorflow as tf_hooks

        tf_hooks.count_closures_ended(coordinator, self._closure_ended)
        self._coordinator = coordinator
        _ps.install(strategy)
        parameter_server = PsData(self._coordinator, list(shard_files or []))
        self.session = new_session(
            run, spec, host, ps_context(run, spec), strategy, {}, parameter_server=parameter_server
        )
        _session.install(self.session)
        host.set_phase(Phase.TRAINING)
        _tensorflow.call_train_fn(code.train_fn, code.config)
        self.session.finish_uploads()

    def retarget(self, task_type: str, task_index: int, host_port: str) -> bool:
        """A replaced task listens at ``host_port``: tell the coordinator, or, before the strategy
        exists, the TF_CONFIG it will be built from. False where the coordinator already redials
        the old address (worker/ps.py)."""
        from raytf._internal.worker import ps as _ps

        if self._coordinator is not None:
            return _ps.retarget(self._coordinator, task_type, task_index, host_port)
        tf_config = json.loads(os.environ["TF_CONFIG"])
        tf_config["cluster"][task_type][task_index] = host_port
        os.environ["TF_CONFIG"] = json.dumps(tf_config, sort_keys=True)
        return True


class PsData:
    """What a parameter-server chief's session needs for ``get_dataset_shard``."""

    def __init__(self, coordinator: Any, shard_files: list[Any]):
        self.coordinator = coordinator
        self.shard_files = shard_files  # by worker task index: dataset -> column -> ColumnFiles


class ServerPayload:
    """A parameter-server worker or ps: TensorFlow's server, serving until the group ends. A
    worker first writes its pieces of the datasets to files on its node for the chief's pipelines.
    A worker's server may outlive the attempt and serve the next one's chief (driver/survivors.py):
    its start and connect calls then find it serving, and its files written."""

    session = None
    serves = True  # kept across a restart as it is (Actor.recycle)

    def __init__(self) -> None:
        self.shard_files: Any = None
        self._writer: Any = None
        self._stop = threading.Event()

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        from raytf._internal.data.worker_files import ShardFileWriter, shard_directory
        from raytf._internal.worker import ps as _ps

        _load(run, spec, host)
        if spec.ps_task.type == "worker":
            self._writer = ShardFileWriter(shard_directory(run, spec.ps_task.index))
            self.shard_files = self._writer.write(spec.datasets)
        host.release_port()
        self._server = _ps.start_server(spec.ps_task.type, spec.ps_task.index)
        host.set_phase(Phase.TRAINING)
        self._stop.wait()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class EvaluatorPayload:
    """The sidecar evaluator: ``evaluate_fn(checkpoint, config)`` on each checkpoint the driver
    commits, newest first when it falls behind, its metrics reported beside training's."""

    session = None
    poll_interval_s = 1.0

    def __init__(self) -> None:
        self._finish = threading.Event()
        self._seq = 0

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        from raytf._internal.checkpoint.manager import CheckpointManager

        code = _load(run, spec, host)
        evaluate_fn, config = code.evaluate_fn, code.config
        context = ps_context(run, spec)
        host.set_phase(Phase.TRAINING)
        done: Optional[str] = None
        while True:
            finishing = self._finish.is_set()
            manager = CheckpointManager(run.store.filesystem, run.store.root)
            latest = manager.latest()
            if latest is not None and latest[0].name != done:
                entry, checkpoint = latest
                metrics = evaluate_fn(checkpoint, config)
                if not isinstance(metrics, dict):
                    raise ConfigError(
                        f"ParameterServerTrainer(evaluate_fn=...) must return a dict of metrics, "
                        f"got {type(metrics).__name__}"
                    )
                clean = {k: _session.to_plain(v, k) for k, v in metrics.items()}
                clean.update({"evaluated_checkpoint": entry.name, "epoch": entry.epoch, "step": entry.step})
                host.sink(
                    Report(
                        rank=context.world_rank,
                        seq=self._seq,
                        metrics={k: v for k, v in clean.items() if v is not None},
                        time=time.time(),
                        attempt=spec.attempt,
                    )
                )
                self._seq += 1
                done = entry.name
                continue
            if finishing:
                return
            self._finish.wait(self.poll_interval_s)

    def finish(self) -> None:
        self._finish.set()

"""What an actor runs, one class per :class:`~raytf._internal.protocol.PayloadKind`.

The actor (actor.py) holds the port, answers polls and keeps the phase; a payload does the role's
work in the actor's worker thread and moves the phase forward through the :class:`Host` it is
given: ``train_fn`` under MultiWorkerMirroredStrategy, a parameter-server role (chief, worker, a
TensorFlow server that waits, evaluator), or a subprocess that reads TF_CONFIG (``raytf launch``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Optional, Protocol

import pyarrow.fs as pafs
from ray import cloudpickle

from raytf._internal import env as _env
from raytf._internal import hooks as _hooks
from raytf._internal.protocol import (
    CoordinatorHeld,
    Phase,
    PayloadKind,
    Report,
    RunSpec,
    TrainContext,
    UserCode,
    WorkerSpec,
)
from raytf._internal.worker import activity as _activity
from raytf._internal.worker import compression as _compression
from raytf._internal.worker import session as _session
from raytf._internal.worker import strategy as _strategy
from raytf._internal.worker import tensorflow as _tensorflow
from raytf._internal.worker.loading import paused_collector
from raytf._internal.worker.session import WorkerSession
from raytf.errors import ConfigError, FailureKind

logger = logging.getLogger(__name__)


class Host(Protocol):
    """What a payload may ask of its actor."""

    node_ip: str

    def set_phase(self, phase: Phase) -> None: ...
    def wait_for_go(self) -> Any: ...  # every peer is ready; returns what the driver sent with the go
    def release_port(self) -> None: ...  # just before TensorFlow's server binds it
    def sink(self, report: Report) -> None: ...
    def preempt_requested(self) -> bool: ...
    def halted(self) -> bool: ...  # the run or attempt is stopping: no further report


class TrainFnPayload:
    """``train_fn(config)`` in the worker thread, under this group's MultiWorkerMirroredStrategy."""

    def __init__(self) -> None:
        self.session: Optional[WorkerSession] = None

    @property
    def preempted(self) -> bool:
        return self.session is not None and self.session.preempted

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        if "tensorflow" in sys.modules and not getattr(host, "warmed", False):
            logger.warning(
                "TensorFlow was imported in this worker before raytf set TF_CONFIG and the thread "
                "settings; import it inside train_fn, not at the top of a module the worker loads first"
            )
        os.environ.update(_tensorflow.worker_environment(run, spec))
        _tensorflow.check_storage_visible(run, host.node_ip)
        with paused_collector():  # loading.py; the payload's modules may import TensorFlow, or raytf does
            code = user_code(run)
            _activity.note_user_code(code.train_fn)
            _tensorflow.configure_tensorflow(run)
            keras3 = _tensorflow.load_keras(run)  # before the barrier: importing Keras takes a second
        _hooks.require(
            *_hooks.needed(
                keras3=keras3,
                tf_keras="tf_keras" in sys.modules,
                compression=run.tensorflow.gradient_compression is not None,
                gpu=run.tensorflow.use_gpu,
                parameter_server=False,
            )
        )
        host.set_phase(Phase.READY)
        host.wait_for_go()
        if host.halted():  # the attempt ended before its start barrier (a process kept: actor.recycle)
            return
        host.set_phase(Phase.CONNECTING)
        host.release_port()
        _strategy.wait_for_leader(spec.tf_config)
        strategy = _strategy.make_strategy(
            run.tensorflow.communication, run.tensorflow.collective_timeout_s, run.tensorflow.bytes_per_pack
        )
        _strategy.install(strategy)
        _compression.install(run.tensorflow.gradient_compression, run.tensorflow.error_feedback)
        for plugin in _tensorflow.load_plugins(run):  # Keras 3's model.fit fails under the strategy alone
            plugin.on_strategy(strategy, keras3)
        context = TrainContext(
            **asdict(spec.rank),
            attempt=spec.attempt,
            run_name=run.run_name,
            run_path=run.run_path,
            tf_config=spec.tf_config,
            task_index=spec.rank.world_rank,
        )
        self.session = WorkerSession(
            context,
            strategy,
            host.sink,
            spec.datasets,
            spec.resume,
            run.storage,
            save_every=run.save_every,
            lease_token=run.lease_token,
            split=run.split,
            preempt_requested=host.preempt_requested,
            halted=host.halted,
            upload=run.upload,
            restore_from_memory=run.restore_from_memory,
        )
        _session.install(self.session)
        host.set_phase(Phase.TRAINING)
        _tensorflow.call_train_fn(code.train_fn, code.config)
        self.session.finish_uploads()  # the run ends once its last checkpoint is committed


class ScriptFailed(Exception):
    """A launched script ended badly: ``kind`` says how the driver takes it, ``exit_code`` its status."""

    def __init__(self, message: str, kind: FailureKind, exit_code: Optional[int]):
        super().__init__(message)
        self.kind, self.exit_code = kind, exit_code


# What a script's gRPC server says when the port it was given is taken.
_BIND_FAILED = ("Address already in use", "Failed to add port", "Could not start gRPC server", "bind(")


def handed_port(tf_config: str) -> Optional[int]:
    """The port raytf held for this task and released for its server (its own TF_CONFIG entry)."""
    try:
        config = json.loads(tf_config)
        task = config["task"]
        return int(str(config["cluster"][task["type"]][int(task["index"])]).rpartition(":")[2])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def lost_port_race(text: str, port: Optional[int]) -> bool:
    """Whether a script's failure is raytf's own port handover lost: its server could not bind the
    port raytf released for it, because another process took it in between. The bind error must be
    about that port (gRPC names the address it could not add), or the port must be taken now; a
    script that fails to bind some other port of its own has a bug a retry would not fix."""
    if port is None or not any(p in text for p in _BIND_FAILED):
        return False
    if re.search(rf":{port}(?!\d)", text):
        return True
    try:
        _tensorflow.reserve_port(port).close()
    except OSError as error:
        return error.errno == errno.EADDRINUSE  # someone holds it now
    return False


def _die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the actor dies (ray.kill, a lost node)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: the driver's shutdown still kills the actor; the script ends on its own


class SubprocessPayload:
    """A command (an unmodified TF_CONFIG script) as a child process, with TF_CONFIG and the run's
    directories in its environment. Its output passes through the actor's (prefixed by rank)."""

    session = None  # no raytf session: the script reports nothing

    def __init__(self) -> None:
        self.process: Optional[subprocess.Popen] = None

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        command = list(user_code(run).command)
        env = {**os.environ, **_tensorflow.worker_environment(run, spec), **script_environment(run, spec)}
        if (
            spec.task is not None
        ):  # a parameter-server task: a call to a lost peer fails at once, as TensorFlow's guide sets
            env.setdefault("GRPC_FAIL_FAST", "use_caller")
        host.set_phase(Phase.READY)
        host.wait_for_go()  # every rank starts together: the last holds its port the shortest
        host.set_phase(Phase.CONNECTING)
        host.release_port()  # the script's server binds it next
        self.process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        host.set_phase(Phase.TRAINING)
        tail: list[bytes] = []
        for line in self.process.stderr or ():  # passed on to the actor's stderr, the last lines kept
            os.write(2, line)
            tail = (tail + [line])[-50:]
        code = self.process.wait()
        if code == 0:
            return
        text = b"".join(tail).decode(errors="replace")
        if lost_port_race(text, handed_port(spec.tf_config)):
            raise ScriptFailed(
                f"{' '.join(command)} could not bind its port (another process took it after "
                "raytf released it): retrying with new ports",
                FailureKind.PORT_TAKEN,
                code,
            )
        if code < 0:
            raise ScriptFailed(f"{' '.join(command)} was killed by signal {-code}", FailureKind.DIED, code)
        raise ScriptFailed(
            f"{' '.join(command)} exited with status {code}:\n{text[-2000:]}", FailureKind.EXCEPTION, code
        )


def script_environment(run: RunSpec, spec: WorkerSpec) -> dict[str, str]:
    """What a launched script finds besides TF_CONFIG: its run's directories and its place in the group."""
    uri = run.run_uri or run.run_path  # the script opens the storage itself: with its credentials
    root = run.storage.root if run.storage is not None else uri
    return {
        _env.RUN_DIR: uri,
        # Shared by every rank and every restart: BackupAndRestore(backup_dir=...) resumes from it.
        _env.CHECKPOINT_DIR: os.path.join(root, "script_checkpoints")
        if run.storage is not None and isinstance(run.storage.filesystem, pafs.LocalFileSystem)
        else _join_uri(uri, "script_checkpoints"),
        _env.RANK: str(spec.rank.world_rank),
        _env.WORLD_SIZE: str(spec.rank.world_size),
        _env.ATTEMPT: str(spec.attempt),
    }


def _join_uri(uri: str, name: str) -> str:
    """``name`` under the directory ``uri`` (before its query: ``s3://b/run?endpoint_override=...``)."""
    base, sep, query = uri.partition("?")
    return f"{base.rstrip('/')}/{name}{sep}{query}"


def user_code(run: RunSpec) -> UserCode:
    """What the run's actors execute (RunSpec.payload)."""
    code = cloudpickle.loads(run.payload)
    if not isinstance(code, UserCode):
        raise TypeError(f"RunSpec.payload holds a {type(code).__name__}, not raytf's UserCode")
    return code


def _load_ps_payload(run: RunSpec, spec: WorkerSpec, host: Host) -> UserCode:
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


def _context(run: RunSpec, spec: WorkerSpec) -> TrainContext:
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

        code = _load_ps_payload(run, spec, host)
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
        self.session = WorkerSession(
            _context(run, spec),
            strategy,
            host.sink,
            {},
            spec.resume,
            run.storage,
            save_every=run.save_every,
            lease_token=run.lease_token,
            preempt_requested=host.preempt_requested,
            halted=host.halted,
            parameter_server=PsData(self._coordinator, list(shard_files or [])),
            upload=run.upload,
            restore_from_memory=run.restore_from_memory,
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

        _load_ps_payload(run, spec, host)
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

        code = _load_ps_payload(run, spec, host)
        evaluate_fn, config = code.evaluate_fn, code.config
        context = _context(run, spec)
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


PAYLOADS: dict[PayloadKind, Callable[[], Any]] = {
    PayloadKind.TRAIN_FN: TrainFnPayload,
    PayloadKind.SUBPROCESS: SubprocessPayload,
    PayloadKind.CHIEF: ChiefPayload,
    PayloadKind.SERVER: ServerPayload,
    PayloadKind.EVALUATOR: EvaluatorPayload,
}

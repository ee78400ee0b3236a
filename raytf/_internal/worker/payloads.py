"""What an actor runs, one class per :class:`~raytf._internal.protocol.PayloadKind` (the
registry: actor.py's ``PAYLOADS``).

The actor (actor.py) holds the port, answers polls and keeps the phase; a payload does the role's
work in the actor's worker thread and moves the phase forward through the :class:`Host` it is
given: ``train_fn`` under MultiWorkerMirroredStrategy, or a subprocess that reads TF_CONFIG
(``raytf launch``), here; a parameter-server role (chief, worker, a TensorFlow server that waits,
evaluator) in ps_payloads.py.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
import sys
from dataclasses import asdict
from typing import Any, Optional, Protocol

import pyarrow.fs as pafs
from ray import cloudpickle

from raytf._internal import env as _env
from raytf._internal import hooks as _hooks
from raytf._internal.protocol import Phase, Report, RunSpec, TrainContext, UserCode, WorkerSpec
from raytf._internal.worker import activity as _activity
from raytf._internal.worker import compression as _compression
from raytf._internal.worker import session as _session
from raytf._internal.worker import strategy as _strategy
from raytf._internal.worker import tensorflow as _tensorflow
from raytf._internal.worker.loading import paused_collector
from raytf._internal.worker.session import WorkerSession
from raytf.errors import FailureKind

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
        if "tensorflow" in sys.modules and not getattr(host, "warmed", False) and _env.FORKSERVER not in os.environ:
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
        self.session = new_session(run, spec, host, context, strategy, spec.datasets, split=run.split)
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


def new_session(
    run: RunSpec, spec: WorkerSpec, host: Host, context: TrainContext, strategy: Any, datasets: dict, **more: Any
) -> WorkerSession:
    """The session behind ``raytf.report`` and the rest in a worker of ``run``: its reports go to
    ``host``, its checkpoints to the run's storage."""
    return WorkerSession(
        context,
        strategy,
        host.sink,
        datasets,
        spec.resume,
        run.storage,
        save_every=run.save_every,
        lease_token=run.lease_token,
        preempt_requested=host.preempt_requested,
        halted=host.halted,
        upload=run.upload,
        restore_from_memory=run.restore_from_memory,
        **more,
    )


def user_code(run: RunSpec) -> UserCode:
    """What the run's actors execute (RunSpec.payload)."""
    code = cloudpickle.loads(run.payload)
    if not isinstance(code, UserCode):
        raise TypeError(f"RunSpec.payload holds a {type(code).__name__}, not raytf's UserCode")
    return code

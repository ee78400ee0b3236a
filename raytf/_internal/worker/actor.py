"""The worker actor: holds a port, sets up TensorFlow, runs ``train_fn`` in a thread.

Nothing here imports TensorFlow at module level. TensorFlow reads its thread
counts, visible GPUs and log level when it is first imported and initialized,
so the actor puts TF_CONFIG and those settings into its environment first,
then imports TensorFlow, then creates the strategy.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ray import cloudpickle

from raytf._internal import env as _env
from raytf._internal.worker import logs as _logs
from raytf._internal.worker import session as _session
from raytf._internal.worker import strategy as _strategy
from raytf._internal.worker.activity import ActivityTracker
from raytf._internal.worker.session import TrainContext, WorkerSession
from raytf._internal.protocol import Report, WorkerStatus
from raytf._internal.driver.topology import RankInfo, WorkerAddress
from raytf.errors import WorkerFailure

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerSpec:
    """Everything one worker needs to start training, built by the driver."""

    rank: RankInfo
    tf_config: str
    attempt: int
    run_name: str
    run_path: str
    communication: str
    collective_timeout_s: Optional[float]
    intra_op_threads: int
    inter_op_threads: int
    use_gpu: bool
    gpu_memory_growth: bool = False
    env: dict[str, str] = field(default_factory=dict)
    datasets: dict[str, Any] = field(default_factory=dict)  # name -> ray.data.DataIterator
    resume: Optional[dict[str, Any]] = None  # the committed checkpoint to resume from
    storage: Any = None  # (pyarrow filesystem, run root on it): where checkpoints go
    next_checkpoint_seq: int = 0
    checkpoint_every: Optional[tuple[str, int]] = None  # ("epoch" | "step", n) from CheckpointConfig
    lease_token: Optional[str] = None  # the driver's claim on the run: checked before each upload
    split: tuple[str, ...] = ()  # names of the datasets split across the workers
    keras: str = "auto"
    mixed_precision: Optional[str] = None
    log_level: str = "error"  # TensorflowConfig.log_level: TensorFlow's C++ lines shown


def reserve_port() -> socket.socket:
    """A socket bound to a free port on every interface, never listening.

    Holding it keeps the port from being handed to anyone else (another
    worker's reservation, an outgoing connection's ephemeral port) until the
    moment TensorFlow's gRPC server binds it. TensorFlow binds the wildcard
    address with SO_REUSEPORT off, so the reservation is on the wildcard too
    (dual-stack where IPv6 is available) and released just before that bind.
    """
    if socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            return sock
        except OSError:
            sock.close()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    return sock


def worker_environment(spec: WorkerSpec) -> dict[str, str]:
    """The variables a worker sets before importing TensorFlow."""
    env = {
        _env.TF_CONFIG: spec.tf_config,
        _env.TF_NUM_INTRAOP_THREADS: str(spec.intra_op_threads),
        _env.TF_NUM_INTEROP_THREADS: str(spec.inter_op_threads),
        _env.OMP_NUM_THREADS: str(spec.intra_op_threads),
    }
    if not spec.use_gpu:
        # A CPU worker on a GPU node must not grab the GPUs other workers own.
        env[_env.CUDA_VISIBLE_DEVICES] = ""
    env[_env.TF_CPP_MIN_LOG_LEVEL] = _logs.tf_cpp_min_log_level(spec.log_level)
    if spec.keras != "auto":
        # TensorFlow reads it once, on import: tf.keras is then tf-keras 2 or Keras 3.
        env[_env.TF_USE_LEGACY_KERAS] = "1" if spec.keras == "tf_keras" else "0"
    env.update(spec.env)
    return env


def check_storage_visible(spec: WorkerSpec, node_ip: str) -> None:
    """On local storage, this worker's node must see the run directory the driver writes.

    The driver's lease claim is a file there; a node that cannot see it (a
    path that is not a shared mount, on a node the autoscaler just added)
    would keep checkpoints nobody else can read.
    """
    import pyarrow.fs as pafs

    from raytf._internal import lease as _lease
    from raytf.errors import ConfigError

    if spec.storage is None or spec.lease_token is None:
        return
    filesystem, root = spec.storage
    if isinstance(filesystem, pafs.LocalFileSystem) and not os.path.exists(
            _lease.claim_path(filesystem, root, spec.lease_token)):
        raise ConfigError(
            f"RunConfig.storage_path: the run directory {root!r} is a local path that this worker's "
            f"node ({node_ip}) cannot see: what it wrote there would be lost with the node. Use "
            "storage every node shares: s3://bucket/prefix, gs://bucket/prefix, or a network "
            "filesystem mounted at the same path on every node"
        )


def _configure_keras(spec: WorkerSpec) -> None:
    """Check that tf.keras is the Keras asked for, and set the mixed-precision policy."""
    import tensorflow as tf

    legacy = tf.keras.Sequential.__module__.startswith("tf_keras")
    if spec.keras == "tf_keras" and not legacy:
        raise RuntimeError(
            "TensorflowConfig(keras='tf_keras'), but tf.keras on this worker is Keras 3: install "
            "tf-keras (pip install tf-keras) in the workers' environment, and do not import "
            "TensorFlow before raytf sets TF_USE_LEGACY_KERAS"
        )
    if spec.keras == "keras3" and legacy:
        raise RuntimeError(
            "TensorflowConfig(keras='keras3'), but tf.keras on this worker is tf-keras: TensorFlow "
            "was imported before raytf could set TF_USE_LEGACY_KERAS=0"
        )
    if spec.mixed_precision is not None:
        tf.keras.mixed_precision.set_global_policy(spec.mixed_precision)


def _configure_tensorflow(spec: WorkerSpec) -> None:
    import tensorflow as tf

    _logs.quiet_tensorflow_python()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(spec.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(spec.inter_op_threads)
        if spec.gpu_memory_growth:
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as error:  # the context was initialized before raytf got here
        logger.warning("could not apply TensorFlow settings before start-up: %s", error)


def failure_kind(error: BaseException) -> str:
    """"collective" for TensorFlow's errors from a collective whose peer went away, else "exception"."""
    from raytf._internal.driver.failure import PEER_ERRORS

    tf_errors = sys.modules.get("tensorflow.python.framework.errors_impl")
    if tf_errors is not None and isinstance(error, tf_errors.OpError):
        if type(error).__name__ in PEER_ERRORS:
            return "collective"
        if "Collective ops is aborted" in str(error):  # an InternalError after a peer failed
            return "collective"
    return "exception"


def _call(train_fn: Any, config: dict[str, Any]) -> Any:
    """Call ``train_fn(config)``, or ``train_fn()`` when it takes no argument (as Ray Train allows)."""
    try:
        takes_config = len(inspect.signature(train_fn).parameters) > 0
    except (TypeError, ValueError):
        takes_config = True
    return train_fn(config) if takes_config else train_fn()


class TrainWorker:
    """One rank of the worker group. The driver polls it; it never calls the driver."""

    def __init__(self) -> None:
        self._sock: Optional[socket.socket] = None
        self._address: Optional[WorkerAddress] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._reports: list[Report] = []
        self._phase = "created"
        self._failure: Optional[WorkerFailure] = None
        self._rank = -1
        self._session: Optional[WorkerSession] = None
        self._preempt_reason: Optional[str] = None
        self._go = threading.Event()  # set by connect(): every peer is ready to build the strategy
        self._activity = ActivityTracker()
        self._output = _logs.OutputFilter()
        self._output.install()  # before TensorFlow is imported: its first lines are the noisiest
        self._catch_sigterm()

    def _catch_sigterm(self) -> None:
        """A node about to go away (a cloud preemption, `ray stop`) sends its
        processes SIGTERM: ask train_fn to save and stop rather than dying.

        Handlers can only be set from the main thread, where actor methods run.
        TensorFlow's coordination service puts its own C-level SIGTERM handler
        in place when the strategy is created (for its PreemptionCheckpointHandler),
        which silently replaces this one, so every poll puts it back: one
        sigaction call.
        """
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.preempt("the worker process got SIGTERM")

    def connect(self) -> None:
        """Every worker is ready: build the strategy now.

        Creating MultiWorkerMirroredStrategy blocks until every peer's server
        is up, and holds the GIL while it waits (this actor answers nothing
        meanwhile). The driver therefore releases all workers together once
        each says it is ready, so that wait is short, and a worker that never
        gets ready is named as such instead of hiding behind peers that wait
        for it.
        """
        self._go.set()

    def preempt(self, reason: str) -> None:
        """Ask ``train_fn`` to checkpoint and stop: ``raytf.preemption_requested()`` turns True."""
        if self._preempt_reason is None:
            self._preempt_reason = reason

    def reserve(self) -> WorkerAddress:
        """Reserve a port for TensorFlow's server and say where this worker is."""
        import ray

        if self._address is None:
            self._sock = reserve_port()
            self._address = WorkerAddress(
                node_id=ray.get_runtime_context().get_node_id(),
                node_ip=ray.util.get_node_ip_address(),
                port=self._sock.getsockname()[1],
                gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
                pid=os.getpid(),
            )
        return self._address

    def start(self, spec: WorkerSpec, payload: bytes) -> None:
        """Start training in a thread and return at once; the driver polls for progress.

        ``payload`` is the cloudpickled ``(train_fn, config)``. It is loaded in
        the thread after the environment is set, because loading it may import
        the user's modules, and with them TensorFlow.
        """
        if self._thread is not None:
            raise RuntimeError("this worker has already started training")
        self._rank = spec.rank.world_rank
        self._output.level, self._output.use_gpu = spec.log_level, spec.use_gpu
        _logs.name_in_log_prefix(f"raytf rank {self._rank}")
        self._phase = "starting"
        self._thread = threading.Thread(target=self._run, args=(spec, payload), name="raytf-train", daemon=True)
        self._thread.start()

    def poll(self) -> WorkerStatus:
        activity = None
        if self._phase == "training":
            self._catch_sigterm()
            activity = self._activity.sample(self._thread.ident if self._thread else None)
        elif self._phase == "finished":
            activity = self._activity.finished()
        with self._lock:
            reports, self._reports = tuple(self._reports), []
        return WorkerStatus(
            rank=self._rank, phase=self._phase, reports=reports, failure=self._failure,
            preempt_reason=self._preempt_reason, activity=activity,
            progress=self._session.progress() if self._session is not None else None,
        )

    def acknowledge(self, seq: int, error: Optional[str] = None) -> None:
        if self._session is not None:
            self._session.acknowledge(seq, error)

    def _sink(self, report: Report) -> None:
        with self._lock:
            self._reports.append(report)

    def _release_port(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _run(self, spec: WorkerSpec, payload: bytes) -> None:
        try:
            if "tensorflow" in sys.modules:
                logger.warning(
                    "TensorFlow was imported in this worker before raytf set TF_CONFIG and the "
                    "thread settings; import it inside train_fn, not at the top of a module the "
                    "worker loads first"
                )
            os.environ.update(worker_environment(spec))
            check_storage_visible(spec, self._address.node_ip if self._address else "")
            train_fn, config = cloudpickle.loads(payload)
            _configure_tensorflow(spec)
            _configure_keras(spec)
            self._phase = "ready"
            self._go.wait()
            self._phase = "connecting"
            self._release_port()
            strategy = _strategy.make_strategy(spec.communication, spec.collective_timeout_s)
            _strategy.install(strategy)
            context = TrainContext(
                **asdict(spec.rank),
                attempt=spec.attempt,
                run_name=spec.run_name,
                run_path=spec.run_path,
                tf_config=spec.tf_config,
            )
            self._session = WorkerSession(
                context, strategy, self._sink, spec.datasets, spec.resume, spec.next_checkpoint_seq,
                spec.storage, checkpoint_every=spec.checkpoint_every, lease_token=spec.lease_token,
                split=spec.split,
                preempt_requested=lambda: self._preempt_reason is not None,
            )
            _session.install(self._session)
            self._phase = "training"
            _call(train_fn, config)
            self._phase = self._ended()
        except SystemExit as exit_:
            if exit_.code in (None, 0):
                self._phase = self._ended()
            else:
                self._fail(spec, exit_)
        except BaseException as error:  # noqa: BLE001 - every error goes to the driver as data
            self._fail(spec, error)

    def _ended(self) -> str:
        """"preempted" when train_fn returned because raytf.preemption_requested() said so."""
        if self._session is not None and self._session.preempted:
            return "preempted"
        return "finished"

    def _fail(self, spec: WorkerSpec, error: BaseException) -> None:
        self._failure = WorkerFailure(
            rank=spec.rank.world_rank,
            kind=failure_kind(error),
            error_type=type(error).__qualname__,
            message=str(error),
            traceback="".join(traceback.format_exception(error)),
            time=time.time(),
            node_ip=self._address.node_ip if self._address else "",
        )
        self._phase = "failed"

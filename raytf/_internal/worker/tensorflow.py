"""A worker's TensorFlow: its environment, set before TensorFlow is imported, then its settings.

TensorFlow reads its thread counts, visible GPUs, log level and Keras choice
when it is first imported and initialized, so a worker puts TF_CONFIG and
those settings into its environment first, then imports TensorFlow, then
creates the strategy (strategy.py). Nothing here imports TensorFlow at
module level.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import socket
import sys
from typing import Any, Sequence

from raytf._internal import env as _env
from raytf._internal.protocol import RunSpec, WorkerSpec
from raytf._internal.worker import logs as _logs
from raytf.errors import ConfigError, FailureKind

logger = logging.getLogger(__name__)


def reserve_port(port: int = 0) -> socket.socket:
    """A socket bound to a free port on every interface, never listening.

    Holding it keeps the port from being handed to anyone else (another
    worker's reservation, an outgoing connection's ephemeral port) until the
    moment TensorFlow's gRPC server binds it. TensorFlow binds the wildcard
    address with SO_REUSEPORT off, so the reservation is on the wildcard too
    (dual-stack where IPv6 is available) and released just before that bind.
    ``port``: the one wanted (a replaced worker's old port); OSError if it is taken. The dead
    worker's connections linger on it in TIME_WAIT for a minute, so that port is bound with
    SO_REUSEADDR (as gRPC binds its servers): a parameter-server coordinator redials a lost
    worker's address and waits there until a server answers, so the replacement must come back
    at that very address whenever it is on the same node.
    """
    if socket.has_ipv6:
        try:
            return _bound(socket.AF_INET6, "::", port)
        except OSError:
            pass
    return _bound(socket.AF_INET, "0.0.0.0", port)


def _bound(family: int, wildcard: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        if port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((wildcard, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_environment(run: RunSpec, spec: WorkerSpec) -> dict[str, str]:
    """The variables a worker sets before importing TensorFlow."""
    return {_env.TF_CONFIG: spec.tf_config, **run_environment(run)}


def run_environment(run: RunSpec) -> dict[str, str]:
    """The part of the worker's environment that is the run's, not its rank's (all but TF_CONFIG):
    what a warm standby sets before it imports TensorFlow."""
    env = {
        _env.TF_NUM_INTRAOP_THREADS: str(run.tensorflow.intra_op_threads),
        _env.TF_NUM_INTEROP_THREADS: str(run.tensorflow.inter_op_threads),
        _env.OMP_NUM_THREADS: str(run.tensorflow.intra_op_threads),
    }
    env.update(start_environment(run))
    env.update(host_allocator())
    env.update(run.tensorflow.env)  # the user's TensorflowConfig.worker_env has the last word
    return env


def start_environment(run: RunSpec) -> dict[str, str]:
    """What of the run's environment TensorFlow may read when it is imported: the visible GPUs, the
    log level, the Keras choice and the user's ``worker_env``. The driver puts it into the runtime
    environment of a worker it starts through a fork server (driver/forkserver.py), under which
    the server imports TensorFlow. The thread counts (read when TensorFlow's context starts) and
    the host allocator's limit (the node's memory) the worker sets itself, as every worker does."""
    env: dict[str, str] = {}
    if not run.tensorflow.use_gpu:
        # A CPU worker on a GPU node must not grab the GPUs other workers own.
        env[_env.CUDA_VISIBLE_DEVICES] = ""
    env[_env.TF_CPP_MIN_LOG_LEVEL] = _logs.tf_cpp_min_log_level(run.tensorflow.log_level)
    if run.tensorflow.keras != "auto":
        # TensorFlow reads it once, on import: tf.keras is then tf-keras 2 or Keras 3.
        env[_env.TF_USE_LEGACY_KERAS] = "1" if run.tensorflow.keras == "tf_keras" else "0"
    env.update(run.tensorflow.env)  # the user's TensorflowConfig.worker_env has the last word
    return env


def host_allocator() -> dict[str, str]:
    """TensorFlow's host allocator for a worker: BFC, which keeps what it frees, up to this node's
    memory. Every asynchronous checkpoint copies the state into new host tensors; TensorFlow's
    default allocator returns large blocks to the system where oneDNN is off (a CPU without
    AVX-512, or ``TF_ENABLE_ONEDNN_OPTS=0``), so each copy of a large variable mapped its pages
    anew: a 512 MiB table in copy-on-read mode (sparse updates) 0.23-0.27 s every checkpoint,
    against 0.03 s after the first with BFC (docs/benchmarks/checkpoints.md). A user's own
    setting in ``TensorflowConfig.worker_env`` replaces it."""
    try:
        total_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") >> 20
    except (ValueError, OSError, AttributeError):  # a platform without these: TensorFlow's own limit
        return {_env.TF_CPU_ALLOCATOR_USE_BFC: "true"}
    return {_env.TF_CPU_ALLOCATOR_USE_BFC: "true", _env.TF_CPU_BFC_MEM_LIMIT_IN_MB: str(total_mib)}


def check_storage_visible(run: RunSpec, node_ip: str) -> None:
    """On local storage, this worker's node must see the run directory the driver writes.

    The driver's lease claim is a file there; a node that cannot see it (a
    path that is not a shared mount, on a node the autoscaler just added)
    would keep checkpoints nobody else can read.
    """
    import pyarrow.fs as pafs

    from raytf._internal import lease as _lease
    from raytf.errors import ConfigError

    storage, token = run.storage, run.lease_token
    if storage is None or token is None:
        return
    filesystem, root = storage.filesystem, storage.root
    if isinstance(filesystem, pafs.LocalFileSystem) and not os.path.exists(_lease.claim_path(filesystem, root, token)):
        raise ConfigError(
            f"RunConfig.storage_path: the run directory {root!r} is a local path that this worker's "
            f"node ({node_ip}) cannot see: what it wrote there would be lost with the node. Use "
            "storage every node shares: s3://bucket/prefix, gs://bucket/prefix, or a network "
            "filesystem mounted at the same path on every node"
        )


def configure_keras(run: RunSpec) -> None:
    """Check that tf.keras is the Keras asked for, and set the mixed-precision policy."""
    import tensorflow as tf

    legacy = tf.keras.Sequential.__module__.startswith("tf_keras")
    if run.tensorflow.keras == "tf_keras" and not legacy:
        raise ConfigError(
            "TensorflowConfig(keras='tf_keras'), but tf.keras on this worker is Keras 3: install "
            "tf-keras (pip install tf-keras) in the workers' environment, and do not import "
            "TensorFlow before raytf sets TF_USE_LEGACY_KERAS"
        )
    if run.tensorflow.keras == "keras3" and legacy:
        raise ConfigError(
            "TensorflowConfig(keras='keras3'), but tf.keras on this worker is tf-keras: TensorFlow "
            "was imported before raytf could set TF_USE_LEGACY_KERAS=0"
        )
    if run.tensorflow.mixed_precision is not None:
        tf.keras.mixed_precision.set_global_policy(run.tensorflow.mixed_precision)


def load_keras(run: RunSpec) -> bool:
    """Check and set up the Keras asked for (configure_keras), and import what raytf's Keras 3
    support needs, so none of it is left for after the start barrier. True where raytf reroutes
    Keras 3's fit: tf.keras is Keras 3, or train_fn's modules imported Keras 3 themselves."""
    configure_keras(run)
    import tensorflow as tf

    keras3 = not tf.keras.Sequential.__module__.startswith("tf_keras") or "keras" in sys.modules
    if keras3 and run.tensorflow.keras != "tf_keras":
        load_plugins(run)  # raytf's Keras 3 support, before the start barrier
        return True
    return False


def load_plugins(run: RunSpec) -> list[Any]:
    """The run's worker plugins (RunSpec.plugins), imported by name."""
    return [importlib.import_module(name) for name in run.plugins]


def adopt_gpus(gpu_ids: Sequence[str]) -> None:
    """Make ``gpu_ids`` this process's GPUs: a warm standby, started with no GPU of its own so
    none sits idle while it waits, takes those of the bundle whose rank it is handed (the run's
    placement group holds them for it). CUDA reads CUDA_VISIBLE_DEVICES once, when TensorFlow
    first lists its devices; a standby's warm-up imports TensorFlow without doing so."""
    from raytf._internal.hooks import tensorflow as tf_hooks

    if tf_hooks.devices_listed():
        raise ConfigError(
            "this warm standby's TensorFlow found its devices before it was handed its GPUs "
            f"({', '.join(gpu_ids)}): train_fn's modules use TensorFlow's devices when imported. Move "
            "that into train_fn, or set FailureConfig.warm_standby to False"
        )
    os.environ[_env.CUDA_VISIBLE_DEVICES] = ",".join(gpu_ids)


def configure_tensorflow(run: RunSpec) -> None:
    import tensorflow as tf

    _logs.quiet_tensorflow_python()
    try:
        tf.config.threading.set_intra_op_parallelism_threads(run.tensorflow.intra_op_threads)
        tf.config.threading.set_inter_op_parallelism_threads(run.tensorflow.inter_op_threads)
        if run.tensorflow.gpu_memory_growth:
            for gpu in tf.config.list_physical_devices("GPU"):
                tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError as error:  # the context was initialized before raytf got here
        logger.warning("could not apply TensorFlow settings before start-up: %s", error)


def failure_kind(error: BaseException) -> FailureKind:
    """COLLECTIVE for TensorFlow's errors from a collective whose peer went away, DIED for a kept
    shard whose node went away, else EXCEPTION."""
    from raytf._internal.data.shard import KeptShardLost
    from raytf._internal.driver.failure import PEER_ERRORS

    if isinstance(error, KeptShardLost):
        return FailureKind.DIED

    tf = sys.modules.get("tensorflow")
    if tf is not None and isinstance(error, tf.errors.OpError):
        if type(error).__name__ in PEER_ERRORS:
            return FailureKind.COLLECTIVE
        if "Collective ops is aborted" in str(error):  # an InternalError after a peer failed
            return FailureKind.COLLECTIVE
    return FailureKind.EXCEPTION


def call_train_fn(train_fn: Any, config: dict[str, Any]) -> Any:
    """Call ``train_fn(config)``, or ``train_fn()`` when it takes no argument (as Ray Train allows)."""
    try:
        takes_config = len(inspect.signature(train_fn).parameters) > 0
    except (TypeError, ValueError):
        takes_config = True
    return train_fn(config) if takes_config else train_fn()

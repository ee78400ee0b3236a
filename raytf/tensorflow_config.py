"""``raytf.TensorflowConfig``: how each worker sets up TensorFlow and its strategy.

Re-exported by ``raytf.config`` beside the other configs; a module of its own because it is the
one config that grows with every TensorFlow option raytf takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from raytf._internal.validate import check_bool, check_choice, check_environment, check_int, check_timeout
from raytf.errors import ConfigError

COMMUNICATIONS = ("auto", "ring", "nccl")
KERAS_VERSIONS = ("auto", "keras3", "tf_keras")
MIXED_PRECISION_POLICIES = ("mixed_float16", "mixed_bfloat16")
GRADIENT_COMPRESSIONS = ("bfloat16", "float16")  # raytf/_internal/worker/compression.py DTYPES
LOG_LEVELS = ("info", "warning", "error", "fatal")  # TensorFlow's C++ log levels
START_METHODS = ("auto", "forkserver", "spawn")  # as multiprocessing names its own


@dataclass(frozen=True)
class TensorflowConfig:
    """How each worker sets up TensorFlow and MultiWorkerMirroredStrategy.

    ``communication`` picks the collective implementation: ``"auto"`` means
    NCCL when workers have GPUs and RING otherwise. ``collective_timeout_s``
    bounds every collective, so a peer that stops answering fails the step
    instead of hanging it. Thread counts default to the worker's CPUs.
    ``worker_env`` is put into each worker's environment before TensorFlow is
    imported (for example ``NCCL_DEBUG`` or ``TF_GPU_THREAD_MODE``).

    ``keras`` picks what ``tf.keras`` is on the workers: ``"tf_keras"`` sets
    ``TF_USE_LEGACY_KERAS=1`` before TensorFlow is imported (setting it inside
    ``train_fn`` is too late), for tf-keras 2 and its ``model.fit``;
    ``"keras3"`` makes sure it is Keras 3 (train with ``raytf.keras.fit``);
    ``"auto"`` leaves the environment as it is. ``mixed_precision``
    (``"mixed_float16"`` or ``"mixed_bfloat16"``) sets that Keras global dtype
    policy on every worker before ``train_fn`` runs.

    ``log_level`` is the least severe of TensorFlow's C++ log lines a worker
    shows: ``"error"`` (default) hides its info and warning lines (oneDNN
    notices and the like), ``"info"`` shows everything. CPU workers never show
    the CUDA stubs' lines saying there is no GPU. The user's own output and
    Python warnings always come through, prefixed with the worker's rank.

    ``bytes_per_pack`` is TensorFlow's all-reduce fusion
    (``CommunicationOptions(bytes_per_pack=...)``). 0 (default, TensorFlow's
    own) concatenates every gradient of a step into one all-reduce, which can
    start only when the whole backward pass is done; N > 0 packs them into
    all-reduces of about N bytes, each starting as soon as its gradients exist,
    overlapping communication with the rest of the backward pass; 1 is one
    all-reduce per variable. The update is the same either way; only the number
    and timing of the collectives change.

    ``gradient_compression`` (``"bfloat16"`` or ``"float16"``) all-reduces the
    gradients in 16 bits: half the bytes on the network, while the weights,
    the optimizer's state and the update stay float32. It applies wherever a
    Keras optimizer sums gradients across workers (``raytf.keras.fit``, tf-keras
    ``model.fit``, ``optimizer.apply_gradients`` in a custom loop) and in
    ``raytf.all_reduce_gradients``; metrics and losses are reduced in full
    precision. bfloat16 keeps float32's range with 8 bits of mantissa; float16
    keeps 11 bits but overflows above 65504 and flushes gradients below about
    6e-8 to zero. ``error_feedback=True`` keeps what the cast rounded away on
    each worker and adds it to that worker's next gradient, so small gradient
    components accumulate instead of vanishing (one float32 residual per
    weight on each worker, not checkpointed). On GPU workers only float16:
    TensorFlow's GPU collectives (NCCL and RING alike) do not all-reduce
    bfloat16.

    ``start_method`` is how a worker's process starts, in the words of Python's
    ``multiprocessing``. ``"forkserver"``: forked from a process of its node
    that has imported TensorFlow already (one per raylet and per environment,
    started by the first worker that needs it), so that a worker's start and
    every restart skip TensorFlow's import, some two CPU-seconds per worker;
    what TensorFlow reads when imported (the log level, ``keras``,
    ``worker_env``) goes into the workers' runtime environment, and the fork
    server imports TensorFlow under it. ``"spawn"``: a new process
    of Ray's that imports TensorFlow itself. ``"auto"`` (default) is
    ``"forkserver"`` for CPU workers on Linux where the job's runtime
    environment names no interpreter of its own (``pip``, ``conda``, ``uv``,
    a container or ``py_executable``), else ``"spawn"``. GPU workers always
    spawn: a process forked after CUDA's libraries were loaded is not one that
    CUDA supports. Every node runs raytf from the same Python path as the
    driver (``sys.executable``), as one cluster image gives.
    """

    communication: str = "auto"
    collective_timeout_s: Optional[float] = None
    intra_op_threads: Optional[int] = None
    inter_op_threads: Optional[int] = None
    gpu_memory_growth: bool = False
    worker_env: Mapping[str, str] = field(default_factory=dict)
    keras: str = "auto"
    mixed_precision: Optional[str] = None
    log_level: str = "error"
    bytes_per_pack: int = 0
    gradient_compression: Optional[str] = None
    error_feedback: bool = False
    start_method: str = "auto"

    def __post_init__(self) -> None:
        method = check_choice("TensorflowConfig.start_method", self.start_method, START_METHODS, upper=False)
        object.__setattr__(self, "start_method", method)
        check_int("TensorflowConfig.bytes_per_pack", self.bytes_per_pack, minimum=0)
        if self.gradient_compression is not None and self.gradient_compression not in GRADIENT_COMPRESSIONS:
            raise ConfigError(
                f"TensorflowConfig.gradient_compression must be None, 'bfloat16' or 'float16', "
                f"got {self.gradient_compression!r}"
            )
        check_bool("TensorflowConfig.error_feedback", self.error_feedback)
        if self.error_feedback and self.gradient_compression is None:
            raise ConfigError(
                "TensorflowConfig.error_feedback=True corrects the rounding of compressed gradients: set "
                "gradient_compression='bfloat16' (or 'float16') too, or leave error_feedback off"
            )
        level = check_choice("TensorflowConfig.log_level", self.log_level, LOG_LEVELS, upper=False)
        object.__setattr__(self, "log_level", level)
        comm = check_choice("TensorflowConfig.communication", self.communication, COMMUNICATIONS, upper=False)
        object.__setattr__(self, "communication", comm)
        keras = self.keras.replace("-", "_").lower() if isinstance(self.keras, str) else self.keras
        if keras not in KERAS_VERSIONS:
            raise ConfigError(f"TensorflowConfig.keras must be one of {', '.join(KERAS_VERSIONS)}, got {self.keras!r}")
        object.__setattr__(self, "keras", keras)
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISION_POLICIES:
            raise ConfigError(
                f"TensorflowConfig.mixed_precision must be None, 'mixed_float16' or 'mixed_bfloat16', "
                f"got {self.mixed_precision!r}"
            )
        check_timeout("TensorflowConfig.collective_timeout_s", self.collective_timeout_s)
        for name in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if value is not None:
                check_int(f"TensorflowConfig.{name}", value, minimum=1)
        worker_env = check_environment("TensorflowConfig.worker_env", self.worker_env)
        check_bool("TensorflowConfig.gpu_memory_growth", self.gpu_memory_growth)
        for key in worker_env:
            if key == "TF_CONFIG":
                raise ConfigError(
                    "TensorflowConfig.worker_env must not set TF_CONFIG: raytf builds it from each worker's rank"
                )
            if key == "TF_USE_LEGACY_KERAS" and keras != "auto":
                raise ConfigError(
                    f"TensorflowConfig: worker_env sets TF_USE_LEGACY_KERAS and keras={keras!r} sets it "
                    "too; keep only keras=..."
                )
        object.__setattr__(self, "worker_env", worker_env)

    def _resolve_communication(self, scaling: Any) -> str:
        """The implementation the workers will use, checked against their GPUs (``scaling``: a
        ScalingConfig, or a ParameterServerScaling, whose GPUs are any role's)."""
        if self.communication == "nccl" and not scaling.use_gpu:
            gpus = "gpus_per_worker=0" if type(scaling).__name__ == "ScalingConfig" else "no role has GPUs"
            raise ConfigError(
                f"TensorflowConfig.communication='nccl' needs GPUs, but {type(scaling).__name__} has {gpus}: "
                "use 'ring' (or 'auto') for CPU workers, or give each worker a GPU"
            )
        if self.gradient_compression == "bfloat16" and scaling.use_gpu:
            raise ConfigError(
                "TensorflowConfig.gradient_compression='bfloat16' cannot run on GPU workers: TensorFlow's GPU "
                "collectives (NCCL and RING) do not all-reduce bfloat16. Use gradient_compression='float16' "
                "(with error_feedback=True to keep what it rounds away)"
            )
        if self.communication == "auto":
            return "nccl" if scaling.use_gpu else "ring"
        return self.communication

    def _resolve_start_method(self, scaling: Any) -> str:
        """How this run's workers start, checked against their GPUs: GPU workers spawn."""
        if not scaling.use_gpu:
            return self.start_method
        if self.start_method == "forkserver":
            raise ConfigError(
                f"TensorflowConfig.start_method='forkserver' is for CPU workers, but {type(scaling).__name__} "
                "gives them GPUs: a process forked after CUDA's libraries were loaded is not one CUDA "
                "supports. Use start_method='auto' or 'spawn'"
            )
        return "spawn"

    def _threads(self, scaling: Any) -> tuple[int, int]:
        """(intra-op, inter-op) thread counts: the worker's CPUs unless set."""
        default = max(1, int(scaling.cpus_per_worker))
        return (self.intra_op_threads or default, self.inter_op_threads or default)

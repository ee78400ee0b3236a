"""The driver and the workers speak in these types: what the driver hands a worker, what a
worker answers to a poll. Plain, picklable data; no Ray, no TensorFlow."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional

from raytf.errors import FailureKind, WorkerFailure

# What the driver adds to every history entry; raytf.report refuses metrics of these names.
HISTORY_KEYS = ("attempt", "driver_start", "report_seq", "checkpoint", "committed_at", "evaluated_checkpoint")

__all__ = [
    "Activity",
    "ActivityKind",
    "CheckpointPart",
    "CheckpointUpload",
    "FailureKind",
    "GroupStatus",
    "HISTORY_KEYS",
    "Phase",
    "Progress",
    "Report",
    "ReportStage",
    "ResumePoint",
    "SaveEvery",
    "StorageRef",
    "TaskId",
    "TrainContext",
    "UploadedCheckpoint",
    "UserCode",
    "WorkerFailure",
    "WorkerStatus",
]


class Phase(str, enum.Enum):
    """Where a worker is, from actor start to its end; the order of the first five is the start-up."""

    CREATED = "created"  # the actor exists
    STARTING = "starting"  # loading train_fn and its modules, importing TensorFlow
    READY = "ready"  # waiting for every peer to be ready
    CONNECTING = "connecting"  # building the strategy, which waits for every peer's server
    TRAINING = "training"  # train_fn runs
    FINISHED = "finished"  # train_fn returned
    PREEMPTED = "preempted"  # train_fn returned because a preemption was asked for
    FAILED = "failed"  # train_fn raised
    LOST = "lost"  # the driver lost it: died, or stopped answering

    def __str__(self) -> str:
        return self.value


STARTING_PHASES = (Phase.CREATED, Phase.STARTING, Phase.READY, Phase.CONNECTING)  # not yet in the group


class ActivityKind(str, enum.Enum):
    """What a training thread is doing, as its stack shows it (see raytf._internal.worker.activity)."""

    TENSORFLOW = "tensorflow"  # inside a TensorFlow call: computing, or waiting in a collective for peers
    RAYTF = "raytf"  # raytf's own work: reading a shard, uploading a checkpoint, waiting for its commit
    PYTHON = "python"  # the user's own code, outside TensorFlow
    FINISHED = "finished"  # train_fn returned

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StorageRef:
    """Where a run lives: a ``pyarrow.fs`` filesystem and the run's directory on it."""

    filesystem: Any
    root: str


@dataclass(frozen=True)
class UploadedCheckpoint:
    """A checkpoint the chief uploaded under ``name``, waiting for the driver to commit it."""

    name: str
    seq: int


class CheckpointUpload(str, enum.Enum):
    """How a report's checkpoint reaches storage (``CheckpointConfig.upload``)."""

    SYNC = "sync"  # report returns once the driver committed the checkpoint
    # report returns once the state is in host memory; a background thread uploads it, and the
    # report reaches the driver twice: at once (PENDING), and with the upload (UPLOADED)
    ASYNC = "async"

    def __str__(self) -> str:
        return self.value


class ReportStage(str, enum.Enum):
    """Where an asynchronous report's checkpoint is when the report reaches the driver."""

    PENDING = "pending"  # being uploaded: record the metrics now, the checkpoint comes later
    UPLOADED = "uploaded"  # in storage: commit it and name it in the report's history entry

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class CheckpointPart:
    """One rank's share of a report made with ``raytf.report(..., ranks="all")``: a collective
    report whose ranks' checkpoint files are merged into one checkpoint.

    ``round`` counts such reports in the attempt, the same on every rank; ``parties`` is how many
    ranks take part. ``staging`` holds the files this rank uploaded and ``files`` their manifest
    (relative path -> size and CRC32), both None when the rank passed no checkpoint. ``seq`` is the
    number the chief's counter gave the round: the merged checkpoint's name (rank 0's counts).
    """

    round: int
    parties: int
    seq: int = -1
    staging: Optional[str] = None
    files: Optional[dict[str, dict[str, int]]] = None


@dataclass(frozen=True)
class ResumePoint:
    """Where an attempt starts: the committed checkpoint (its path and index entry), or none,
    and the number the next checkpoint takes."""

    next_seq: int = 0
    path: Optional[str] = None
    entry: Any = None  # raytf._internal.checkpoint.manager.CheckpointEntry

    @property
    def epoch(self) -> Optional[int]:
        return None if self.entry is None else self.entry.epoch

    @property
    def step(self) -> Optional[int]:
        return None if self.entry is None else self.entry.step


@dataclass(frozen=True)
class SaveEvery:
    """CheckpointConfig.every_n_epochs / every_n_steps: save when ``unit`` ("epoch" or "step")
    has moved ``n`` past the last saved checkpoint."""

    unit: str
    n: int


@dataclass(frozen=True)
class Report:
    """One ``raytf.report`` call: its metrics and the rank and attempt it came from."""

    rank: int
    seq: int
    metrics: dict[str, Any]
    time: float
    attempt: int = 0
    checkpoint: Optional[UploadedCheckpoint] = None
    part: Optional[CheckpointPart] = None  # a collective report (ranks="all"): this rank's share
    stage: Optional[ReportStage] = None  # an asynchronous checkpoint's report; None: synchronous
    data: Optional[dict[str, Any]] = None  # with a checkpoint: each split dataset's position (data/planned.py)

    @property
    def share(self) -> CheckpointPart:
        """This rank's share of a collective report; the caller routes only those here."""
        if self.part is None:
            raise ValueError(f"rank {self.rank}'s report {self.seq} is not part of a collective report")
        return self.part


@dataclass(frozen=True)
class Activity:
    """What a worker's training thread has been doing, continuously, as sampled at each poll.
    ``where`` is the innermost line of the user's code on the thread's stack."""

    kind: ActivityKind
    seconds: float
    where: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ActivityKind(self.kind))


@dataclass(frozen=True)
class Progress:
    """Where a worker's training is, as far as raytf can see it: ``raytf.keras.fit``,
    ``ReportCallback`` and reported ``epoch`` / ``step`` metrics keep it.

    ``epoch`` is the epoch in progress, ``step`` the steps done in it (of
    ``steps`` per epoch, when known), ``global_step`` the steps done in the
    run, ``global_batch`` the rows one step trains on across all workers. ``uploading``: an
    asynchronous checkpoint is on its way to storage (``CheckpointConfig(upload="async")``).
    ``restored_from``: where the checkpoint the attempt resumes from was read, ``"memory"`` (this
    node's copy, checkpoint/memory.py) or ``"storage"``, once ``get_checkpoint`` handed it out.
    """

    epoch: Optional[int] = None
    epochs: Optional[int] = None
    step: Optional[int] = None
    steps: Optional[int] = None
    global_step: Optional[int] = None
    global_batch: Optional[int] = None
    uploading: bool = False
    restored_from: Optional[str] = None


@dataclass(frozen=True)
class CoordinatorHeld:
    """A parameter-server chief's ClusterCoordinator making no progress: reconnecting to the
    cluster after a step failed on a lost task, or holding scheduled functions of which none ends."""

    seconds: float
    why: str  # what holds it, to end "its ClusterCoordinator has been ..."


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer to a poll: reports since the last poll, its phase, its error."""

    rank: int
    phase: Phase
    reports: tuple[Report, ...] = ()
    failure: Optional[WorkerFailure] = None
    preempt_reason: Optional[str] = None  # set once this worker was asked to stop for a preemption
    activity: Optional[Activity] = None
    progress: Optional[Progress] = None
    # A parameter-server chief's: how long its ClusterCoordinator has been held, continuously as
    # sampled at each poll; None while it is not.
    coordinator_held: Optional[CoordinatorHeld] = None

    @property
    def finished(self) -> bool:
        return self.phase == Phase.FINISHED


@dataclass(frozen=True)
class GroupStatus:
    """The whole group's answer to a poll.

    ``ready``: every worker is ready to build the strategy (the driver then
    releases them together). ``finished``: every worker's ``train_fn``
    returned. ``stopped``: every worker is done, some because they stopped for
    a preemption. ``preempting``: a preemption was requested (a node is
    draining, a worker got SIGTERM), with ``preempt_reason``.
    """

    reports: tuple[Report, ...] = ()
    failures: tuple[WorkerFailure, ...] = ()
    finished: bool = False
    phases: dict[int, Phase] = field(default_factory=dict)
    preempting: bool = False
    preempt_reason: Optional[str] = None
    preempt_kind: FailureKind = FailureKind.PREEMPTED  # RESIZED: the group stops to grow
    stopped: bool = False
    progress: Optional[Progress] = None  # rank 0's, as last heard
    ready: bool = False
    # once per attempt: seconds per start-up phase (watch.py), and where the checkpoint was restored from
    startup: Optional[dict[str, Any]] = None


class PayloadKind(str, enum.Enum):
    """What a role's actors run, each a class in worker/payloads.py or worker/ps_payloads.py:
    ``train_fn`` in a thread under the strategy, or a command (an unmodified TF_CONFIG script) as a
    subprocess, or a parameter-server role."""

    TRAIN_FN = "train_fn"
    SUBPROCESS = "subprocess"
    # Parameter-server training (ParameterServerTrainer): the chief runs train_fn with the
    # coordinator; workers and ps run TensorFlow's server; the evaluator evaluates checkpoints.
    CHIEF = "chief"
    SERVER = "server"
    EVALUATOR = "evaluator"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class RoleSpec:
    """One role of a TensorFlow cluster: its name in TF_CONFIG ("worker", "chief", "ps",
    "evaluator"), how many actors (from ``min_count`` to ``max_count``: elastic where they
    differ), what each reserves, what each runs."""

    name: str
    min_count: int
    max_count: int
    bundle: dict[str, float]
    payload: PayloadKind = PayloadKind.TRAIN_FN


@dataclass(frozen=True)
class WorkerAddress:
    """Where one actor lives, the port it holds for TensorFlow's server, the GPUs it trains on
    (the ids CUDA_VISIBLE_DEVICES names: Ray's, or those a warm standby was handed), and its
    process on its node (0 where unknown)."""

    node_id: str
    node_ip: str
    port: int
    gpu_ids: tuple[str, ...] = ()
    pid: int = 0

    @property
    def host_port(self) -> str:
        return format_host_port(self.node_ip, self.port)


def format_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 addresses in brackets as gRPC expects."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


@dataclass(frozen=True)
class RankInfo:
    """The ranks of one worker. Workers on one node have contiguous world ranks."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int


@dataclass(frozen=True)
class TrainContext(RankInfo):
    """Who this worker is: its ranks (world, local, node) and world sizes, the attempt, the run.

    Attribute and ``get_*`` spellings both work (Ray Train uses the latter).
    """

    attempt: int = 0
    run_name: str = ""
    run_path: str = ""
    tf_config: str = "{}"
    task_type: str = "worker"  # TF_CONFIG's task: "chief" in ParameterServerTrainer's train_fn
    task_index: int = 0

    # Ray Train's spellings.
    def get_world_rank(self) -> int:
        return self.world_rank  # noqa: E704

    def get_world_size(self) -> int:
        return self.world_size  # noqa: E704

    def get_local_rank(self) -> int:
        return self.local_rank  # noqa: E704

    def get_local_world_size(self) -> int:
        return self.local_world_size  # noqa: E704

    def get_node_rank(self) -> int:
        return self.node_rank  # noqa: E704

    def get_experiment_name(self) -> str:
        return self.run_name  # noqa: E704

    @property
    def is_chief(self) -> bool:
        return self.world_rank == 0


@dataclass(frozen=True)
class UserCode:
    """What a run's actors execute, as ``RunSpec.payload`` carries it (cloudpickled): ``train_fn``
    and its config; for a parameter-server run also ``evaluate_fn`` and the variable partitioner;
    for a launched script (``raytf launch``) its command line instead."""

    train_fn: Any = None
    config: dict = field(default_factory=dict)
    evaluate_fn: Any = None
    variable_partitioner: Any = None
    hold_updates: bool = True  # ParameterServerTrainer(hold_updates=...)
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class TensorflowSettings:
    """TensorflowConfig as resolved for one run's workers: communication decided from the
    bundles, thread pools sized from the CPUs each worker holds."""

    communication: str
    collective_timeout_s: Optional[float]
    intra_op_threads: int
    inter_op_threads: int  # 0: TensorFlow sizes the pool (a parameter-server task's default)
    use_gpu: bool
    gpu_memory_growth: bool = False
    env: dict[str, str] = field(default_factory=dict)  # TensorflowConfig.worker_env
    keras: str = "auto"
    mixed_precision: Optional[str] = None
    log_level: str = "error"  # TensorFlow's C++ lines shown
    bytes_per_pack: int = 0  # all-reduce fusion
    gradient_compression: Optional[str] = None  # "bfloat16", "float16"
    error_feedback: bool = False
    start_method: str = "auto"  # "forkserver", "spawn" or "auto" (driver/forkserver.py decides)


@dataclass(frozen=True)
class RunSpec:
    """What every worker of a run shares, built once by the driver."""

    run_name: str
    run_path: str  # as shown: storage.redact's, no credentials
    payload: bytes  # a cloudpickled UserCode
    tensorflow: TensorflowSettings
    storage: Optional[StorageRef] = None
    lease_token: Optional[str] = None  # the driver's claim on the run: checked before each upload
    save_every: Optional[SaveEvery] = None  # CheckpointConfig's schedule, for ReportCallback
    upload: CheckpointUpload = CheckpointUpload.SYNC  # CheckpointConfig.upload
    restore_from_memory: bool = False  # CheckpointConfig.restore_from_memory
    split: tuple[str, ...] = ()  # DataConfig: the datasets split across the workers
    # Modules of raytf's public layer that plug into a worker's start, by name (so the worker imports
    # nothing above it): imported while it loads, then ``on_strategy(strategy, keras3)`` once its
    # strategy is up (raytf.keras._keras3 routes Keras 3's fit there).
    plugins: tuple[str, ...] = ()

    @property
    def store(self) -> StorageRef:
        """The run's storage; every run the driver starts has one (raytf's own tests may leave it out)."""
        if self.storage is None:
            raise ValueError(f"run {self.run_name} has no storage")
        return self.storage

    # The run's URI with the credentials the user put in it, for a launched script that opens the
    # storage itself (RAYTF_RUN_DIR); never printed. Empty: run_path is the whole URI.
    run_uri: str = ""


@dataclass(frozen=True)
class TaskId:
    """A task of a parameter-server cluster as TF_CONFIG names it: its job and index."""

    type: str  # "chief", "worker", "ps", "evaluator"
    index: int

    def __str__(self) -> str:  # "worker 1": how logs and errors name it
        return f"{self.type} {self.index}"


@dataclass(frozen=True)
class WorkerSpec:
    """One actor's place in one attempt (with the :class:`RunSpec` every actor shares)."""

    role: str
    rank: RankInfo
    tf_config: str
    attempt: int
    resume: ResumePoint = ResumePoint()
    datasets: dict[str, Any] = field(default_factory=dict)  # name -> ray.data.DataIterator
    task: Optional["TaskId"] = None  # its TF_CONFIG task in a parameter-server group
    # The attempt's placement group (hex id): the owner of its checkpoints' memory copies, also for a
    # worker that runs outside it (a warm standby, a survivor; group.py's floating workers).
    placement_group: str = ""

    @property
    def ps_task(self) -> "TaskId":
        """Its task in a parameter-server group; only such groups' payloads ask."""
        if self.task is None:
            raise ValueError(f"the {self.role} of rank {self.rank.world_rank} has no parameter-server task")
        return self.task

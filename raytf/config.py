"""What a user sets: scaling, run, failure handling and TensorFlow options.

Each config is a frozen dataclass that validates in ``__post_init__`` and says
what it received and what is allowed, so a bad value fails on the driver before
any actor starts. Names follow Ray Train's where they mean the same thing.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from raytf._internal import env as _env
from raytf._internal.redact import redact
from raytf._internal.validate import (
    check_bool,
    check_choice,
    check_count,
    check_int,
    check_number,
    check_resources,
    check_storage,
    check_timeout,
)
from raytf.errors import ConfigError
from raytf.policies import FailurePolicy, ScalingPolicy
from raytf.tensorflow_config import (  # noqa: F401 - raytf.config names every config
    COMMUNICATIONS,
    GRADIENT_COMPRESSIONS,
    KERAS_VERSIONS,
    LOG_LEVELS,
    MIXED_PRECISION_POLICIES,
    TensorflowConfig,
)

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
RUN_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_WORKERS = 100_000  # far past any Ray cluster; a typo of 10**12 fails here, not in Ray


@dataclass(frozen=True)
class ScalingConfig:
    """How many workers, what each reserves, and how they are placed.

    One placement group holds one bundle per worker with ``placement`` as its
    strategy. ``placement_timeout_s`` bounds the wait for the cluster to fit the
    group (None waits forever, for autoscaling clusters that add nodes slowly).
    ``check_resources`` rejects, before anything is scheduled, a worker that no
    live node could ever hold; turn it off on an autoscaling cluster whose
    bigger nodes are not up yet.

    Elastic training: ``num_workers=(min, max)``. Every attempt first asks for
    ``max`` workers; when the cluster cannot place them within
    ``resize_timeout_s`` (a lost node's capacity has not come back), it tries
    each smaller size in turn, down to ``min``, for 5 s each, and starts with the
    first that fits (the guide on elastic groups says how long). ``policy``, a
    :class:`raytf.ScalingPolicy`, decides those sizes and waits, and when a group below
    its maximum grows back, instead (:class:`raytf.DefaultScalingPolicy` is the above). The per-worker batch of
    ``get_dataset_shard(batch_size=...)`` stays fixed (the global batch shrinks
    with the group); ``get_dataset_shard(global_batch_size=...)`` keeps the
    global batch and gives each worker its share instead.
    """

    num_workers: Union[int, tuple[int, int]] = 1
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    resources_per_worker: Mapping[str, float] = field(default_factory=dict)
    placement: str = "PACK"
    placement_timeout_s: Optional[float] = 120.0
    check_resources: bool = True
    resize_timeout_s: float = 60.0
    policy: Optional[ScalingPolicy] = None

    def __post_init__(self) -> None:
        if self.policy is not None and not isinstance(self.policy, ScalingPolicy):
            raise ConfigError(
                f"ScalingConfig.policy must be a raytf.ScalingPolicy (or None for raytf.DefaultScalingPolicy), "
                f"got {self.policy!r}"
            )
        object.__setattr__(self, "num_workers", check_count("ScalingConfig.num_workers", self.num_workers, MAX_WORKERS))
        if check_number("ScalingConfig.resize_timeout_s", self.resize_timeout_s) <= 0:
            raise ConfigError(f"ScalingConfig.resize_timeout_s must be > 0 seconds, got {self.resize_timeout_s!r}")
        check_number("ScalingConfig.cpus_per_worker", self.cpus_per_worker)
        check_number("ScalingConfig.gpus_per_worker", self.gpus_per_worker)
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ConfigError(
                f"ScalingConfig.gpus_per_worker above 1 must be a whole number, got {self.gpus_per_worker!r}"
            )
        resources = check_resources(
            "ScalingConfig.resources_per_worker",
            self.resources_per_worker,
            cpus="cpus_per_worker",
            gpus="gpus_per_worker",
        )
        check_bool("ScalingConfig.check_resources", self.check_resources)
        placement = check_choice("ScalingConfig.placement", self.placement, PLACEMENT_STRATEGIES, upper=True)
        object.__setattr__(self, "placement", placement)
        object.__setattr__(self, "resources_per_worker", resources)
        check_timeout("ScalingConfig.placement_timeout_s", self.placement_timeout_s)
        if not any(self._bundle().values()):
            raise ConfigError(
                "ScalingConfig reserves nothing per worker (cpus_per_worker=0, gpus_per_worker=0, "
                "no resources_per_worker): give each worker at least one CPU, GPU or custom resource"
            )

    def _bundle(self) -> dict[str, float]:
        """The placement-group bundle of one worker (zero amounts left out, as Ray wants)."""
        bundle = {"CPU": float(self.cpus_per_worker), "GPU": float(self.gpus_per_worker)}
        bundle.update({k: float(v) for k, v in self.resources_per_worker.items()})
        return {k: v for k, v in bundle.items() if v > 0}

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def elastic(self) -> bool:
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers


@dataclass(frozen=True)
class FailureConfig:
    """How many worker failures a run survives.

    A worker that dies (process killed, node lost) is retried while failures
    remain; ``max_failures=-1`` retries forever. An exception raised by
    ``train_fn`` is a bug, not bad luck: it is raised from ``fit()`` at once
    unless ``retry_on_exception`` is set. A worker that does not answer the
    driver for ``worker_timeout_s`` (stopped, swapping, wedged in native code)
    counts as lost, so a stall costs seconds, not TensorFlow's long defaults.
    A worker that has not joined the group ``start_timeout_s`` after the group
    was placed (its actor never came up, or it hangs importing or connecting)
    fails the attempt the same way, instead of leaving its peers waiting; until
    it has joined, its silence is judged by ``start_timeout_s`` alone (TensorFlow's
    import holds a worker's interpreter in native code for seconds on a busy node).

    ``policy``, a :class:`raytf.FailurePolicy`, makes each retry-or-raise decision instead
    (with a back-off, if it wants one); :class:`raytf.DefaultFailurePolicy` is what this page
    describes, and a subclass may change one decision and keep the rest.

    Some failures are retried whatever ``retry_on_exception`` says: a
    collective that failed because a peer went away (TensorFlow's
    Unavailable, DeadlineExceeded, Cancelled and Aborted errors), and
    preemptions, which do not count against ``max_failures`` at all. They have
    a budget of their own, ``max_preemptions`` (default 100, ``-1``: no
    limit), so a run on a cluster that preempts it without end stops, saying
    so, instead of restarting forever.

    ``hang_timeout_s`` ends a hang: when a rank has waited inside TensorFlow
    that long while another rank's ``train_fn`` returned, or sat in its own
    code outside TensorFlow as long, the attempt fails naming the latter
    (``"returned_early"``, raised like an exception; ``"stalled"``, retried
    like a lost worker). In parameter-server training it also bounds how long
    the chief's coordinator may be held: reconnecting to a lost task
    (TensorFlow redials its address with no timeout, every step waiting), or
    holding scheduled functions of which none ends. Past it the attempt fails
    as ``"stalled"``: set it above the longest a function you schedule runs
    (a Keras ``steps_per_execution`` of slow steps). ``None`` turns it off.

    ``warm_standby`` makes restarts start warm: raytf starts one standby
    process per worker on the same node, which imports TensorFlow and loads
    ``train_fn`` and then waits, holding no CPU or GPU of its own, and once
    the attempt trains it keeps each rank's shard (as it read it whole) in
    Ray's object store. When the group restarts (a failure within
    ``max_failures``, or a preemption), each new bundle on a node with a
    standby is handed to it instead of a cold actor, skipping the process
    start and TensorFlow's import, and a restart of the same size reads the
    kept shards instead of splitting the data again (seconds per restart). It
    costs one idle process per worker (its memory, and its import's CPU once
    per attempt) and a second copy of the shards in object-store memory.
    ``"auto"`` (the default) gives GPU workers standbys, started with the
    attempt's own workers so that a failure in its first seconds already
    restarts warm, and CPU workers none: a standby loads at the lowest CPU
    priority, but on a node whose cores the workers use it holds memory and
    takes its import's CPU every attempt, while a GPU node's cores are mostly
    idle and its cold restart is long (what standbys cost and save, measured
    on both: the Benchmarks pages, recovery). ``True``
    gives CPU workers standbys too, started once the attempt trains (its first
    step or report), so that they never slow its start; ``False`` none.
    A GPU worker's standby takes the GPUs of the bundle it is handed
    (CUDA_VISIBLE_DEVICES, set before TensorFlow first lists its devices);
    until then no GPU waits on it. For raytf.Trainer (a parameter-server
    run's workers are replaced one by one instead, and ``"auto"`` is off).

    ``keep_survivors`` makes a restart start only the workers it lost: the
    ranks that outlived the attempt train the next one in their own
    processes, TensorFlow and ``train_fn``'s modules still loaded. As the
    attempt ends, each has its collectives aborted, its ``train_fn`` stopped
    and TensorFlow's eager context made new; a restart on the same placement
    group hands each its own bundle back, and one placed anew (the group
    shrank or grew, a node went away) a bundle on its node. A CPU worker
    runs outside the placement group for this, pinned to its bundle's node
    while the bundle reserves its CPUs; a GPU worker holds its bundle and is
    kept only while the placement group is. A process whose ``train_fn``
    does not end within 3 s of its collectives failing is killed and
    started anew. Modules stay imported across attempts: a
    TensorFlow object a module makes when imported belongs to the attempt
    that imported it (make such objects inside ``train_fn``, or set this
    to False). ``"auto"`` (the default) keeps CPU workers, ``True`` GPU
    workers too, ``False`` none. For raytf.Trainer; for
    raytf.ParameterServerTrainer, a restart (a lost chief or ps) keeps the
    workers' processes with their servers, each serving the new chief as
    the same task, and starts the chief, the parameter servers and the
    evaluator anew.
    """

    max_failures: int = 0
    retry_on_exception: bool = False
    worker_timeout_s: float = 30.0
    start_timeout_s: float = 120.0
    hang_timeout_s: Optional[float] = 300.0
    warm_standby: Union[bool, str] = "auto"
    keep_survivors: Union[bool, str] = "auto"
    max_preemptions: int = 100
    policy: Optional[FailurePolicy] = None

    def __post_init__(self) -> None:
        if self.policy is not None and not isinstance(self.policy, FailurePolicy):
            raise ConfigError(
                f"FailureConfig.policy must be a raytf.FailurePolicy (or None for raytf.DefaultFailurePolicy), "
                f"got {self.policy!r}"
            )
        check_int("FailureConfig.max_failures", self.max_failures, minimum=-1)
        check_int("FailureConfig.max_preemptions", self.max_preemptions, minimum=-1)
        for name in ("worker_timeout_s", "start_timeout_s"):
            value = getattr(self, name)
            if check_number(f"FailureConfig.{name}", value) <= 0:
                raise ConfigError(f"FailureConfig.{name} must be > 0 seconds, got {value!r}")
        check_timeout("FailureConfig.hang_timeout_s", self.hang_timeout_s)
        check_bool("FailureConfig.retry_on_exception", self.retry_on_exception)
        if not (isinstance(self.warm_standby, bool) or self.warm_standby == "auto"):
            raise ConfigError(f'FailureConfig.warm_standby must be True, False or "auto", got {self.warm_standby!r}')
        if not (isinstance(self.keep_survivors, bool) or self.keep_survivors == "auto"):
            raise ConfigError(
                f'FailureConfig.keep_survivors must be True, False or "auto", got {self.keep_survivors!r}'
            )

    def _keeps_survivors(self, gpu_workers: bool) -> bool:
        """Whether this run's restarts keep the ranks that outlived the attempt (driver/survivors.py)."""
        return self.keep_survivors is True or (self.keep_survivors == "auto" and not gpu_workers)

    def _standbys(self, gpu_workers: bool) -> Optional[str]:
        """When this run's restarts get warm standbys: ``"at_start"`` (GPU workers: started with the
        attempt's workers), ``"when_trained"`` (CPU workers with ``warm_standby=True``), or None."""
        if self.warm_standby is False or (self.warm_standby == "auto" and not gpu_workers):
            return None
        return "at_start" if gpu_workers else "when_trained"


@dataclass(frozen=True)
class CheckpointConfig:
    """Which committed checkpoints to keep.

    ``num_to_keep=None`` keeps all. With ``score_attribute`` the best
    ``num_to_keep`` by that reported metric are kept (``mode`` "max" or "min");
    the latest committed checkpoint is always kept, whatever its score,
    because it is the one a restart resumes from.

    ``every_n_epochs`` or ``every_n_steps`` thins out what is saved: a
    checkpoint passed to ``raytf.report`` is written only when the reported
    ``epoch`` (or ``step``) is at least n past the last one saved, so a
    training loop can pass one every epoch and let the config decide. Every
    rank makes the same decision from the same metrics, so saves that need
    every rank (``Checkpoint.from_state``) stay in step.

    ``upload`` says when ``raytf.report(..., checkpoint=...)`` returns. ``"async"`` (the default):
    once the checkpoint is in host memory (``Checkpoint.from_state`` written, a
    ``from_directory`` directory copied, both into ``/dev/shm``), so the directory may be deleted at
    once; the upload and the commit go on in the background, one checkpoint at a time (a report
    with a checkpoint made while the previous one is still on its way waits for that one's
    commit), and ``fit()`` returns once the last one is committed. A failed upload is tried again
    (3 tries); what still fails is raised by the next ``raytf.report`` and fails the worker, and
    the run restarts from the last committed checkpoint. ``"sync"``: once the driver has committed
    the checkpoint, so a checkpoint whose report returned survives any loss after it. Collective
    reports (``ranks="all"``, ``raytf.train.report``) are synchronous either way.

    ``restore_from_memory`` (on by default): the newest committed checkpoint stays in host memory
    on the chief's node (its snapshot, renamed rather than deleted: no copy, one checkpoint's size
    of ``/dev/shm``), and a restart (a warm standby, or a new actor on the same node, where raytf
    keeps the attempt's placement across restarts) reads it from there instead of from storage
    when it is the checkpoint the attempt resumes from and every file matches the CRC32 the
    committed manifest records; otherwise from storage. ``result.startup`` says which, per
    attempt (``restored_from``). Turn it off where host memory is scarcer than restart time.
    """

    num_to_keep: Optional[int] = None
    score_attribute: Optional[str] = None
    mode: str = "max"
    every_n_epochs: Optional[int] = None
    every_n_steps: Optional[int] = None
    upload: str = "async"
    restore_from_memory: bool = True

    def __post_init__(self) -> None:
        if self.num_to_keep is not None:
            check_int("CheckpointConfig.num_to_keep", self.num_to_keep, minimum=1)
        for name in ("every_n_epochs", "every_n_steps"):
            if getattr(self, name) is not None:
                check_int(f"CheckpointConfig.{name}", getattr(self, name), minimum=1)
        if self.every_n_epochs is not None and self.every_n_steps is not None:
            raise ConfigError(
                "CheckpointConfig: set every_n_epochs or every_n_steps, not both "
                f"(got every_n_epochs={self.every_n_epochs}, every_n_steps={self.every_n_steps})"
            )
        if self.mode not in ("max", "min"):
            raise ConfigError(f"CheckpointConfig.mode must be 'max' or 'min', got {self.mode!r}")
        if self.upload not in ("async", "sync"):
            raise ConfigError(
                f"CheckpointConfig.upload must be 'async' (report returns once the checkpoint is in host memory) "
                f"or 'sync' (once it is committed), got {self.upload!r}"
            )
        if not isinstance(self.restore_from_memory, bool):
            raise ConfigError(
                f"CheckpointConfig.restore_from_memory must be True or False, got {self.restore_from_memory!r}"
            )
        if self.score_attribute is not None and not isinstance(self.score_attribute, str):
            raise ConfigError(f"CheckpointConfig.score_attribute must be a metric name, got {self.score_attribute!r}")


def default_storage_path() -> str:
    """``$RAYTF_STORAGE_PATH`` (a cluster sets it for every driver), or ``~/raytf_results``."""
    return os.environ.get(_env.STORAGE_PATH) or _env.DEFAULT_STORAGE_PATH


@dataclass(frozen=True)
class RunConfig:
    """Where a run keeps its results and how it reports progress.

    Results go to ``<storage_path>/<name>``; ``storage_path`` defaults to the
    environment variable ``RAYTF_STORAGE_PATH`` (the configs in ``cluster/``
    set it to the cloud's object store for every driver) or ``~/raytf_results``.
    ``name`` is one path component of
    letters, digits, ``.``, ``_`` and ``-``, so it can never point outside the
    storage root. ``storage_path`` is a local directory or a ``pyarrow.fs`` URI
    (``s3://bucket/prefix``); or pass ``storage_filesystem`` (a
    ``pyarrow.fs.FileSystem`` with your endpoint and credentials, as Ray Train
    takes it) and make ``storage_path`` a path on it. ``resume="auto"`` continues a run of the same
    name and storage path from its latest committed checkpoint (after a lost
    driver, say); ``"never"`` refuses to reuse a run that has checkpoints.
    ``verbose=0`` silences the per-report progress lines.
    """

    name: Optional[str] = None
    storage_path: Union[str, os.PathLike, None] = None
    storage_filesystem: Any = None
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: str = "auto"
    verbose: int = 1

    def __post_init__(self) -> None:
        if self.storage_path is None:
            object.__setattr__(self, "storage_path", default_storage_path())
        if self.name is not None and (
            not isinstance(self.name, str) or not RUN_NAME_PATTERN.fullmatch(self.name) or self.name in (".", "..")
        ):
            raise ConfigError(
                f"RunConfig.name must be one path component of letters, digits, '.', '_' and '-' "
                f"(at most 128 characters, not starting with '.'), got {self.name!r}"
            )
        check_storage(self.storage_path, self.storage_filesystem)
        if not isinstance(self.failure_config, FailureConfig):
            raise ConfigError(f"RunConfig.failure_config must be a raytf.FailureConfig, got {self.failure_config!r}")
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ConfigError(
                f"RunConfig.checkpoint_config must be a raytf.CheckpointConfig, got {self.checkpoint_config!r}"
            )
        if self.resume not in ("auto", "never"):
            raise ConfigError(f"RunConfig.resume must be 'auto' or 'never', got {self.resume!r}")
        check_int("RunConfig.verbose", self.verbose, minimum=0)

    def __repr__(self) -> str:  # the storage path as raytf shows it: no credentials (raytf._internal.redact)
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["storage_path"] = redact(shown["storage_path"])
        return "RunConfig(" + ", ".join(f"{name}={value!r}" for name, value in shown.items()) + ")"


@dataclass(frozen=True)
class DataConfig:
    """Which of ``Trainer(datasets=...)`` are split across workers.

    A split dataset gives each worker its own equal share; any other dataset is
    given whole to every worker. ``"all"`` splits every dataset, as Ray Train does.

    ``exactly_once=True`` (default): every row of an epoch is trained exactly
    once, whatever happens to the group. Each split dataset is materialized
    once per run, in order (``preserve_order``), into Ray's object store, and
    every checkpoint raytf commits records where each one stands (a few
    integers); a restart after a kill or a preemption, on fewer or more
    workers, or from a new driver, trains the rest of the interrupted epoch,
    spread over the new group, and then whole epochs. The group that starts
    an epoch cuts the rows into one run per worker; with ``shuffle=True`` each
    worker's run is permuted anew every epoch (seeded by
    ``get_dataset_shard(seed=...)``, else by a seed the run keeps in its
    checkpoints). The cost: the dataset stays in the object store for the run
    (spilled to disk past it). ``False``: ``streaming_split`` per attempt, as Ray
    Train does (no copy kept; a pipeline too large to materialize), where a
    resume in mid-epoch trains some rows twice and some never.
    """

    datasets_to_split: Union[str, Sequence[str]] = "all"  # kept as a tuple
    exactly_once: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.exactly_once, bool):
            raise ConfigError(f"DataConfig.exactly_once must be True or False, got {self.exactly_once!r}")
        value = self.datasets_to_split
        if isinstance(value, str):
            if value != "all":
                raise ConfigError(
                    f"DataConfig.datasets_to_split must be 'all' or a list of dataset names, got {value!r}"
                )
            return
        try:
            names = tuple(value)
        except TypeError:
            names = None
        if names is None or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"DataConfig.datasets_to_split must be 'all' or a list of dataset names, got {value!r}")
        object.__setattr__(self, "datasets_to_split", names)

    def _split(self, names: Sequence[str]) -> set[str]:
        """The names to split, checked against the datasets passed."""
        if self.datasets_to_split == "all":
            return set(names)
        unknown = [n for n in self.datasets_to_split if n not in names]
        if unknown:
            raise ConfigError(
                f"DataConfig.datasets_to_split names {', '.join(map(repr, unknown))}, but "
                f"Trainer(datasets=...) has only {', '.join(map(repr, names)) or 'none'}"
            )
        return set(self.datasets_to_split)

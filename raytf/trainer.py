"""``raytf.Trainer``: validate, place, run ``train_fn`` on every worker, return a Result.

The trainer puts the parts together and runs them: the preflight checks
(driver/preflight.py, with facts from driver/cluster.py), the run's lease
(lease.py), its checkpoints (checkpoint/manager.py) and history
(driver/history.py), a worker group (driver/group.py) and the
controller that watches it and restarts it (driver/controller.py).
"""

from __future__ import annotations

import datetime
import logging
import signal
import threading
from typing import Any, Callable, Optional

from raytf._internal import env as _env
from raytf._internal.checkpoint.manager import CheckpointManager
from raytf._internal.driver import cluster
from raytf._internal.driver.controller import Controller
from raytf._internal.driver.failure import FailureBook
from raytf._internal.driver.history import RunHistory, load_history, record_start, report_handler
from raytf._internal.driver.preflight import check_group, file_sources, too_few_rows, unreadable_files, unseen_storage
from raytf._internal.driver.progress import ProgressDisplay, format_metrics
from raytf._internal.driver.scaling import ElasticPolicy
from raytf.policies import DefaultScalingPolicy
from raytf._internal.driver.tensorboard import EventWriter
from raytf._internal.lease import RunLease
from raytf._internal.protocol import (
    CheckpointUpload,
    PayloadKind,
    ResumePoint,
    RoleSpec,
    RunSpec,
    SaveEvery,
    StorageRef,
    TensorflowSettings,
    UserCode,
)
from raytf._internal.storage import RunStorage
from raytf.config import CheckpointConfig, DataConfig, RunConfig, ScalingConfig, TensorflowConfig
from raytf.errors import ConfigError, RunInUseError
from raytf.result import Result

logger = logging.getLogger(__name__)


class _StopSignals:
    """While fit() runs, Ctrl-C raises KeyboardInterrupt and SIGTERM (``ray job stop``, a
    scheduler's kill) raises SystemExit, so the worker group is torn down on the way out
    instead of abandoned.

    fit() installs its own handlers rather than trusting the inherited ones: a library that
    ran earlier in the process may have left a SIGINT handler that only sets a flag (Ray Tune
    leaves one after ``Tuner.fit()``), and then Ctrl-C would never stop the run. A signal's
    exception can still be lost when it lands while Python runs a finalizer (it is printed as
    "Exception ignored"), so the signal is also recorded and ``raise_pending()``, called by the
    controller on every poll, raises it again. A SIGINT that was ignored (``nohup``) stays so.
    """

    def __init__(self) -> None:
        self.pending: Optional[int] = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "_StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be set from the main thread
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum)
            if signum == signal.SIGINT and previous == signal.SIG_IGN:
                continue
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.pending = signum
        self._raise(signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def raise_pending(self) -> None:
        if self.pending is not None:
            signum, self.pending = self.pending, None
            self._raise(signum)


def _check_datasets(datasets: Optional[dict[str, Any]]) -> dict[str, Any]:
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise ConfigError(
            f"Trainer(datasets=...) must be a dict of name to ray.data.Dataset, got {type(datasets).__name__}"
        )
    from ray.data import Dataset

    from raytf._internal.data.files import FileSource

    for name, dataset in datasets.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Trainer(datasets=...): dataset names must be non-empty str, got {name!r}")
        if not isinstance(dataset, (Dataset, FileSource)):
            raise ConfigError(
                f"Trainer(datasets={{{name!r}: ...}}) must be a ray.data.Dataset or raytf.data.tfrecord_files / "
                f"parquet_files, got {type(dataset).__name__}; wrap in-memory data with ray.data.from_numpy or "
                "from_pandas"
            )
    return dict(datasets)


def _default_run_name() -> str:
    return "raytf_" + datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def _save_every(kept: CheckpointConfig) -> Optional[SaveEvery]:
    if kept.every_n_epochs:
        return SaveEvery("epoch", kept.every_n_epochs)
    if kept.every_n_steps:
        return SaveEvery("step", kept.every_n_steps)
    return None


class Trainer:
    """Runs ``train_fn(config)`` on ``scaling.num_workers`` Ray actors under one
    MultiWorkerMirroredStrategy, and restarts the group when a worker is lost.

    ``train_fn`` may take the config dict or no argument. Inside it,
    ``raytf.get_context()``, ``raytf.strategy()`` and ``raytf.report()`` work.
    """

    def __init__(
        self,
        train_fn: Callable[..., Any],
        *,
        config: Optional[dict[str, Any]] = None,
        scaling: Optional[ScalingConfig] = None,
        run: Optional[RunConfig] = None,
        tensorflow: Optional[TensorflowConfig] = None,
        datasets: Optional[dict[str, Any]] = None,
        data_config: Optional[DataConfig] = None,
    ):
        if not callable(train_fn):
            raise ConfigError(f"Trainer(train_fn): train_fn must be callable, got {train_fn!r}")
        if config is not None and not isinstance(config, dict):
            raise ConfigError(f"Trainer(config=...) must be a dict, got {type(config).__name__}")
        for name, value, kind in (
            ("scaling", scaling, self._scaling_type),
            ("run", run, RunConfig),
            ("tensorflow", tensorflow, TensorflowConfig),
            ("data_config", data_config, DataConfig),
        ):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(
                    f"{type(self).__name__}({name}=...) must be a raytf.{kind.__name__}, got {type(value).__name__}"
                )
        self.train_fn = train_fn
        self.config = dict(config or {})
        self.scaling: Any = scaling or self._scaling_type()
        self.run = run or RunConfig()
        self.tensorflow = tensorflow or TensorflowConfig()
        self.datasets = _check_datasets(datasets)
        self.data_config = data_config or DataConfig()
        # Cross-field checks that need no cluster, before anything starts.
        self.tensorflow._resolve_communication(self.scaling)
        self.data_config._split(list(self.datasets))
        if self.run.failure_config.warm_standby is True:
            if not self._warm_standby_works:
                raise ConfigError(
                    f"FailureConfig.warm_standby: {type(self).__name__} has no warm standby (its workers are "
                    "replaced, or run a script, rather than restarted from train_fn); leave it off"
                )

    def _workers_text(self) -> str:
        scaling = self.scaling
        return f"{scaling.min_workers} to {scaling.max_workers}" if scaling.elastic else str(scaling.max_workers)

    def fit(self) -> Result:
        """Train to the end and return the result; raise TrainingFailedError if a worker failed
        and no retry was left. Ctrl-C stops every worker and frees the placement group."""
        import ray

        _env.check()  # every RAYTF_* setting, before anything starts
        if not ray.is_initialized():
            ray.init()
        name = self.run.name or _default_run_name()
        display = ProgressDisplay(name, self.run.verbose)
        self._preflight(display)
        payload = self._payload()
        assert self.run.storage_path is not None  # RunConfig puts the default in
        storage = RunStorage(self.run.storage_path, name, self.run.storage_filesystem)
        storage.check_writable()
        lease = RunLease(storage.filesystem, storage.root, name, ttl_s=_env.get_float(_env.LEASE_TTL_S))
        with _StopSignals() as stop_signals:
            lease.acquire()  # before anything of the run is read or written
            try:
                return self._fit_holding(name, storage, lease, payload, display, stop_signals)
            finally:
                lease.release()

    _payload_kind = PayloadKind.TRAIN_FN  # what the workers run
    _scaling_type: type = ScalingConfig  # the scaling config this trainer takes (ParameterServerScaling there)

    def _has_evaluator(self) -> bool:
        """Whether an evaluator reads committed checkpoints while the run trains."""
        return False

    # FailureConfig.warm_standby and keep_survivors: restarts hand ranks to processes with train_fn loaded
    _warm_standby_works = True

    def _payload(self) -> bytes:
        """What every worker is sent to run: ``train_fn`` and its config, pickled."""
        from ray import cloudpickle

        try:
            return cloudpickle.dumps(UserCode(train_fn=self.train_fn, config=self.config))
        except Exception as error:
            raise ConfigError(
                f"Trainer: train_fn and config must be picklable to reach the workers: {error}"
            ) from error

    def _preflight(self, display: ProgressDisplay) -> None:
        """Refuse, before anything starts, what can never run here; say when the group waits for
        the autoscaler to add nodes."""
        from ray.data.dataset import MaterializedDataset

        bundle = self.scaling._bundle()
        if self.scaling.check_resources:
            problem, waits_for = check_group(
                bundle,
                self.scaling.min_workers,
                cluster.live_node_resources(),
                cluster.node_types(),
                [
                    n
                    for n, d in self.datasets.items()
                    if not isinstance(d, MaterializedDataset) and n not in file_sources(self.datasets)
                ],
                cluster.cluster_cpus(),
            )
            if problem:
                raise ConfigError(problem)
            if waits_for:
                display.message(
                    f"no live node can hold a worker of {bundle}; the autoscaler can add "
                    f"{' or '.join(waits_for)} nodes, so the group waits for them"
                )
        split = self.data_config._split(list(self.datasets))
        for dataset_name, dataset in self.datasets.items():
            if isinstance(dataset, MaterializedDataset):  # its row count is known without running anything
                problem = too_few_rows(dataset_name, dataset.count(), self.scaling.max_workers, dataset_name in split)
                if problem:
                    raise ConfigError(problem)
        for dataset_name, source in file_sources(self.datasets).items():
            problem = unreadable_files(dataset_name, source)
            if problem:
                raise ConfigError(problem)

    def _check_storage_is_shared(self, storage: RunStorage) -> None:
        """On a multi-node cluster, refuse a local storage path that some worker node cannot see."""
        import pyarrow.fs as pafs

        if isinstance(storage.filesystem, pafs.LocalFileSystem):
            problem = unseen_storage(storage.root, cluster.nodes_seeing(storage.root, self.scaling._bundle()))
            if problem:
                raise ConfigError(problem)

    def _run_spec(self, name: str, storage: RunStorage, lease: RunLease, payload: bytes) -> RunSpec:
        return RunSpec(
            run_name=name,
            run_path=storage.uri,
            run_uri=storage.full_uri,
            payload=payload,
            tensorflow=self._tensorflow_settings(),
            storage=StorageRef(storage.filesystem, storage.root),
            lease_token=lease.token,
            save_every=_save_every(self.run.checkpoint_config),
            upload=CheckpointUpload(self.run.checkpoint_config.upload),
            restore_from_memory=self.run.checkpoint_config.restore_from_memory,
            split=tuple(sorted(self.data_config._split(list(self.datasets)))),
            plugins=("raytf.keras._keras3",),
        )

    def _tensorflow_settings(self) -> TensorflowSettings:
        """The TensorflowConfig as this run's workers apply it."""
        intra, inter = self.tensorflow._threads(self.scaling)
        tensorflow = self.tensorflow
        return TensorflowSettings(
            communication=tensorflow._resolve_communication(self.scaling),
            collective_timeout_s=tensorflow.collective_timeout_s,
            intra_op_threads=intra,
            inter_op_threads=inter,
            use_gpu=self.scaling.use_gpu,
            gpu_memory_growth=tensorflow.gpu_memory_growth,
            env=dict(tensorflow.worker_env),
            keras=tensorflow.keras,
            mixed_precision=tensorflow.mixed_precision,
            log_level=tensorflow.log_level,
            bytes_per_pack=tensorflow.bytes_per_pack,
            gradient_compression=tensorflow.gradient_compression,
            error_feedback=tensorflow.error_feedback,
            start_method=tensorflow._resolve_start_method(self.scaling),
        )

    def _make_group(self, run: RunSpec, display: ProgressDisplay) -> Any:
        """This trainer's worker group: one role, "worker", running ``train_fn`` under MWMS."""
        from raytf._internal.driver.callbacks import DrainWatch, MemoryCopies, StartupTiming
        from raytf._internal.driver.group import WorkerGroup
        from raytf._internal.driver.shapes import MirroredShape
        from raytf._internal.driver.warm import WarmStandbys

        failures = self.run.failure_config
        callbacks: list[Any] = [StartupTiming(), DrainWatch()]
        if run.restore_from_memory:
            callbacks.append(MemoryCopies())
        if self._warm_standby_works and failures._keeps_survivors(gpu_workers=self.scaling.gpus_per_worker > 0):
            from raytf._internal.driver.survivors import Survivors

            callbacks.append(Survivors())  # before WarmStandbys: a survivor takes its own bundle first
        standbys = (
            failures._standbys(gpu_workers=self.scaling.gpus_per_worker > 0) if self._warm_standby_works else None
        )
        if standbys is not None:
            callbacks.append(WarmStandbys(self.datasets, run.split, at_start=standbys == "at_start"))
        if self.scaling.min_workers < self.scaling.max_workers:
            from raytf._internal.driver.growth import GrowBack

            callbacks.append(GrowBack(self.scaling.policy or DefaultScalingPolicy()))
        if (self.data_config.exactly_once and run.split) or file_sources(self.datasets):
            from raytf._internal.driver.plans import ExactData

            callbacks.append(ExactData(self.datasets, run.split, self.data_config.exactly_once))
        return WorkerGroup(
            run,
            [
                RoleSpec(
                    "worker",
                    self.scaling.min_workers,
                    self.scaling.max_workers,
                    self.scaling._bundle(),
                    self._payload_kind,
                )
            ],
            MirroredShape(hang_timeout_s=failures.hang_timeout_s),
            placement_strategy=self.scaling.placement,
            elastic=ElasticPolicy(
                self.scaling.min_workers,
                self.scaling.max_workers,
                self.scaling.placement_timeout_s,
                self.scaling.resize_timeout_s,
                policy=self.scaling.policy or DefaultScalingPolicy(),
                scaling=self.scaling,
            ),
            datasets=self.datasets,
            worker_timeout_s=failures.worker_timeout_s,
            start_timeout_s=failures.start_timeout_s,
            notify=display.message,
            callbacks=callbacks,
        )

    @staticmethod
    def _on_status(display: ProgressDisplay, startups: list, attempt: int, status: Any) -> None:
        display.update(attempt, status.progress)
        if status.startup:
            startups.append({"attempt": attempt, **status.startup})
            display.message(
                "start-up: "
                + ", ".join(
                    f"{name.replace('_', ' ')} {value:.1f} s"
                    if isinstance(value, (int, float))
                    else f"{name.replace('_', ' ')} {value}"
                    for name, value in status.startup.items()
                )
            )

    def _group_text(self) -> str:
        workers = self._workers_text()
        return f"{workers} worker{'' if workers == '1' else 's'} x {self.scaling._bundle()} ({self.scaling.placement})"

    def _fit_holding(
        self,
        name: str,
        storage: RunStorage,
        lease: RunLease,
        payload: bytes,
        display: ProgressDisplay,
        stop_signals: "_StopSignals",
    ) -> Result:
        self._check_storage_is_shared(storage)
        kept = self.run.checkpoint_config
        checkpoints = CheckpointManager(
            storage.filesystem,
            storage.root,
            num_to_keep=kept.num_to_keep,
            score_attribute=kept.score_attribute,
            mode=kept.mode,
            evaluator=self._has_evaluator(),
        )
        if checkpoints.entries and self.run.resume == "never":
            raise ConfigError(
                f"RunConfig(resume='never'), but run {name!r} in {storage.uri} already has "
                f"{len(checkpoints.entries)} committed checkpoint(s): pick a new RunConfig.name, or "
                "resume='auto' to continue it"
            )
        previous = load_history(storage)
        driver_start = record_start(storage, name)
        history = RunHistory(
            storage,
            display,
            driver_start,
            previous,
            EventWriter(storage.filesystem, storage.root, driver_start),
            guard=lease.check,
        )
        failures = self.run.failure_config
        group = self._make_group(self._run_spec(name, storage, lease, payload), display)

        def resume_point() -> ResumePoint:
            resume = checkpoints.resume_point()
            if resume.entry is not None:
                display.message(f"resuming from {resume.entry.name} (epoch={resume.epoch}, step={resume.step})")
            return resume

        policy = FailureBook(failures)
        startups: list[dict[str, float]] = []  # each attempt's start-up, phase by phase
        on_report = report_handler(checkpoints, history, driver_start, guard=lease.check, acknowledge=group.acknowledge)

        def guard() -> None:  # between polls: a signal to stop, or the run's lease lost
            stop_signals.raise_pending()
            lease.ensure_held()

        def on_status(attempt: int, status: Any) -> None:
            self._on_status(display, startups, attempt, status)
            on_report.phases(attempt, status.phases)

        controller = Controller(
            group,
            policy,
            on_report,
            resume_point=resume_point,
            poll_interval_s=_env.get_float(_env.POLL_INTERVAL_S),
            failure_grace_s=_env.get_float(_env.FAILURE_GRACE_S),
            guard=guard,
            on_status=on_status,
        )
        display.message(
            f"starting {self._group_text()}; results in {storage.uri}"
            + (f"; driver start {driver_start} of this run" if driver_start else "")
        )
        try:
            finished = controller.run()
        finally:
            try:
                checkpoints.finish()
            except OSError as error:
                logger.warning("checkpoints that retention dropped were not all deleted: %s", error)
            display.close()
            try:
                history.flush()
            except RunInUseError as error:
                logger.error("history.json not written: %s", error)
        display.message(f"finished: {format_metrics(history.last_metrics) or '(no reports)'}")
        return Result(
            metrics=history.last_metrics,
            history=list(history.entries),
            path=storage.uri,
            attempts=finished.attempt + 1,
            checkpoint=checkpoints.newest(),
            failures=list(policy.failures),
            startup=startups,
        )

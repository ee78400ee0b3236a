"""``raytf.Trainer``: validate, place, run ``train_fn`` on every worker, return a Result."""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import asdict
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Iterator, Optional

from raytf._internal import env as _env
from raytf._internal.driver.controller import Controller
from raytf._internal.driver.failure import FailurePolicy
from raytf._internal.lease import RunLease
from raytf._internal.driver.preflight import data_starvation, fits, launchable, too_few_rows, unfit_worker, unseen_storage
from raytf._internal.driver.progress import ProgressDisplay, format_metrics
from raytf._internal.protocol import HISTORY_KEYS, Report
from raytf._internal.storage import RunStorage
from raytf._internal.driver.tensorboard import EventWriter
from raytf.config import DataConfig, RunConfig, ScalingConfig, TensorflowConfig
from raytf.checkpoint import CheckpointError, CheckpointManager, new_entry
from raytf.errors import ConfigError, RunInUseError
from raytf.result import Result

logger = logging.getLogger(__name__)

HISTORY_FILE = "history.json"
RUN_FILE = "run.json"
_HISTORY_WRITE_INTERVAL_S = 10.0


def _load_history(storage: RunStorage) -> list[dict[str, Any]]:
    """The run's history so far (earlier attempts and driver starts), or [] for a new run.

    A history.json that cannot be read is moved aside, not overwritten.
    """
    try:
        previous = storage.read_json(HISTORY_FILE, default=[])
        if isinstance(previous, list) and all(isinstance(e, dict) for e in previous):
            return previous
        problem = f"it holds a {type(previous).__name__}, not a list of reports"
    except (OSError, ValueError) as error:
        problem = str(error)
    aside = f"{HISTORY_FILE}.unreadable-{int(time.time())}"
    storage.filesystem.move(storage.path(HISTORY_FILE), storage.path(aside))
    logger.warning("%s of run %s is unreadable (%s); moved it to %s and starting a new history",
                   HISTORY_FILE, storage.uri, problem, aside)
    return []


def _record_start(storage: RunStorage, name: str) -> int:
    """Append this driver start to run.json; returns its number (0 for the run's first)."""
    record = storage.read_json(RUN_FILE, default={})
    starts = list(record.get("starts", [])) if isinstance(record, dict) else []
    starts.append({
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(), "pid": os.getpid(), "raytf_version": _raytf_version(),
    })
    storage.write_json(RUN_FILE, {"name": name, "starts": starts})
    return len(starts) - 1


def _raytf_version() -> str:
    from raytf import __version__

    return __version__


class _History:
    """Rank 0's reports over the whole run (every attempt and driver start): logged,
    shown, kept, written to the run directory now and then, and their checkpoints committed."""

    def __init__(self, storage: RunStorage, display: ProgressDisplay, checkpoints: CheckpointManager,
                 lease: RunLease, driver_start: int, previous: list[dict[str, Any]],
                 events: Optional[EventWriter] = None):
        self.entries: list[dict[str, Any]] = list(previous)
        self._storage = storage
        self._display = display
        self._checkpoints = checkpoints
        self._lease = lease
        self._driver_start = driver_start
        self._events = events
        self._last_write = time.monotonic()
        self._dirty = False

    def on_report(self, report: Report) -> Optional[str]:
        """Record a report; commit its checkpoint. Returns why a commit failed, or None.

        The report is in the history whatever becomes of its checkpoint.
        Raises RunInUseError when this driver no longer holds the run.
        """
        if report.rank != 0:
            return None
        logger.debug("report from rank 0, attempt %d: %s", report.attempt, report.metrics)
        self._display.report(report)
        entry = {**report.metrics, "attempt": report.attempt, "driver_start": self._driver_start,
                 "report_seq": report.seq}
        self.entries.append(entry)
        self._dirty = True
        if self._events is not None:
            step = report.metrics.get("step")
            self._events.add(step if isinstance(step, int) and not isinstance(step, bool) else len(self.entries) - 1,
                             report.metrics)
        error = None
        if report.checkpoint is not None:
            committed = new_entry(report.checkpoint["seq"], report.attempt, report.metrics, self._driver_start)
            self._lease.check()
            try:
                self._checkpoints.commit(committed)
                entry["checkpoint"] = committed.name
            except Exception as failure:  # noqa: BLE001 - the worker's report() raises it; the run goes on recording
                error = f"{type(failure).__name__}: {failure}"
                logger.error("checkpoint %s was not committed: %s", committed.name, error)
        # With every checkpoint, and every few seconds: a driver that dies without a
        # word loses no report whose checkpoint it committed.
        if report.checkpoint is not None or time.monotonic() - self._last_write >= _HISTORY_WRITE_INTERVAL_S:
            self.flush()
        return error

    def flush(self) -> None:
        if self._dirty:
            self._lease.check()
            self._storage.write_json(HISTORY_FILE, self.entries)
            if self._events is not None:
                self._events.flush()
            self._dirty = False
        self._last_write = time.monotonic()

    @property
    def last_metrics(self) -> dict[str, Any]:
        if not self.entries:
            return {}
        return {k: v for k, v in self.entries[-1].items() if k not in HISTORY_KEYS}


@contextlib.contextmanager
def _sigterm_raises_systemexit() -> Iterator[None]:
    """Turn SIGTERM (``ray job stop``, a scheduler's kill) into SystemExit while fit() runs,
    so the worker group is torn down on the way out instead of abandoned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _resume_point(checkpoints: CheckpointManager, display: ProgressDisplay) -> tuple[Optional[dict[str, Any]], int]:
    """Before each attempt: clear uncommitted debris, find the checkpoint to resume from."""
    checkpoints.clean_debris()
    latest = checkpoints.latest()
    if latest is None:
        return None, checkpoints.next_seq
    entry, _ = latest
    display.message(f"resuming from {entry.name} (epoch={entry.epoch}, step={entry.step})")
    return {"path": checkpoints.path_of(entry), "metadata": asdict(entry)}, checkpoints.next_seq


def _check_datasets(datasets: Optional[dict[str, Any]]) -> dict[str, Any]:
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise ConfigError(
            f"Trainer(datasets=...) must be a dict of name to ray.data.Dataset, got {type(datasets).__name__}"
        )
    from ray.data import Dataset

    for name, dataset in datasets.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"Trainer(datasets=...): dataset names must be non-empty str, got {name!r}")
        if not isinstance(dataset, Dataset):
            raise ConfigError(
                f"Trainer(datasets={{{name!r}: ...}}) must be a ray.data.Dataset, got "
                f"{type(dataset).__name__}; wrap in-memory data with ray.data.from_numpy or from_pandas"
            )
    return dict(datasets)


def _check_storage_is_shared(storage: RunStorage, bundle: dict[str, float]) -> None:
    """On a multi-node cluster, refuse a local storage path that some worker node cannot see.

    The driver writes a probe file under the run directory and a tiny task on
    every node that could hold a worker looks for it.
    """
    import uuid

    import pyarrow.fs as pafs
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not isinstance(storage.filesystem, pafs.LocalFileSystem):
        return
    nodes = [
        n for n in ray.nodes()
        if n.get("Alive") and fits(bundle, n["Resources"])
    ]
    if len(nodes) < 2:
        return
    token = uuid.uuid4().hex
    probe = f"{storage.root}/.raytf-probe-{token}"
    with open(probe, "w") as out:
        out.write(token)

    def sees(path: str, expected: str) -> bool:
        try:
            with open(path) as f:
                return f.read() == expected
        except OSError:
            return False

    task = ray.remote(num_cpus=0, max_retries=0)(sees)
    refs = {
        n["NodeManagerAddress"] + f" (node {n['NodeID'][:8]})": task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(probe, token)
        for n in nodes
    }
    try:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=60)
        seen = {node: (ray.get(ref) if ref in ready else None) for node, ref in refs.items()}
    finally:
        os.remove(probe)
    problem = unseen_storage(storage.root, seen)
    if problem:
        raise ConfigError(problem)


def _default_run_name() -> str:
    return "raytf_" + datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


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
            ("scaling", scaling, ScalingConfig),
            ("run", run, RunConfig),
            ("tensorflow", tensorflow, TensorflowConfig),
            ("data_config", data_config, DataConfig),
        ):
            if value is not None and not isinstance(value, kind):
                raise ConfigError(
                    f"Trainer({name}=...) must be a raytf.{kind.__name__}, got {type(value).__name__}"
                )
        self.train_fn = train_fn
        self.config = dict(config or {})
        self.scaling = scaling or ScalingConfig()
        self.run = run or RunConfig()
        self.tensorflow = tensorflow or TensorflowConfig()
        self.datasets = _check_datasets(datasets)
        self.data_config = data_config or DataConfig()
        # Cross-field checks that need no cluster, before anything starts.
        self.tensorflow.resolve_communication(self.scaling)
        self.data_config.split(list(self.datasets))

    def _workers_text(self) -> str:
        scaling = self.scaling
        return f"{scaling.min_workers} to {scaling.max_workers}" if scaling.elastic else str(scaling.max_workers)

    def fit(self) -> Result:
        """Train to the end and return the result; raise TrainingFailedError if a worker failed
        and no retry was left. Ctrl-C stops every worker and frees the placement group."""
        import ray
        from ray import cloudpickle
        from ray.data.dataset import MaterializedDataset

        if not ray.is_initialized():
            ray.init()
        name = self.run.name or _default_run_name()
        display = ProgressDisplay(name, self.run.verbose)
        if self.scaling.check_resources:
            self._check_resources(display)
        split = self.data_config.split(list(self.datasets))
        for dataset_name, dataset in self.datasets.items():
            if isinstance(dataset, MaterializedDataset):  # its row count is known without running anything
                problem = too_few_rows(dataset_name, dataset.count(), self.scaling.max_workers, dataset_name in split)
                if problem:
                    raise ConfigError(problem)
        try:
            payload = cloudpickle.dumps((self.train_fn, self.config))
        except Exception as error:
            raise ConfigError(
                f"Trainer: train_fn and config must be picklable to reach the workers: {error}"
            ) from error
        storage = RunStorage(self.run.storage_path, name, self.run.storage_filesystem)
        lease = RunLease(storage.filesystem, storage.root, name, ttl_s=_env.get_float(_env.LEASE_TTL_S))
        with _sigterm_raises_systemexit():
            lease.acquire()  # before anything of the run is read or written
            try:
                return self._fit_holding(name, storage, lease, payload, display)
            finally:
                lease.release()

    def _check_resources(self, display: ProgressDisplay) -> None:
        """Refuse, before anything starts, a group this cluster can never place; say when it waits
        for the autoscaler to add nodes."""
        import ray
        from ray.data.dataset import MaterializedDataset

        from raytf._internal.driver import cluster as _autoscaler
        from raytf._internal.driver.worker_group import live_node_resources

        bundle, live = self.scaling.bundle(), live_node_resources()
        node_types = _autoscaler.node_types()
        if node_types is None:  # no autoscaler that can add nodes (or none raytf can read)
            problem = unfit_worker(bundle, live) or data_starvation(
                [n for n, d in self.datasets.items() if not isinstance(d, MaterializedDataset)],
                ray.cluster_resources().get("CPU", 0.0),
                self.scaling.min_workers * self.scaling.cpus_per_worker,
            )
            if problem:
                raise ConfigError(problem)
            return
        problem, waits_for = launchable(bundle, self.scaling.min_workers, live, node_types)
        if problem:
            raise ConfigError(problem)
        if waits_for:
            display.message(f"no live node can hold a worker of {bundle}; the autoscaler can add "
                            f"{' or '.join(waits_for)} nodes, so the group waits for them")

    def _fit_holding(self, name: str, storage: RunStorage, lease: RunLease, payload: bytes,
                     display: ProgressDisplay) -> Result:
        from raytf._internal.driver.worker_group import RayWorkerGroup

        _check_storage_is_shared(storage, self.scaling.bundle())
        kept = self.run.checkpoint_config
        checkpoints = CheckpointManager(
            storage.filesystem, storage.root, num_to_keep=kept.num_to_keep,
            score_attribute=kept.score_attribute, mode=kept.mode,
        )
        if checkpoints.entries and self.run.resume == "never":
            raise ConfigError(
                f"RunConfig(resume='never'), but run {name!r} in {storage.uri} already has "
                f"{len(checkpoints.entries)} committed checkpoint(s): pick a new RunConfig.name, or "
                "resume='auto' to continue it"
            )
        previous = _load_history(storage)
        driver_start = _record_start(storage, name)
        group = RayWorkerGroup(
            self.scaling,
            self.tensorflow,
            payload,
            name,
            storage.uri,
            datasets=self.datasets,
            split=frozenset(self.data_config.split(list(self.datasets))),
            resume_point=lambda: _resume_point(checkpoints, display),
            storage=(storage.filesystem, storage.root),
            worker_timeout_s=self.run.failure_config.worker_timeout_s,
            start_timeout_s=self.run.failure_config.start_timeout_s,
            checkpoint_every=(
                ("epoch", kept.every_n_epochs) if kept.every_n_epochs
                else ("step", kept.every_n_steps) if kept.every_n_steps else None
            ),
            lease_token=lease.token,
            hang_timeout_s=self.run.failure_config.hang_timeout_s,
            notify=display.message,
        )
        events = EventWriter(storage.filesystem, storage.root, driver_start)
        history = _History(storage, display, checkpoints, lease, driver_start, previous, events)
        policy = FailurePolicy(self.run.failure_config)
        controller = Controller(
            group,
            policy,
            history.on_report,
            poll_interval_s=_env.get_float(_env.POLL_INTERVAL_S),
            failure_grace_s=_env.get_float(_env.FAILURE_GRACE_S),
            guard=lease.ensure_held,
            on_status=lambda attempt, status: display.update(attempt, status.progress),
        )
        display.message(
            f"starting {self._workers_text()} workers x {self.scaling.bundle()} "
            f"({self.scaling.placement}); results in {storage.uri}"
            + (f"; driver start {driver_start} of this run" if driver_start else "")
        )
        try:
            finished = controller.run()
        finally:
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
        )

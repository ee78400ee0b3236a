"""The worker-side API that ``train_fn`` calls: context, strategy, report.

One session per worker actor process, installed by the actor before
``train_fn`` starts. Calling these functions anywhere else is an error that
says so, rather than a silent no-op.
"""

from __future__ import annotations

import logging
import numbers
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from raytf._internal.protocol import HISTORY_KEYS, Progress, Report
from raytf.errors import RaytfError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainContext:
    """Who this worker is. Attribute and ``get_*`` spellings both work (Ray Train uses the latter)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    attempt: int
    run_name: str
    run_path: str
    tf_config: str

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.run_name

    @property
    def is_chief(self) -> bool:
        return self.world_rank == 0


class WorkerSession:
    """The state behind the public functions in one worker process."""

    def __init__(
        self,
        context: TrainContext,
        strategy: Any,
        sink: Callable[[Report], None],
        datasets: Optional[dict[str, Any]] = None,
        resume: Optional[dict[str, Any]] = None,
        next_checkpoint_seq: int = 0,
        storage: Any = None,
        *,
        checkpoint_every: Optional[tuple[str, int]] = None,
        preempt_requested: Callable[[], bool] = lambda: False,
        lease_token: Optional[str] = None,
        split: Sequence[str] = (),
    ):
        self.context = context
        self._storage = storage  # (pyarrow filesystem, run root), as the driver opened them
        self.strategy = strategy
        self._sink = sink
        self._seq = 0
        self._lock = threading.Lock()
        self._datasets = dict(datasets or {})  # name -> ray.data.DataIterator
        self._cached: dict[str, tuple[dict[str, Any], int]] = {}  # name -> (arrays, agreed rows)
        self._calls: dict[str, int] = {}
        self._resume = resume  # {"path": ..., "metadata": {...}} of the checkpoint to resume from
        self._next_checkpoint_seq = next_checkpoint_seq
        self._acks: dict[int, threading.Event] = {}
        self._ack_errors: dict[int, str] = {}
        self._checkpoint_every = checkpoint_every
        self._lease_token = lease_token
        metadata = (resume or {}).get("metadata", {})
        # Where the last saved checkpoint was, for CheckpointConfig.every_n_*.
        self._last_saved = {
            "epoch": metadata.get("epoch") if metadata.get("epoch") is not None else -1,
            "step": metadata.get("step") if metadata.get("step") is not None else 0,
        }
        # The epoch a fresh pass over a shuffled shard starts at: the one after the
        # checkpoint's, so a resumed run sees the orders a run without a failure saw.
        self.first_epoch = self._last_saved["epoch"] + 1
        # The run's last completed epoch as raytf.keras.ReportCallback numbers them,
        # across every model.fit call and from the resumed checkpoint on.
        self.keras_epoch = self._last_saved["epoch"]
        self._split = frozenset(split)  # names of the datasets split across the workers
        self._progress: dict[str, Optional[int]] = {}  # fields of Progress, as last noted
        self._preempt_requested = preempt_requested
        self._preempt_check: Any = None
        self.preempted = False

    def get_checkpoint(self) -> Any:
        from raytf.checkpoint import Checkpoint

        if self._resume is None:
            return None
        return Checkpoint(self._resume["path"], self._storage[0], self._resume["metadata"])

    def note_progress(self, **fields: Optional[int]) -> None:
        """Record where training is (see :class:`Progress`); the driver reads it with each poll."""
        self._progress.update(fields)

    def progress(self) -> Progress:
        return Progress(**self._progress)

    def end_keras_epoch(self, keras_epoch: int) -> int:
        """The run's number of the epoch Keras just ended as ``keras_epoch``.

        Keras counts from ``initial_epoch`` in every ``fit`` call, so code that
        calls ``fit`` once per epoch (as Ray Train's examples do) sees epoch 0
        every time; the run's count goes on from the last epoch ended.
        """
        self.keras_epoch = keras_epoch if keras_epoch > self.keras_epoch else self.keras_epoch + 1
        return self.keras_epoch

    def acknowledge(self, seq: int, error: Optional[str] = None) -> None:
        """The driver committed (or refused) the checkpoint of report ``seq``."""
        if error is not None:
            self._ack_errors[seq] = error
        event = self._acks.get(seq)
        if event is not None:
            event.set()

    def _upload(self, checkpoint: Any) -> dict[str, Any]:
        from raytf.checkpoint import checkpoint_name, checkpoints_dir, upload

        from raytf._internal import lease as _lease

        filesystem, root = self._storage
        if self._lease_token is not None and not _lease.holds(filesystem, root, self._lease_token):
            raise RaytfError(
                "raytf.report: this run's driver no longer holds the run's lease (another driver took "
                "the run over, or the driver stopped renewing it); not uploading the checkpoint"
            )
        seq = self._next_checkpoint_seq
        self._next_checkpoint_seq += 1
        name = checkpoint_name(seq)
        upload(checkpoint, filesystem, checkpoints_dir(filesystem, root), name)
        return {"name": name, "seq": seq}

    def get_dataset_shard(
        self,
        name: str,
        *,
        batch_size: Optional[int] = None,
        global_batch_size: Optional[int] = None,
        features: Any = None,
        label: Optional[str] = None,
        shuffle: bool = False,
        seed: Optional[int] = None,
        drop_remainder: bool = False,
        cache: bool = True,
    ) -> Any:
        from raytf._internal.data import shard as _ingest

        if name not in self._datasets:
            passed = ", ".join(sorted(self._datasets)) or "none"
            raise _ingest.DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): no dataset named {name!r} was passed to "
                f"Trainer(datasets=...); passed: {passed}"
            )
        batch_size = self._batch_size(name, batch_size, global_batch_size)
        if name in self._split and "global_batch" not in self._progress:
            self._progress["global_batch"] = batch_size * self.context.world_size
        request = _ingest.ShardRequest(name, batch_size, features, label, shuffle, seed, drop_remainder)
        _ingest.check_request(request)
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        ctx = self.context
        seed_here = _ingest.shuffle_seed(seed, name, ctx.world_rank, call)
        iterator = self._datasets[name]
        if not cache:
            schema = iterator.schema()
            if schema is None:  # Ray Data has no schema for a dataset without rows
                _ingest.check_rows(name, 0, ctx.world_size)
            return _ingest.streaming_dataset(iterator, request, schema, seed_here)
        if name not in self._cached:
            arrays = _ingest.read_shard(iterator, name)
            own = len(next(iter(arrays.values()))) if arrays else 0
            counts = _ingest.agree_on_rows(self.strategy, own, ctx.world_rank, ctx.world_size)
            _ingest.check_rows(name, min(counts), ctx.world_size)  # every rank raises alike
            if min(counts) < own:
                logger.warning(
                    "dataset %r: this worker has %d rows, the smallest shard %d; using %d so every "
                    "worker runs the same number of steps",
                    name, own, min(counts), min(counts),
                )
            self._cached[name] = (arrays, min(counts))
        arrays, rows = self._cached[name]
        request.columns(list(arrays))
        if rows < batch_size:
            raise _ingest.DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): batch_size={batch_size} is larger than the "
                f"worker's shard ({rows} rows, the smallest across {ctx.world_size} workers); "
                "lower batch_size or pass more data"
            )
        return _ingest.dataset_from_arrays(arrays, request, rows, seed_here, first_epoch=self.first_epoch)

    def _batch_size(self, name: str, batch_size: Optional[int], global_batch_size: Optional[int]) -> Any:
        """The per-worker batch, given directly or as this worker's share of a global batch."""
        from raytf._internal.data import shard as _ingest

        if (batch_size is None) == (global_batch_size is None):
            raise _ingest.DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): pass batch_size (per worker; the global batch "
                "grows and shrinks with the group) or global_batch_size (kept; each worker gets its "
                "share), not both and not neither"
            )
        if global_batch_size is None:
            return batch_size
        world = self.context.world_size
        if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < world:
            raise _ingest.DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): global_batch_size must be an int of at least the "
                f"number of workers ({world}), got {global_batch_size!r}"
            )
        if global_batch_size % world:
            logger.warning(
                "dataset %r: global_batch_size=%d does not divide among %d workers; each takes %d "
                "(a global batch of %d)", name, global_batch_size, world, global_batch_size // world,
                global_batch_size // world * world,
            )
        return global_batch_size // world

    def preemption_requested(self) -> bool:
        """True on every rank once any rank was asked to stop for a preemption (one all-reduce)."""
        import tensorflow as tf

        local = 1.0 if self._preempt_requested() else 0.0
        if self.context.world_size > 1:
            if self._preempt_check is None:
                strategy = self.strategy

                @tf.function
                def any_rank(flag: Any) -> Any:
                    per_replica = strategy.run(tf.identity, args=(flag,))
                    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

                self._preempt_check = any_rank
            local = float(self._preempt_check(tf.constant(local)))
        if local > 0:
            self.preempted = True
        return self.preempted

    def _due(self, metrics: dict[str, Any]) -> bool:
        """Whether CheckpointConfig.every_n_* says to save the checkpoint of this report."""
        if self._checkpoint_every is None or self.preempted:
            return True
        kind, every = self._checkpoint_every
        value = metrics.get(kind)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RaytfError(
                f"CheckpointConfig.every_n_{kind}s is set, so raytf.report(metrics, checkpoint=...) needs "
                f"a number under {kind!r} in metrics to decide whether to save; got {value!r}"
            )
        return value - self._last_saved[kind] >= every

    def _save(self, metrics: dict[str, Any], checkpoint: Any) -> Optional[dict[str, Any]]:
        """Write (every rank, where TensorFlow needs it) and upload (the chief) a due checkpoint."""
        import shutil
        import tempfile

        from raytf.checkpoint import Checkpoint, StateCheckpoint

        if not isinstance(checkpoint, (Checkpoint, StateCheckpoint)):
            raise TypeError(
                "raytf.report(checkpoint=...) takes raytf.Checkpoint.from_directory(path) or "
                f"raytf.Checkpoint.from_state(model=..., optimizer=...); got {type(checkpoint).__name__}"
            )
        if not self._due(metrics):
            return None
        for kind in ("epoch", "step"):
            if isinstance(metrics.get(kind), (int, float)):
                self._last_saved[kind] = metrics[kind]
        if not isinstance(checkpoint, StateCheckpoint):
            # Under MultiWorkerMirroredStrategy every rank holds the same weights, so
            # only the chief's checkpoint is kept; the others' are dropped here.
            return self._upload(checkpoint) if self.context.is_chief else None
        directory = tempfile.mkdtemp(prefix="raytf-state-")
        try:
            checkpoint.write(directory)  # every rank: saving may run collectives
            if not self.context.is_chief:
                return None
            return self._upload(Checkpoint.from_directory(directory))
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def report(self, metrics: dict[str, Any], checkpoint: Any = None) -> None:
        if not isinstance(metrics, dict):
            raise TypeError(f"raytf.report(metrics): metrics must be a dict, got {type(metrics).__name__}")
        clean = {}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"raytf.report(metrics): metric names must be str, got {key!r}")
            if key in HISTORY_KEYS:
                raise ValueError(
                    f"raytf.report(metrics): the metric name {key!r} is raytf's (every history entry "
                    f"carries {', '.join(HISTORY_KEYS)}); rename the metric, e.g. to 'my_{key}'"
                )
            clean[key] = to_plain(value, key)
        epoch, step = clean.get("epoch"), clean.get("step")
        if isinstance(epoch, int) and not isinstance(epoch, bool):  # the epoch ended: the next is in progress
            self._progress.update(epoch=epoch + 1, step=0)
        if isinstance(step, int) and not isinstance(step, bool):
            self._progress["global_step"] = step
        uploaded = self._save(clean, checkpoint) if checkpoint is not None else None
        with self._lock:
            report = Report(
                rank=self.context.world_rank,
                seq=self._seq,
                metrics=clean,
                time=time.time(),
                attempt=self.context.attempt,
                checkpoint=uploaded,
            )
            self._seq += 1
            if uploaded is not None:
                done = self._acks[report.seq] = threading.Event()
        self._sink(report)
        if uploaded is not None:
            done.wait()  # returns once the driver's index names the checkpoint
            error = self._ack_errors.pop(report.seq, None)
            if error is not None:
                raise RaytfError(f"raytf.report: the checkpoint was not committed: {error}")


def to_plain(value: Any, name: str) -> Any:
    """A metric as JSON-friendly Python: tensors and NumPy values become numbers and lists."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "numpy") and callable(value.numpy):  # tf.Tensor, tf.Variable
        return to_plain(value.numpy(), name)
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy scalars and arrays
        return to_plain(value.tolist(), name)
    if isinstance(value, (list, tuple)):
        return [to_plain(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v, f"{name}.{k}") for k, v in value.items()}
    raise TypeError(
        f"raytf.report(metrics): metric {name!r} is a {type(value).__name__}; "
        "report numbers, strings, tensors or lists of them"
    )


_session: Optional[WorkerSession] = None


def install(session: Optional[WorkerSession]) -> None:
    global _session
    _session = session


def _current(function: str) -> WorkerSession:
    if _session is None:
        raise RaytfError(
            f"raytf.{function}() works only inside the train_fn that raytf.Trainer runs on its workers"
        )
    return _session


def get_context() -> TrainContext:
    """This worker's ranks, world size, attempt number and run."""
    return _current("get_context").context


def strategy() -> Any:
    """This worker group's ``tf.distribute.MultiWorkerMirroredStrategy``, already connected."""
    return _current("strategy").strategy


def get_dataset_shard(
    name: str = "train",
    *,
    batch_size: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    features: Any = None,
    label: Optional[str] = None,
    shuffle: bool = False,
    seed: Optional[int] = None,
    drop_remainder: bool = False,
    cache: bool = True,
) -> Any:
    """This worker's shard of ``Trainer(datasets={name: ...})`` as a ``tf.data.Dataset``.

    ``batch_size`` is per worker; or pass ``global_batch_size`` and each of
    the ``world_size`` workers takes ``global_batch_size // world_size`` (for
    elastic runs that must keep the global batch when the group shrinks).
    ``features`` is one column (a tensor), a list
    of columns (a dict of tensors, for multi-input models) or None for every
    column but the label; ``label`` is optional. ``shuffle`` reshuffles every
    epoch, reproducibly when ``seed`` is set. ``cache=True`` reads the shard
    into memory once (fastest); ``cache=False`` streams it every epoch, for
    shards larger than memory. Every worker yields the same number of batches.
    """
    return _current("get_dataset_shard").get_dataset_shard(
        name,
        batch_size=batch_size,
        global_batch_size=global_batch_size,
        features=features,
        label=label,
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
        cache=cache,
    )


def report(metrics: dict[str, Any], checkpoint: Any = None) -> None:
    """Send metrics to the driver, which logs them and keeps rank 0's as the run's history.

    With ``checkpoint=raytf.Checkpoint.from_directory(d)`` the chief's files are
    uploaded to the run's storage and committed, and this returns only after
    the commit: a checkpoint whose report returned is never lost. Other ranks
    may pass their (identical) checkpoints too; only the chief's is kept.
    Include ``epoch`` and ``step`` in ``metrics`` to resume from them.
    """
    _current("report").report(metrics, checkpoint)


def preemption_requested() -> bool:
    """Whether this run was asked to stop for a preemption, agreed by every rank.

    True once any rank's node is draining (Ray's drain notice, as autoscalers
    and spot-instance handlers send it) or any worker got SIGTERM. It runs one
    small all-reduce, so every rank must call it at the same points: every few
    dozen steps, or at each epoch's end. When it returns True, report a
    checkpoint (it is saved whatever CheckpointConfig.every_n_* says) and
    return from ``train_fn``: raytf restarts the group from that checkpoint,
    without counting a failure.
    """
    return _current("preemption_requested").preemption_requested()


def get_checkpoint() -> Any:
    """The committed checkpoint this attempt resumes from (with ``.epoch`` and
    ``.step``), or None on a fresh start."""
    return _current("get_checkpoint").get_checkpoint()

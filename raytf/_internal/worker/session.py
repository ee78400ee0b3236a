"""The state behind ``raytf.session``'s functions in one worker process.

One :class:`WorkerSession` per worker, installed by the actor before
``train_fn`` starts; ``raytf.session`` and ``raytf.keras`` reach it through
:func:`current`. It hands out shards (data/shard.py), saves checkpoints
(checkpoint/saver.py), sends reports and waits for their commit, agrees on
preemption with one all-reduce, and keeps the progress the driver displays.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Optional, Sequence

from raytf._internal.checkpoint import memory as _memory
from raytf._internal.checkpoint import snapshot as _snapshot
from raytf._internal.checkpoint.files import checkpoint_name
from raytf._internal.checkpoint.saver import CheckpointSaver
from raytf._internal.background import Background
from raytf._internal.data.cursor import completed_epoch, positions_at
from raytf._internal.data.shard import ShardReader, ShardRequest
from raytf._internal.protocol import (
    CheckpointPart,
    CheckpointUpload,
    Progress,
    Report,
    ReportStage,
    ResumePoint,
    SaveEvery,
    StorageRef,
    TrainContext,
)
from raytf._internal.worker.metrics import clean_metrics, to_plain  # noqa: F401 - to_plain: ps_payloads.py's too
from raytf._internal.worker.uploads import Uploads
from raytf.errors import CheckpointError, ConfigError, RaytfError

logger = logging.getLogger(__name__)


class WorkerSession:
    """The state behind the public functions in one worker process."""

    def __init__(
        self,
        context: TrainContext,
        strategy: Any,
        sink: Callable[[Report], None],
        datasets: Optional[dict[str, Any]] = None,
        resume: ResumePoint = ResumePoint(),
        storage: Optional[StorageRef] = None,
        *,
        save_every: Optional[SaveEvery] = None,
        preempt_requested: Callable[[], bool] = lambda: False,
        halted: Callable[[], bool] = lambda: False,
        lease_token: Optional[str] = None,
        split: Sequence[str] = (),
        parameter_server: Any = None,
        upload: CheckpointUpload = CheckpointUpload.SYNC,
        restore_from_memory: bool = False,
    ):
        self.context = context
        self.strategy = strategy
        self._storage = storage
        self._sink = sink
        self._halted = halted
        self._seq = 0
        self._lock = threading.Lock()
        self._setting_out = 0  # chief's asynchronous checkpoints past the halt check, their upload not started
        self._resume = resume
        self._acks: dict[int, threading.Event] = {}
        self._ack_errors: dict[int, str] = {}
        self._saver = CheckpointSaver(
            storage, resume, context.is_chief, save_every, lease_token, in_memory=restore_from_memory
        )
        self._restored: Any = None  # the checkpoint get_checkpoint hands out, once decided
        # This node's copy of the checkpoint resumed from is checked (every file's CRC32) from the
        # start, while train_fn builds its model, so that get_checkpoint rarely waits for it.
        self._copy_check = (
            Background(self._memory_copy, "raytf-check-copy") if restore_from_memory and resume.path else None
        )
        self.upload = CheckpointUpload(upload)  # the run's CheckpointConfig.upload
        self._uploads = Uploads()  # CheckpointUpload.ASYNC: the checkpoint on its way to storage
        # The epoch a fresh pass over a shuffled shard starts at: the one after the
        # checkpoint's, so a resumed run sees the orders a run without a failure saw.
        self.first_epoch = self._saver.last_saved["epoch"] + 1
        self._shards = ShardReader(
            datasets or {},
            context.world_rank,
            context.world_size,
            lambda: self.strategy,
            self.first_epoch,
            resume.entry.data if resume.entry is not None else None,
        )
        # The run's last completed epoch as raytf.keras.ReportCallback numbers them,
        # across every model.fit call and from the resumed checkpoint on.
        self.keras_epoch = self._saver.last_saved["epoch"]
        self._split = frozenset(split)  # names of the datasets split across the workers
        self.exact_resume: set[str] = set()  # planned shards the loop resumes in mid-epoch (raytf.keras.fit's)
        self._progress: dict[str, Any] = {}  # fields of Progress, as last noted
        self._preempt_requested = preempt_requested
        self._preempt_check: Any = None
        self.preempted = False
        self.parameter_server = parameter_server  # ps_payloads.PsData on a parameter-server chief
        self._ps_streams: Any = None  # a parameter-server chief's streams (data/ps_positions.py), made now:
        if parameter_server is not None:  # a dataset function the coordinator traces may create no variable
            from raytf._internal.data.ps_positions import PsStreams

            self._ps_streams = PsStreams(
                resume.entry.data if resume.entry is not None else None, self.first_epoch, parameter_server.shard_files
            )
        self._round = 0  # collective reports (ranks="all") made in this attempt

    def get_checkpoint(self) -> Any:
        """The checkpoint this attempt resumes from: this node's copy in host memory when it is
        that checkpoint and verifies (checkpoint/memory.py), else the one in storage."""
        import pyarrow.fs as pafs

        from raytf.checkpoint import Checkpoint

        if self._resume.path is None:
            return None
        assert self._storage is not None  # an attempt resumes from a checkpoint its run's storage holds
        if self._restored is None:
            metadata = asdict(self._resume.entry)
            copy = self._copy_check.result() if self._copy_check is not None else None
            self._restored = (
                Checkpoint(copy, pafs.LocalFileSystem(), metadata)
                if copy is not None
                else Checkpoint(self._resume.path, self._storage.filesystem, metadata)
            )
            self._progress["restored_from"] = "memory" if copy is not None else "storage"
        return self._restored

    def _memory_copy(self) -> Optional[str]:
        name, path = self._resume.entry.name, self._resume.path
        assert self._storage is not None and path is not None  # checked only where there is one to resume
        try:
            _memory.drop_older(self._storage, name)
            copy = _memory.usable(self._storage, name, path)
        except OSError as error:  # storage or memory unreadable: storage decides
            logger.warning(
                "raytf: checking the copy in host memory of checkpoint %s failed (%s); restoring from storage",
                name,
                error,
            )
            return None
        if copy is not None:
            logger.info("raytf: restoring checkpoint %s from its copy in host memory (%s)", name, copy)
        return copy

    def note_progress(self, **fields: Any) -> None:
        """Record where training is (see :class:`Progress`); the driver reads it with each poll."""
        self._progress.update(fields)

    def progress(self) -> Progress:
        return Progress(**self._progress, uploading=self._uploads.in_flight())

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

    def dataset_names(self) -> list[str]:
        if self.parameter_server is not None:
            files = self.parameter_server.shard_files
            return sorted(files[0]) if files else []
        return self._shards.names()

    @property
    def cursors(self) -> dict[str, Any]:
        return self._shards.cursors  # each planned dataset's (data/planned.py)

    def shard_read_whole(self, name: str) -> Any:
        """The columns of ``name`` as this worker read them whole, or None (see ShardReader)."""
        return self._shards.read_whole(name)

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
        if self.parameter_server is not None:
            return self._parameter_server_shard(
                name, batch_size, global_batch_size, features, label, shuffle, seed, drop_remainder
            )
        batch = self._shards.per_worker_batch(name, batch_size, global_batch_size)
        if name in self._split and "global_batch" not in self._progress:
            self._progress["global_batch"] = batch * self.context.world_size
        request = ShardRequest(name, batch, features, label, shuffle, seed, drop_remainder)
        return self._shards.dataset(request, seed, cache)

    def _parameter_server_shard(
        self,
        name: str,
        batch_size: Optional[int],
        global_batch_size: Optional[int],
        features: Any,
        label: Optional[str],
        shuffle: bool,
        seed: Optional[int],
        drop_remainder: bool,
    ) -> Any:
        """Each worker's piece of ``name``, as the workers' pipelines read it (data/tfdata_ps.py):
        the pipeline itself inside a dataset function the coordinator traces, else a template
        the coordinator and tf-keras' model.fit turn into it."""
        from raytf._internal.data import tfdata_ps
        from raytf._internal.worker import ps as _ps
        from raytf.errors import DatasetShardError

        files = self.parameter_server.shard_files
        if not files or name not in files[0]:
            passed = ", ".join(sorted(files[0])) if files else "none"
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): no dataset named {name!r} was passed to "
                f"ParameterServerTrainer(datasets=...); passed: {passed}"
            )
        if global_batch_size is not None or batch_size is None:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({name!r}): pass batch_size, the batch each worker takes per step; "
                "parameter-server workers step on their own, so there is no global batch to share"
            )
        request = ShardRequest(name, batch_size, features, label, shuffle, seed, drop_remainder)
        shard = tfdata_ps.make_shard(
            request, [f[name] for f in files], seed, self.first_epoch, self._ps_streams.positions[name]
        )
        self._ps_streams.start(shard)
        if "global_batch" not in self._progress:
            self._progress["global_batch"] = batch_size
        if _ps.tracing_per_worker_dataset():
            import tensorflow as tf

            _ps.note_built(shard)
            return shard.build(tf.distribute.coordinator.experimental_get_current_worker_index())
        return shard.template()

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

    def report(
        self,
        metrics: dict[str, Any],
        checkpoint: Any = None,
        ranks: str = "chief",
        upload: Optional[CheckpointUpload] = None,
    ) -> None:
        """``raytf.report``; ``upload`` overrides the run's ``CheckpointConfig.upload`` for this
        report (``raytf.train.report``'s ``checkpoint_upload_mode``)."""
        # An asynchronous checkpoint of the chief's is on its way from here, before the halt check,
        # until its upload's thread has started: a halt never falls between the two unseen.
        on_its_way = checkpoint is not None and ranks == "chief" and (upload or self.upload) == CheckpointUpload.ASYNC
        with self._lock:
            self._setting_out += on_its_way
        try:
            self._report(metrics, checkpoint, ranks, upload)
        finally:
            with self._lock:
                self._setting_out -= on_its_way

    def _report(self, metrics: dict[str, Any], checkpoint: Any, ranks: str, upload: Optional[CheckpointUpload]) -> None:
        self._stop_if_halted()
        if ranks not in ("chief", "all"):
            raise ConfigError(f"raytf.report(ranks=...) must be 'chief' or 'all', got {ranks!r}")
        if not isinstance(metrics, dict):
            raise ConfigError(f"raytf.report(metrics): metrics must be a dict, got {type(metrics).__name__}")
        clean = clean_metrics(metrics)
        # Where each planned dataset stands (data/planned.py), for the checkpoint to record.
        data = (
            None
            if checkpoint is None
            else positions_at(
                self._shards.cursors,
                clean.get("epoch"),
                self._progress.get("epoch"),
                self._progress.get("step") or 0,
                self.exact_resume,
            )
        )
        if checkpoint is not None and self._ps_streams is not None:  # each parameter-server worker's stream
            data = {**(data or {}), **self._ps_streams.records()}
        clean.update(completed_epoch(clean.get("epoch"), data))  # an epoch with no rows left is completed
        epoch, step = clean.get("epoch"), clean.get("step")
        if isinstance(epoch, int) and not isinstance(epoch, bool):  # the epoch ended: the next is in progress
            self._progress.update(epoch=epoch + 1, step=0)
        if isinstance(step, int) and not isinstance(step, bool):
            self._progress["global_step"] = step
        self._uploads.raise_failure()  # an asynchronous checkpoint that failed: this report raises it
        mode = self.upload if upload is None else CheckpointUpload(upload)
        uploaded, part, snapshot = None, None, None
        if ranks == "all" and mode is CheckpointUpload.ASYNC:
            self._report_part_async(clean, checkpoint, data)
            return
        if ranks == "all":  # collective: every rank's share goes to the driver, which merges them
            parties = 1 if self.parameter_server is not None else self.context.world_size
            part = self._saver.save_part(
                clean, checkpoint, self._round, self.context.attempt, self.context.world_rank, parties, self.preempted
            )
            self._round += 1
        elif checkpoint is not None and mode is CheckpointUpload.ASYNC:
            if self._saver.due(clean, self.preempted):
                self.finish_uploads()  # one in flight (uploads.py): the previous one's commit first
                self._stop_if_halted()  # the run began stopping while this report waited for that commit
            snapshot = self._saver.snapshot(clean, checkpoint, self.preempted)
        elif checkpoint is not None:
            uploaded = self._saver.save(clean, checkpoint, self.preempted)
        with self._lock:
            report = Report(
                rank=self.context.world_rank,
                seq=self._seq,
                metrics=clean,
                time=time.time(),
                attempt=self.context.attempt,
                checkpoint=uploaded,
                part=part,
                stage=ReportStage.PENDING if snapshot is not None else None,
                data=data,
            )
            self._seq += 1
            if uploaded is not None or part is not None:
                done = self._acks[report.seq] = threading.Event()
        self._sink(report)
        if snapshot is not None:
            self._upload_in_background(report, *snapshot)
        elif uploaded is not None or part is not None:
            done.wait()  # returns once the driver's index names the checkpoint (or every rank reported)
            error = self._ack_errors.pop(report.seq, None)
            if uploaded is not None:
                self._saver.settle(uploaded.name, committed=error is None)
            if error is not None:
                raise CheckpointError(f"raytf.report: the checkpoint was not committed: {error}")

    def _report_part_async(self, metrics: dict[str, Any], checkpoint: Any, data: Optional[dict[str, Any]]) -> None:
        """A collective report (``ranks="all"``), asynchronously: a rank with a due checkpoint
        snapshots its share, reports the metrics at once (PENDING) and uploads its share in the
        background, which then reaches the driver as its part of the round (UPLOADED) and waits
        for the merged checkpoint's commit; a rank without one sends its empty share right after
        its metrics.
        The driver commits the round once every rank's share is in (history.ReportHandler)."""
        parties = 1 if self.parameter_server is not None else self.context.world_size
        round_ = self._round
        self._round += 1
        if checkpoint is not None and self._saver.due(metrics, self.preempted):
            self.finish_uploads()  # one in flight (uploads.py): the previous one's commit first
        seq, directory = self._saver.snapshot_part(metrics, checkpoint, self.preempted)
        part = CheckpointPart(round_, parties, seq)
        with self._lock:  # the metrics first (rank 0's are the history, in the order they were made)
            report = Report(
                rank=self.context.world_rank,
                seq=self._seq,
                metrics=metrics,
                time=time.time(),
                attempt=self.context.attempt,
                stage=ReportStage.PENDING,
                data=data,
            )
            self._seq += 1
        self._sink(report)
        if directory is None:  # this rank's (empty) share of the round, at once
            self._sink(dataclasses.replace(report, part=part, stage=ReportStage.UPLOADED))
            return
        shared = []

        def upload() -> None:
            shared.append(
                self._saver.upload_part_snapshot(directory, round_, self.context.attempt, self.context.world_rank)
            )

        def commit() -> Optional[str]:
            staging, files = shared[-1]
            return self._send_uploaded(
                dataclasses.replace(report, part=dataclasses.replace(part, staging=staging, files=files))
            )

        self._uploads.start(
            f"{checkpoint_name(seq)} (rank {self.context.world_rank}'s part)",
            upload,
            commit,
            lambda: _snapshot.discard(directory),
        )

    def _upload_in_background(self, report: Report, seq: int, directory: str) -> None:
        """Upload the snapshot of ``report``'s checkpoint, send the report again with it, and wait
        for the driver's commit, in the background (uploads.py)."""
        uploaded = []

        def upload() -> None:
            uploaded.append(self._saver.upload_snapshot(seq, directory))

        def commit() -> Optional[str]:
            refused = self._send_uploaded(dataclasses.replace(report, checkpoint=uploaded[-1]))
            self._saver.settle(name, committed=refused is None)
            return refused

        name = checkpoint_name(seq)
        self._uploads.start(name, upload, commit, lambda: self._saver.settle(name, committed=False))

    def _send_uploaded(self, report: Report) -> Optional[str]:
        """Send ``report`` again, its upload done (UPLOADED), and wait for the driver's answer: why
        it refused the checkpoint, or None once committed (from an upload's background thread)."""
        done = self._acks[report.seq] = threading.Event()
        self._sink(dataclasses.replace(report, stage=ReportStage.UPLOADED))
        done.wait()
        return self._ack_errors.pop(report.seq, None)

    def _stop_if_halted(self) -> None:
        if self._halted():
            raise RaytfError(
                "raytf.report: the run is stopping (its driver was stopped); no further report or "
                "checkpoint is taken, and the checkpoint in flight is committed if it can be"
            )

    def uploading(self) -> bool:
        """Whether an asynchronous checkpoint is still on its way to storage (uploads.py), or is
        setting out: its report past the halt check, its upload not yet started."""
        return self._uploads.in_flight() or self._setting_out > 0

    def finish_uploads(self) -> None:
        """Wait until the asynchronous checkpoint in flight is committed; raise if it was not (or
        an earlier one was not). ``train_fn``'s end calls it: a run ends once its last checkpoint is."""
        self._uploads.wait()
        self._uploads.raise_failure()


_session: Optional[WorkerSession] = None


def install(session: Optional[WorkerSession]) -> None:
    global _session
    _session = session


def current(function: str) -> WorkerSession:
    """This process's session; ``function`` names the caller in the error when there is none."""
    if _session is None:
        raise RaytfError(f"raytf.{function}() works only inside the train_fn that raytf.Trainer runs on its workers")
    return _session

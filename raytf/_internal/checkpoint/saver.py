"""The worker's side of checkpoints: whether a reported checkpoint is due, writing it, uploading it.

Every rank decides the same from the same metrics (so saves that run
collectives stay in step); every rank writes a ``Checkpoint.from_state``
(saving variables under MultiWorkerMirroredStrategy may run collectives);
only the chief uploads, after checking that its driver still holds the run.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

from raytf._internal import lease as _lease
from raytf._internal.checkpoint import memory as _memory
from raytf._internal.checkpoint import snapshot as _snapshot
from raytf._internal.checkpoint.files import checkpoint_name, checkpoints_dir, parts_name, upload, upload_part, verify
from raytf._internal.protocol import CheckpointPart, ResumePoint, SaveEvery, StorageRef, UploadedCheckpoint
from raytf.checkpoint import Checkpoint, StateCheckpoint
from raytf.errors import ConfigError, RaytfError

logger = logging.getLogger(__name__)

UPLOAD_TRIES = 3  # an upload's tries before its failure is the run's (storage hiccups are common)
_BACKOFF_S = 1.0  # doubled after each failed try


def retried(name: str, upload: Callable[[], Any]) -> Any:
    """``upload()``, tried again on ``OSError`` (pyarrow's storage errors, an upload found incomplete)."""
    delay = _BACKOFF_S
    for attempt in range(1, UPLOAD_TRIES + 1):
        try:
            return upload()
        except OSError as error:  # a lost lease (RaytfError) is not retried
            if attempt == UPLOAD_TRIES:
                raise
            logger.warning(
                "raytf: uploading checkpoint %s failed (%s: %s); trying again in %.0f s (%d of %d)",
                name,
                type(error).__name__,
                error,
                delay,
                attempt + 1,
                UPLOAD_TRIES,
            )
            time.sleep(delay)
            delay *= 2


class CheckpointSaver:
    def __init__(
        self,
        storage: Optional[StorageRef],
        resume: ResumePoint,
        is_chief: bool,
        save_every: Optional[SaveEvery] = None,
        lease_token: Optional[str] = None,
        in_memory: bool = False,
    ):
        self._storage = storage
        self._in_memory = in_memory  # CheckpointConfig.restore_from_memory
        self._unsettled: dict[str, str] = {}  # the chief's snapshots of uploaded checkpoints, by name, until committed
        self._next_seq = resume.next_seq
        self._is_chief = is_chief
        self._save_every = save_every
        self._lease_token = lease_token
        # Where the last saved checkpoint was, for CheckpointConfig.every_n_*.
        self.last_saved = {
            "epoch": resume.epoch if resume.epoch is not None else -1,
            "step": resume.step if resume.step is not None else 0,
        }

    def due(self, metrics: dict[str, Any], preempted: bool) -> bool:
        """Whether CheckpointConfig.every_n_* says to save the checkpoint of this report."""
        if self._save_every is None or preempted:
            return True
        unit, every = self._save_every.unit, self._save_every.n
        value = metrics.get(unit)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RaytfError(
                f"CheckpointConfig.every_n_{unit}s is set, so raytf.report(metrics, checkpoint=...) needs "
                f"a number under {unit!r} in metrics to decide whether to save; got {value!r}"
            )
        return value - self.last_saved[unit] >= every

    @staticmethod
    def _check_type(checkpoint: Any) -> None:
        if not isinstance(checkpoint, (Checkpoint, StateCheckpoint)):
            raise ConfigError(
                "raytf.report(checkpoint=...) takes raytf.Checkpoint.from_directory(path) or "
                f"raytf.Checkpoint.from_state(model=..., optimizer=...); got {type(checkpoint).__name__}"
            )

    def _take(self, metrics: dict[str, Any], checkpoint: Any, preempted: bool) -> bool:
        """Whether to save ``checkpoint`` now; if so, remember where it was."""
        self._check_type(checkpoint)
        if not self.due(metrics, preempted):
            return False
        for unit in ("epoch", "step"):
            if isinstance(metrics.get(unit), (int, float)):
                self.last_saved[unit] = metrics[unit]
        return True

    def save_part(
        self,
        metrics: dict[str, Any],
        checkpoint: Any,
        round_: int,
        attempt: int,
        rank: int,
        parties: int,
        preempted: bool = False,
    ) -> CheckpointPart:
        """This rank's share of a collective report (``ranks="all"``): its files uploaded beside the
        other ranks', for the driver to merge. Every rank counts the round, so the chief's counter
        (which names the merged checkpoint) never reuses a number its own uploads took."""
        seq = self._next_seq
        self._next_seq += 1
        if checkpoint is None or not self._take(metrics, checkpoint, preempted):
            return CheckpointPart(round_, parties, seq)
        with self._local(checkpoint) as local:
            if local is None:
                return CheckpointPart(round_, parties, seq)
            self._check_lease()
            filesystem = self._store.filesystem
            staging, files = upload_part(
                local, filesystem, checkpoints_dir(filesystem, self._store.root), parts_name(attempt, round_), rank
            )
        return CheckpointPart(round_, parties, seq, staging, files)

    def snapshot_part(
        self, metrics: dict[str, Any], checkpoint: Any, preempted: bool = False
    ) -> tuple[int, Optional[str]]:
        """An asynchronous collective report: the round's number (every rank counts it, as in
        :meth:`save_part`) and this rank's due checkpoint in host memory, or None; every rank's
        share is kept (it is this rank's part of the merged checkpoint)."""
        seq = self._next_seq
        self._next_seq += 1
        if checkpoint is None or not self._take(metrics, checkpoint, preempted):
            return seq, None
        return seq, _snapshot.take(checkpoint, keep=True, background=True)

    def upload_part_snapshot(
        self, directory: str, round_: int, attempt: int, rank: int
    ) -> tuple[str, dict[str, dict[str, int]]]:
        """Upload a rank's snapshot of its share beside the other ranks' (from a background thread)."""
        _snapshot.ready(directory)
        self._check_lease()
        filesystem = self._store.filesystem
        return upload_part(
            Checkpoint.from_directory(directory),
            filesystem,
            checkpoints_dir(filesystem, self._store.root),
            parts_name(attempt, round_),
            rank,
        )

    @contextmanager
    def _local(self, checkpoint: Any) -> Iterator[Optional[Checkpoint]]:
        """The files to upload: a directory checkpoint as it is; a state checkpoint written by every
        rank (saving may run collectives) into host memory (snapshot.py), yielded on the chief only
        (the state is replicated) and freed after."""
        if not isinstance(checkpoint, StateCheckpoint):
            yield checkpoint
            return
        directory = _snapshot.take(checkpoint, keep=self._is_chief)
        try:
            yield Checkpoint.from_directory(directory) if directory is not None else None
        finally:
            _snapshot.discard(directory)

    def save(self, metrics: dict[str, Any], checkpoint: Any, preempted: bool = False) -> Optional[UploadedCheckpoint]:
        """Write (every rank, where TensorFlow needs it) and upload (the chief) a due checkpoint.
        The chief's snapshot of a state checkpoint waits for the driver's word (:meth:`settle`)."""
        if not self._take(metrics, checkpoint, preempted):
            return None
        if not isinstance(checkpoint, StateCheckpoint):
            # Under MultiWorkerMirroredStrategy every rank holds the same weights, so
            # only the chief's checkpoint is kept; the others' are dropped here.
            return self._upload(checkpoint) if self._is_chief else None
        directory = self._snapshot(checkpoint)
        if directory is None:
            return None
        try:
            uploaded = self._upload(Checkpoint.from_directory(directory))
        except BaseException:
            _snapshot.discard(directory)
            raise
        self._unsettled[uploaded.name] = directory
        return uploaded

    def _snapshot(self, checkpoint: Any, background: bool = False) -> Optional[str]:
        if self._in_memory:
            _memory.sweep_once()  # copies of ended runs first: they hold the memory this one needs
        return _snapshot.take(checkpoint, keep=self._is_chief, background=background)

    def settle(self, name: str, committed: bool) -> None:
        """The driver committed (or refused) checkpoint ``name``: its snapshot becomes this node's
        copy of the run's newest checkpoint (memory.py, with ``restore_from_memory``), or is freed."""
        directory = self._unsettled.pop(name, None)
        if directory is None:
            return
        if committed and self._in_memory and self._storage is not None:
            try:
                _memory.keep(self._storage, name, directory)
                return
            except OSError as error:  # a restart then reads storage, as it would without the copy
                logger.warning("raytf: checkpoint %s could not be kept in host memory: %s", name, error)
        _snapshot.discard(directory)

    @property
    def _store(self) -> StorageRef:
        if self._storage is None:  # a worker started outside a run (raytf's own tests): nowhere to upload
            raise RaytfError("raytf.report: this worker has no run storage to upload a checkpoint to")
        return self._storage

    def _check_lease(self) -> None:
        filesystem, root = self._store.filesystem, self._store.root
        if self._lease_token is not None and not _lease.holds(filesystem, root, self._lease_token):
            raise RaytfError(
                "raytf.report: this run's driver no longer holds the run's lease (another driver took "
                "the run over, or the driver stopped renewing it); not uploading the checkpoint"
            )

    def _upload(self, checkpoint: Checkpoint) -> UploadedCheckpoint:
        seq = self._next_seq
        self._next_seq += 1
        return retried(checkpoint_name(seq), lambda: self._upload_as(checkpoint, seq))

    def _upload_as(self, checkpoint: Checkpoint, seq: int) -> UploadedCheckpoint:
        filesystem, root = self._store.filesystem, self._store.root
        self._check_lease()
        name = checkpoint_name(seq)
        path = upload(checkpoint, filesystem, checkpoints_dir(filesystem, root), name)
        # One listing: an object store that lost a part of the upload without an error (seen with a
        # loaded S3-compatible server and GiB-sized files) fails here, where the upload can be tried
        # again (uploads.py), rather than at the driver's commit.
        problem = verify(filesystem, path, checksums=False)
        if problem is not None:
            raise OSError(f"checkpoint {name} is incomplete in storage after its upload: {problem}")
        return UploadedCheckpoint(name=name, seq=seq)

    def snapshot(self, metrics: dict[str, Any], checkpoint: Any, preempted: bool = False) -> Optional[tuple[int, str]]:
        """Asynchronous reports: put a due checkpoint in host memory (snapshot.py) and number it;
        (its number, its directory) on the chief, which uploads it later with :meth:`upload_snapshot`
        and hands it to :meth:`settle` once the driver has answered."""
        if not self._take(metrics, checkpoint, preempted):
            return None
        directory = self._snapshot(checkpoint, background=True)
        if directory is None:
            return None
        seq = self._next_seq
        self._next_seq += 1
        self._unsettled[checkpoint_name(seq)] = directory
        return seq, directory

    def upload_snapshot(self, seq: int, directory: str) -> UploadedCheckpoint:
        """Upload a snapshot under the number :meth:`snapshot` gave it (from a background thread)."""
        _snapshot.ready(directory)
        return self._upload_as(Checkpoint.from_directory(directory), seq)

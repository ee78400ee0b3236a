"""``raytf.Checkpoint``: a directory of files, or TensorFlow objects saved when reported.

How checkpoints are uploaded, committed, kept and resumed from lives in
``raytf._internal.checkpoint``; this is what ``train_fn`` touches.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import pyarrow.fs as pafs

from raytf.errors import CheckpointError, ConfigError

STATE_PREFIX = "state"  # the tf.train.Checkpoint files of Checkpoint.from_state: state.index, state.data-*

__all__ = ["Checkpoint", "CheckpointError", "StateCheckpoint"]


class Checkpoint:
    """A directory of files: the user's own, on local disk or in the run's storage."""

    def __init__(self, path: str, filesystem: Optional[pafs.FileSystem] = None, metadata: Optional[dict] = None):
        self.path = path
        self.filesystem = filesystem or pafs.LocalFileSystem()
        self.metadata: dict[str, Any] = dict(metadata or {})

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> "Checkpoint":
        """A checkpoint of the files in a local directory (they are copied at ``report``)."""
        local = os.path.abspath(os.fspath(path))
        if not os.path.isdir(local):
            raise ConfigError(f"Checkpoint.from_directory: {local!r} is not a directory")
        from raytf._internal.checkpoint.files import check_links

        check_links(local)
        return cls(local)

    @staticmethod
    def from_state(**trackables: Any) -> "StateCheckpoint":
        """A checkpoint of TensorFlow objects, written when it is reported.

        ``raytf.report(metrics, checkpoint=raytf.Checkpoint.from_state(model=model,
        optimizer=optimizer))`` saves them as one ``tf.train.Checkpoint`` (any
        trackable works: Keras 3 or tf-keras models and optimizers, variables,
        ``tf.data`` iterators). Every rank writes, since saving variables under
        MultiWorkerMirroredStrategy may run collectives; only the chief's copy
        is kept. Restore with :meth:`restore_state`.
        """
        if not trackables:
            raise ConfigError("Checkpoint.from_state needs the objects to save, e.g. model=model, optimizer=optimizer")
        return StateCheckpoint(trackables)

    def restore_state(self, **trackables: Any) -> None:
        """Load a checkpoint made by :meth:`from_state` into the same objects, by the same names.

        Every object passed must be found in the checkpoint. Variables that do
        not exist yet (an optimizer's slots before its first step) are
        restored when they are created, so the files are kept until then.
        """
        import tensorflow as tf

        if self.filesystem.get_file_info(self.path).type == pafs.FileType.NotFound:
            raise CheckpointError(
                f"{self!r} no longer exists: it was deleted after it was handed out (CheckpointConfig.num_to_keep "
                "deletes older checkpoints as newer ones commit, and a person or a lifecycle rule may delete "
                "files). Restore from a newer checkpoint, or keep more with CheckpointConfig.num_to_keep"
            )
        local = self.path if isinstance(self.filesystem, pafs.LocalFileSystem) else _kept_copy(self)
        prefix = os.path.join(local, STATE_PREFIX)
        if not os.path.exists(prefix + ".index"):
            raise CheckpointError(
                f"{self!r} holds no Checkpoint.from_state files ({STATE_PREFIX}.index); it was made "
                "with Checkpoint.from_directory, so read its files with as_directory()"
            )
        status = tf.train.Checkpoint(**trackables).read(prefix)
        status.assert_existing_objects_matched().expect_partial()

    @property
    def epoch(self) -> Optional[int]:
        return self.metadata.get("epoch")

    @property
    def step(self) -> Optional[int]:
        return self.metadata.get("step")

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files (downloaded if it lives remotely)."""
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            yield self.path
            return
        scratch = tempfile.mkdtemp(prefix="raytf-checkpoint-")
        try:
            self.to_directory(scratch)
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def to_directory(self, path: Optional[str | os.PathLike] = None) -> str:
        """Copy the checkpoint's files into a local directory and return its path: ``path``, or a
        new temporary directory (as Ray Train's ``to_directory()`` makes). Only the user's files:
        raytf's manifest stays behind."""
        from raytf._internal.checkpoint.files import MANIFEST
        from raytf._internal.storage import copy_files

        local = tempfile.mkdtemp(prefix="raytf-checkpoint-") if path is None else os.fspath(path)
        os.makedirs(local, exist_ok=True)
        root = self.path.rstrip("/")
        for info in self.filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
            relative = info.path[len(root) :].lstrip("/").lstrip(os.sep)
            if info.type != pafs.FileType.File or relative == MANIFEST:
                continue
            target = os.path.join(local, *relative.replace(os.sep, "/").split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            copy_files(info.path, target, self.filesystem, pafs.LocalFileSystem())
        return local

    def get_metadata(self) -> dict[str, Any]:
        """What the run recorded of this checkpoint (Ray Train's spelling): its ``epoch``, ``step``,
        the ``metrics`` of the report it came from, its ``name`` and when it was committed."""
        return dict(self.metadata)

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r}, epoch={self.epoch}, step={self.step})"


_RESTORE_PREFIX = "raytf-restore-"  # then the process id: a gone process's copies are swept away


def _kept_copy(checkpoint: Checkpoint) -> str:
    """A local copy of a remote checkpoint that lives as long as the process (for deferred
    restores: TensorFlow reads a variable's value when the variable is made). raytf ends a
    worker by killing it, so no exit hook runs there: each copy is named by its process, and the
    next copy made on the node removes those whose process is gone (the size of a checkpoint each,
    in the node's temporary directory)."""
    import atexit

    from raytf._internal.checkpoint.files import sweep_dead

    sweep_dead(tempfile.gettempdir(), _RESTORE_PREFIX)
    scratch = tempfile.mkdtemp(prefix=f"{_RESTORE_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, scratch, True)
    return checkpoint.to_directory(scratch)


class StateCheckpoint:
    """TensorFlow objects to save as a ``tf.train.Checkpoint`` at ``raytf.report`` time."""

    def __init__(self, trackables: dict[str, Any]):
        self.trackables = dict(trackables)

    def write(self, directory: str) -> None:
        import tensorflow as tf

        from raytf._internal.checkpoint.state import save_options

        tf.train.Checkpoint(**self.trackables).write(os.path.join(directory, STATE_PREFIX), options=save_options())

    def host_copy(self) -> Any:
        """A copy of the state in host memory to write in the background (an asynchronous
        report's), or None where an object cannot copy itself (it is then written at once)."""
        from raytf._internal.checkpoint import state

        return state.host_copy(self.trackables)

    def __repr__(self) -> str:
        return f"Checkpoint.from_state({', '.join(self.trackables)})"

"""A reported checkpoint's bytes in host memory: written (``Checkpoint.from_state``, every report;
an asynchronous report's by its upload thread, from a host copy of the state, state.py) or
copied (``Checkpoint.from_directory``, an asynchronous report's, ``CheckpointConfig(
upload="async")``) into shared memory, from where they are uploaded (by a background thread while
training goes on, for an asynchronous report).

Shared memory (``/dev/shm``, a tmpfs) makes the snapshot a copy in RAM: writing it costs what
serializing the variables costs, with no disk in the way. Where ``/dev/shm`` is missing, not
writable, or too small for the state (a container's default is 64 MiB), the snapshot goes to the
temporary directory instead, and stays there for the rest of the process. A state written in the
background is measured first (the host copy's bytes against the free space of ``/dev/shm``),
since a write that fails after ``report`` returned can no longer go elsewhere: it fails the
checkpoint, naming why, and later snapshots skip shared memory.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any, Callable, Optional

import pyarrow.fs as pafs

from raytf._internal.checkpoint import state as _state
from raytf._internal.checkpoint.files import check_links, sweep_dead
from raytf._internal.storage import copy_files
from raytf.errors import CheckpointError

logger = logging.getLogger(__name__)

SHARED_MEMORY = "/dev/shm"
PREFIX = "raytf-snapshot-"  # then the process id: a dead process's snapshots are swept away
_disk_only = False  # /dev/shm refused a snapshot once: use the temporary directory from then on
_swept = False
_unwritten: dict[str, tuple[_state.HostCopy, str]] = {}  # snapshot directory -> (host copy, prefix) to write


def _roots() -> list[str]:
    usable = not _disk_only and os.path.isdir(SHARED_MEMORY) and os.access(SHARED_MEMORY, os.W_OK)
    return ([SHARED_MEMORY] if usable else []) + [tempfile.gettempdir()]


def take(checkpoint: Any, *, keep: bool, background: bool = False) -> Optional[str]:
    """Put ``checkpoint`` in host memory; the snapshot's directory, or None when ``keep`` is False.

    A state checkpoint is written (or, with ``background``, copied in host memory) on every rank,
    kept or not (reading variables under MultiWorkerMirroredStrategy may run collectives, which
    every rank must join); with ``background`` :func:`ready` writes its files, called from the
    upload's background thread. A directory checkpoint is copied only where it is kept, so the
    user may delete or rewrite the directory as soon as ``raytf.report`` returns.
    """
    from raytf.checkpoint import StateCheckpoint

    if isinstance(checkpoint, StateCheckpoint):
        copy = checkpoint.host_copy() if background else None
        if copy is not None:
            return _directory_for(copy) if keep else None
        fill: Callable[[str], None] = checkpoint.write
    elif keep:
        fill = lambda directory: _copy_directory(checkpoint, directory)  # noqa: E731
    else:
        return None
    global _disk_only
    roots = _sweep_once()
    for position, root in enumerate(roots):
        directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=root)
        try:
            fill(directory)
        except Exception as error:  # noqa: BLE001 - shared memory full: the disk is the fallback
            shutil.rmtree(directory, ignore_errors=True)
            if root != SHARED_MEMORY or position == len(roots) - 1:
                raise
            _disk_only = True
            logger.warning(
                "raytf: a checkpoint snapshot did not fit in %s (%s: %s); snapshots go to %s from now "
                "on (give the workers a larger /dev/shm to keep them in memory)",
                SHARED_MEMORY,
                type(error).__name__,
                str(error)[:200],
                roots[-1],
            )
            continue
        if keep:
            return directory
        shutil.rmtree(directory, ignore_errors=True)
        return None
    raise AssertionError("unreachable: the last root raises")


def _sweep_once() -> list[str]:
    global _swept
    roots = _roots()
    if not _swept:
        _swept = True
        for root in roots:
            sweep(root)
    return roots


def _directory_for(copy: _state.HostCopy) -> str:
    global _disk_only
    roots = _sweep_once()
    if roots[0] == SHARED_MEMORY and len(roots) > 1:
        free = free_bytes(SHARED_MEMORY)
        if copy.nbytes + (copy.nbytes >> 4) + (1 << 20) > free:  # the index and headroom besides the tensors
            _disk_only = True
            roots = roots[1:]
            logger.warning(
                "raytf: a checkpoint snapshot of %.1f MiB does not fit in %s (%.1f MiB free); snapshots "
                "go to %s from now on (give the workers a larger /dev/shm to keep them in memory)",
                copy.nbytes / 2**20,
                SHARED_MEMORY,
                free / 2**20,
                roots[0],
            )
    directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=roots[0])
    from raytf.checkpoint import STATE_PREFIX

    _unwritten[directory] = (copy, os.path.join(directory, STATE_PREFIX))
    return directory


def free_bytes(root: str) -> int:
    stat = os.statvfs(root)
    return stat.f_bavail * stat.f_frsize


def ready(directory: str) -> None:
    """Write the files of a snapshot taken with ``background`` (from the upload's thread, while
    training goes on); raises CheckpointError, naming why, where writing them failed (the
    snapshot is removed, and later ones skip shared memory)."""
    global _disk_only
    pending = _unwritten.pop(directory, None)
    if pending is None:
        return
    copy, prefix = pending
    try:
        copy.write(prefix)
        return
    except Exception as failure:  # noqa: BLE001 - named in the CheckpointError below
        error = failure
    finally:
        copy.release()  # the host copy's buffers are free once the files are written
    shutil.rmtree(directory, ignore_errors=True)
    if directory.startswith(SHARED_MEMORY + os.sep):
        _disk_only = True
    raise CheckpointError(
        f"writing the checkpoint's state into {os.path.dirname(directory)} failed "
        f"({type(error).__name__}: {str(error)[:300]})"
    )


def sweep(root: str) -> None:
    """Remove the snapshots in ``root`` of worker processes that died with a checkpoint in flight
    (a crash leaves them behind, holding memory until the node reboots)."""
    sweep_dead(root, PREFIX)


def _copy_directory(checkpoint: Any, directory: str) -> None:
    """The files of a directory checkpoint (local or in storage), links checked as an upload checks them."""
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        check_links(checkpoint.path)
    copy_files(checkpoint.path, directory, checkpoint.filesystem, pafs.LocalFileSystem())


def discard(directory: Optional[str]) -> None:
    if directory is None:
        return
    pending = _unwritten.pop(directory, None)
    if pending is not None:  # never written: free its host copy
        pending[0].release()
    shutil.rmtree(directory, ignore_errors=True)

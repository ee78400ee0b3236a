"""The newest committed checkpoint, kept in host memory on the chief's node for restarts
(``CheckpointConfig(restore_from_memory=True)``, the default).

A checkpoint the chief reported is in host memory already (snapshot.py: ``/dev/shm``, or the
temporary directory where shared memory is missing or full). Once the driver has committed it,
the chief renames that snapshot into the run's memory copy on its node instead of deleting it:
no byte is copied, and the copy it replaces is removed, so a node holds one checkpoint of a run.
A worker that restores on that node later (a warm standby, or a new actor of a restarted
attempt, whose placement group raytf keeps where its nodes stay) reads the copy instead of
storage when it is the checkpoint the attempt resumes from and every file matches the CRC32 that
the committed manifest in storage records; anything else (another checkpoint, a missing or
changed file, no copy) falls back to storage.

Copies outlive worker processes on purpose (a crashed worker's node keeps the run's copy), and
are bounded: one checkpoint per run per node; when the run ends its group's members remove the
copies on their nodes (``MemoryCopies``, driver/callbacks.py); and a copy whose run's placement
group is gone (a driver that died, a run whose last worker on the node crashed), or whose Ray
cluster is gone, is swept by the next raytf worker that snapshots a checkpoint on the node
(:func:`sweep`), as is a copy that names no owner once it is ``ORPHAN_AGE_S`` old.

Layout: ``<root>/raytf-memory-<run key>/<checkpoint name>/``, the run key a hash of the run's
storage (filesystem type and path), so runs sharing a node never see each other's copies, and
``<root>/raytf-memory-<run key>/owner``: the id of the placement group of the worker that kept it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
import time
from typing import Callable, Optional

from raytf._internal.checkpoint.files import seq_of_name, verify
from raytf._internal.checkpoint import snapshot as _snapshot
from raytf._internal.protocol import StorageRef

logger = logging.getLogger(__name__)

PREFIX = "raytf-memory-"
OWNER = "owner"
# A copy with no owner (its worker was killed between keeping it and naming its owner, or knew no
# placement group) cannot be judged by its run's placement group: it is swept once this old.
ORPHAN_AGE_S = 600.0


def _run_dir(root: str, storage: StorageRef) -> str:
    key = hashlib.sha256(f"{storage.filesystem.type_name}:{storage.root}".encode()).hexdigest()[:20]
    return os.path.join(root, PREFIX + key)


def _run_dirs(storage: StorageRef) -> list[str]:
    return [_run_dir(root, storage) for root in (_snapshot.SHARED_MEMORY, tempfile.gettempdir())]


def keep(storage: StorageRef, name: str, snapshot: str) -> str:
    """Make the snapshot of the just-committed checkpoint ``name`` this node's copy of the run's
    newest checkpoint (a rename: the snapshot is in the same filesystem); remove the older copy.
    Returns the copy's directory."""
    run_dir = _run_dir(os.path.dirname(snapshot), storage)
    os.makedirs(run_dir, exist_ok=True)
    target = os.path.join(run_dir, name)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(snapshot, target)
    with open(os.path.join(run_dir, OWNER), "w") as out:
        out.write(_owner)
    drop(storage, but=name)
    return target


# Set by the worker actor (the Ray side, worker/actor.py): its cluster (the GCS address) and
# placement group, and how to learn which placement groups of that cluster still exist.
_owner = ""  # "<cluster> <placement group id>"
_live_groups: Optional[Callable[[], set[str]]] = None
_swept = False


def configure(cluster: str, placement_group: str, live_groups: Callable[[], set[str]]) -> None:
    """This process's cluster and placement group, and the cluster's placement groups that exist
    now (for :func:`sweep`)."""
    global _owner, _live_groups
    _owner = f"{cluster} {placement_group}" if placement_group else ""
    _live_groups = live_groups


def sweep_once() -> None:
    """:func:`sweep` shared memory and the temporary directory, once per process."""
    global _swept
    if not _swept:
        _swept = True
        for root in (_snapshot.SHARED_MEMORY, tempfile.gettempdir()):
            sweep(root)


def sweep(root: str) -> None:
    """Remove the copies in ``root`` of runs whose placement group no longer exists in this
    process's cluster: the run ended without its members removing them (its driver died, or its
    last worker on this node crashed). Copies owned in another cluster (another ``ray start`` on
    the same machine) are that cluster's to judge."""
    owners = {}
    for entry in _names(root):
        if entry.startswith(PREFIX):
            try:
                with open(os.path.join(root, entry, OWNER)) as stream:
                    owners[entry] = stream.read().strip()
            except OSError:
                owners[entry] = ""
            if not owners[entry]:
                del owners[entry]
                _sweep_orphan(os.path.join(root, entry))
    cluster = _owner.rpartition(" ")[0]
    for entry, owner in list(owners.items()):
        other = owner.rpartition(" ")[0]
        if other and other != cluster and _cluster_gone(other):
            logger.info("raytf: removing %s, the checkpoint copy of a Ray cluster that is gone", entry)
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
    owners = {
        entry: owner.rpartition(" ")[2]
        for entry, owner in owners.items()
        if cluster and owner.rpartition(" ")[0] == cluster
    }
    if not owners or _live_groups is None:
        return
    try:
        live = _live_groups()
    except Exception:  # noqa: BLE001 - no answer from Ray: sweep another time
        return
    for entry, owner in owners.items():
        if owner not in live:
            logger.info("raytf: removing %s, the checkpoint copy of a run that ended", entry)
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)


def _sweep_orphan(run_dir: str) -> None:
    """Remove a copy that names no owner once nothing in it changed for ``ORPHAN_AGE_S``."""
    try:
        newest = max(
            [os.stat(run_dir).st_mtime] + [os.stat(os.path.join(run_dir, n)).st_mtime for n in _names(run_dir)]
        )
    except OSError:
        return
    if time.time() - newest > ORPHAN_AGE_S:
        logger.info("raytf: removing %s, a checkpoint copy that names no owner", os.path.basename(run_dir))
        shutil.rmtree(run_dir, ignore_errors=True)


def find(storage: StorageRef, name: str) -> Optional[str]:
    """This node's copy of checkpoint ``name`` of the run, or None."""
    for run_dir in _run_dirs(storage):
        path = os.path.join(run_dir, name)
        if os.path.isdir(path):
            return path
    return None


def usable(storage: StorageRef, name: str, stored: str) -> Optional[str]:
    """This node's copy of committed checkpoint ``name`` (at ``stored`` in storage), if it has one
    and every file matches the committed manifest's size and CRC32; None otherwise. A copy that
    does not verify is removed (it would never verify later), and the reason logged."""
    copy = find(storage, name)
    if copy is None:
        return None
    problem = verify(storage.filesystem, stored, copy=copy)
    if problem is None:
        return copy
    logger.warning(
        "raytf: the copy in host memory of checkpoint %s does not match the committed one (%s); restoring from storage",
        name,
        problem,
    )
    shutil.rmtree(copy, ignore_errors=True)
    return None


def drop_older(storage: StorageRef, name: str) -> None:
    """Remove this node's copies of the run's checkpoints older than ``name`` (a restart resumes
    from ``name`` or later, so they would never be read)."""
    newest = seq_of_name(name)
    for run_dir in _run_dirs(storage):
        for entry in _names(run_dir):
            seq = seq_of_name(entry)
            if newest is not None and seq is not None and seq < newest:
                shutil.rmtree(os.path.join(run_dir, entry), ignore_errors=True)


def drop(storage: StorageRef, but: Optional[str] = None) -> None:
    """Remove this node's copies of the run's checkpoints (all, or all but ``but``)."""
    for run_dir in _run_dirs(storage):
        if but is None:
            shutil.rmtree(run_dir, ignore_errors=True)
            continue
        for entry in _names(run_dir):
            if entry not in (but, OWNER):
                shutil.rmtree(os.path.join(run_dir, entry), ignore_errors=True)


def _cluster_gone(address: str) -> bool:
    """Nothing listens at a cluster's GCS address any more (refused; any other answer or error
    leaves the copy alone: another cluster that may be alive)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return False
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def _names(run_dir: str) -> list[str]:
    try:
        return os.listdir(run_dir)
    except OSError:
        return []

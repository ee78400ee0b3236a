"""A parameter-server worker's shard as files its own TensorFlow server reads.

Under ParameterServerStrategy the chief builds every dataset and each worker's
TensorFlow server runs it: the pipeline is a graph, and a graph cannot call
back into the worker's Python (no ``py_function``, no generator). So before a
worker's server starts, its actor reads its shard from Ray Data once (in whole
blocks, as the cached path of the synchronous trainer does) and writes each
column as serialized tensors to files on its own node; the chief's pipeline
reads those files on that worker, once, and batches them with one gather per
column (tfdata_ps.py), at in-memory speed.

The files live in a directory fixed by the run's identity (storage, name and the
driver's lease) and the worker's task index on the worker's node
(``shard_directory``), not by the process: a worker that dies is replaced at the
same task index, rewrites the same paths from the same Ray Data piece, and the
chief's pipelines, which name those paths, go on reading. The actor removes the
directory when the group shuts it down.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from raytf._internal.data.columns import read_shard
from raytf.errors import DatasetShardError

if TYPE_CHECKING:
    from raytf._internal.protocol import RunSpec

CHUNK_BYTES = 256 << 20  # one serialized tensor per file stays far below protobuf's 2 GiB


@dataclass(frozen=True)
class ColumnFiles:
    """One column of one worker's shard: its dtype and per-row shape, its rows, and the files that
    hold it in order (``tf.io.serialize_tensor`` of consecutive row ranges)."""

    dtype: str
    shape: tuple[int, ...]
    rows: int
    files: tuple[str, ...]


# dataset name -> column name -> its files on this worker
ShardFiles = dict[str, dict[str, ColumnFiles]]


def shard_directory(run: "RunSpec", task_index: int) -> str:
    """Where worker ``task_index`` of ``run`` keeps its shard files on its node.

    Keyed by the run's identity: its storage, its name and the driver's lease
    token. Two jobs with the same run name (in other storage, or one after the
    other) never share files, and a replacement worker of the same driver
    finds its predecessor's directory. The parent is private to this user
    (``<tmp>/raytf-shards-<uid>``, mode 0700).
    """
    identity = "\0".join((run.run_path, run.run_name, run.lease_token or ""))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]  # names and paths may hold any character
    base = os.path.join(tempfile.gettempdir(), f"raytf-shards-{os.getuid()}")
    return os.path.join(base, digest, f"worker-{task_index}")


def _private_directory(path: str) -> None:
    """``path`` as a directory of this user's that nobody else can enter: created 0700 if missing;
    an existing one must be a real directory (not a link), owned by this user, closed to others."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        problem = "a symbolic link"
    elif not stat.S_ISDIR(info.st_mode):
        problem = "not a directory"
    elif info.st_uid != os.getuid() or info.st_mode & 0o077:
        problem = f"not private to this user (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)})"
    else:
        return
    raise DatasetShardError(
        f"{path} is where raytf keeps parameter-server shard files, but it is {problem}: something may be "
        "redirecting them. Remove it; raytf creates it again, mode 0700"
    )


class ShardFileWriter:
    """Writes a worker's shards to its directory, and removes them on ``close()``.

    The directory is made safely: its parents are private to this user, and
    whatever is at its own path (a predecessor's half-written files, or a
    planted symbolic link) is removed, never followed, before it is created
    afresh with mode 0700.
    """

    def __init__(self, directory: str):
        self._directory = directory
        run_dir = os.path.dirname(directory)
        _private_directory(os.path.dirname(run_dir))
        _private_directory(run_dir)
        if os.path.islink(directory) or os.path.isfile(directory):
            os.unlink(directory)  # the link itself, not what it points to
        elif os.path.lexists(directory):
            shutil.rmtree(directory)  # what a dead predecessor left (rmtree never follows links inside)
        os.mkdir(directory, 0o700)  # fails if anything was put back meanwhile
        _private_directory(directory)

    def write(self, datasets: Mapping[str, Any]) -> ShardFiles:
        """Read each dataset's iterator to the end and write every column to files."""
        written: ShardFiles = {}
        for name, iterator in datasets.items():
            arrays = read_shard(iterator, name)
            written[name] = {column: self._column(name, column, values) for column, values in arrays.items()}
        return written

    def _column(self, dataset: str, column: str, values: np.ndarray) -> ColumnFiles:
        import tensorflow as tf

        rows = len(values)
        if values.dtype == object or values.dtype.kind in "SU":
            sample = values[: min(rows, 1000)]
            row_bytes = max(1, sum(len(v) for v in sample) // max(1, len(sample)) + 16)
        else:
            row_bytes = max(1, values.nbytes // max(rows, 1))
        per_chunk = max(1, CHUNK_BYTES // row_bytes)
        files = []
        for index, start in enumerate(range(0, max(rows, 1), per_chunk)):
            path = os.path.join(self._directory, f"{_safe(dataset)}.{_safe(column)}.{index}")
            with tf.device("/cpu:0"):
                tf.io.write_file(path, tf.io.serialize_tensor(tf.convert_to_tensor(values[start : start + per_chunk])))
            files.append(path)
        dtype = "string" if values.dtype == object or values.dtype.kind in "SU" else values.dtype.name
        return ColumnFiles(dtype=dtype, shape=tuple(int(d) for d in values.shape[1:]), rows=rows, files=tuple(files))

    def close(self) -> None:
        if os.path.isdir(self._directory) and not os.path.islink(self._directory):
            shutil.rmtree(self._directory, ignore_errors=True)
        try:
            os.rmdir(os.path.dirname(self._directory))  # the run's directory, once its last worker is gone
        except OSError:
            pass


def _safe(name: str) -> str:
    """A dataset or column name as a file name part: its own characters where harmless, else a digest."""
    if name.replace("_", "").replace("-", "").isalnum():
        return name
    return hashlib.sha256(name.encode()).hexdigest()[:16]

"""A parameter-server worker's shard as files its own TensorFlow server reads.

Under ParameterServerStrategy the chief builds every dataset and each worker's
TensorFlow server runs it: the pipeline is a graph, and a graph cannot call
back into the worker's Python (no ``py_function``, no generator). So before a
worker's server starts, its actor reads its shard from Ray Data once (in whole
blocks, as the cached path of the synchronous trainer does) and writes each
column as serialized tensors to files on its own node; the chief's pipeline
reads those files on that worker, once, and batches them with one gather per
column (tfdata_ps.py), at in-memory speed.

The files live in a directory fixed by the run and the worker's task index on
the worker's node (``shard_directory``), not by the process: a worker that dies
is replaced at the same task index, rewrites the same paths from the same Ray
Data piece, and the chief's pipelines, which name those paths, go on reading.
The actor removes the directory when the group shuts it down; the next run of
the same name on that node overwrites whatever a crash left.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from raytf._internal.data.tfdata import read_shard

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


def shard_directory(run_name: str, task_index: int) -> str:
    """Where worker ``task_index`` of run ``run_name`` keeps its shard files on its node."""
    digest = hashlib.sha256(run_name.encode()).hexdigest()[:12]  # run names may hold any character
    return os.path.join(tempfile.gettempdir(), "raytf-shards", digest, f"worker-{task_index}")


class ShardFileWriter:
    """Writes a worker's shards to its directory, and removes them on ``close()``."""

    def __init__(self, directory: str):
        self._directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # what a dead predecessor left half written
        os.makedirs(directory, mode=0o700, exist_ok=True)  # the user's data: readable by its owner only

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
                tf.io.write_file(path, tf.io.serialize_tensor(tf.convert_to_tensor(values[start:start + per_chunk])))
            files.append(path)
        dtype = "string" if values.dtype == object or values.dtype.kind in "SU" else values.dtype.name
        return ColumnFiles(dtype=dtype, shape=tuple(int(d) for d in values.shape[1:]), rows=rows, files=tuple(files))

    def close(self) -> None:
        shutil.rmtree(self._directory, ignore_errors=True)


def _safe(name: str) -> str:
    """A dataset or column name as a file name part: its own characters where harmless, else a digest."""
    if name.replace("_", "").replace("-", "").isalnum():
        return name
    return hashlib.sha256(name.encode()).hexdigest()[:16]

"""File formats a worker reads directly (``raytf.data.tfrecord_files``, ``parquet_files``): one
class each, which is all a format is to the rest of the data path.

The path runs one way: a source (files.py: :class:`FileSource`, the files listed) is planned here
into a :class:`FilePlan` (every file's chunks counted by its format), positions in an epoch's
:class:`Layout` are cut into runs per rank (position.py), and a rank's run is read into tf.data
(read_files.py) by its format's piece reader. A format answers for:

- ``scan``: one file's chunks (rows, first record or row group, byte offset, bytes) and what the
  plan needs of its schema, read by the driver (pyarrow; no TensorFlow);
- ``schema``: the plan's column -> (NumPy dtype, per-row shape), from every file's scan;
- ``chunk_is_window``: whether a chunk is a shuffle window of its own (a Parquet row group);
- ``reads_in_order_without_copy``: whether a piece that takes every row in order needs no take;
- ``piece_reader``: in the worker, a function ``(chunks, take) -> {column: tensor}`` for tf.data;
- ``bad_record``: once a read failed, the first record of a file it cannot read, or None.

Adding a format is adding a module here with one such class, and its tests.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.data.files import FilePlan, FileSource, file_stats, filesystem_of, list_files
from raytf._internal.data.formats.parquet import Parquet
from raytf._internal.data.formats.tfrecord import TFRecord

FORMATS = {f.name: f for f in (TFRecord(), Parquet())}


def format_of(source: FileSource) -> Any:
    return FORMATS[source.format]


def plan_files(source: FileSource, threads: int = 8) -> FilePlan:
    """Count every file's chunks with its format (in parallel: reading headers waits on storage)
    into a plan."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    fmt = format_of(source)
    files = list_files(source)

    def scan(path: str) -> Any:
        filesystem, on_fs = filesystem_of(path)
        return fmt.scan(source, filesystem, on_fs, path)

    with ThreadPoolExecutor(min(threads, len(files))) as pool:
        scanned = list(pool.map(scan, files))

    def column(i: int) -> np.ndarray:
        return np.array([v for s in scanned for v in s[i]], dtype=np.int64)

    return FilePlan(
        source,
        tuple(files),
        np.repeat(np.arange(len(files), dtype=np.int64), [len(s[0]) for s in scanned]),
        column(1),
        column(0),
        column(2),
        column(3),
        fmt.schema(source, files, [s[4] for s in scanned]),
        tuple(file_stats(files)),
        chunk_is_window=fmt.chunk_is_window,
    )

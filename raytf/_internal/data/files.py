"""Directories of files read by each worker directly, every row of an epoch once, by file and
record: the source, its plan, and an epoch's order of it. What differs by file format is in
formats/ (one class a format).

The driver lists the files and counts their rows once per run (``formats.plan_files``): a
Parquet file's row groups from its footer; a TFRecord file's records from their headers, keeping
the byte offset of every ``chunk_rows``-th record. The dataset is cut into chunks (a run of at most
``chunk_rows`` records of one TFRecord file, or one Parquet row group), the units a worker reads
on its own. Every epoch has one order (:class:`Layout`): the chunks in file order, or with
``shuffle=True`` in a seeded permutation, grouped into shuffle windows of about
``shuffle_rows`` rows; with ``shuffle=True`` the rows of each window are permuted too (the
shuffle buffer of TensorFlow's own recipe, made reproducible). Positions in that order are
what data/position.py cuts into one run per rank and records in every checkpoint, as for a
materialized Ray Dataset; a rank reads its run as :class:`Piece`\\ s: the chunks of one window
it needs, and which of their records to take, in order. Nothing here imports TensorFlow or Ray
(read_files.py builds the tf.data pipeline); pyarrow lists the files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from raytf._internal.data.position import Ranges
from raytf.errors import ConfigError

_WINDOW_BYTES = 64 << 20  # a shuffle window also ends once its chunks hold this many bytes


@dataclass(frozen=True)
class FileSource:
    """What ``raytf.data.tfrecord_files`` and ``parquet_files`` return: files to plan, not read yet."""

    format: str  # "tfrecord" or "parquet"
    paths: tuple[str, ...]
    features: Optional[dict] = None  # TFRecord: name -> (shape, NumPy dtype, default), see raytf.data.feature_spec
    columns: Optional[tuple[str, ...]] = None  # Parquet: the columns read (None: all)
    chunk_rows: int = 1024
    shuffle_rows: int = 8192

    def describe(self) -> str:
        shown = ", ".join(self.paths[:2]) + (", ..." if len(self.paths) > 2 else "")
        return f"{self.format} files at {shown}"


@dataclass(frozen=True)
class FilePlan:
    """A file source as the driver counted it, one entry per chunk (see the module's text)."""

    source: FileSource
    files: tuple[str, ...]
    chunk_file: np.ndarray  # the file each chunk is in
    chunk_first: np.ndarray  # its first record (TFRecord) or its row group (Parquet)
    chunk_rows: np.ndarray  # its rows
    chunk_offset: np.ndarray  # TFRecord: the byte offset of its first record
    chunk_bytes: np.ndarray  # its size in bytes (Parquet: the row group's, uncompressed)
    schema: dict = field(default_factory=dict)  # Parquet: column -> (NumPy dtype, per-row shape)
    file_stats: tuple = ()  # (bytes, modification time in ns) of each file as counted; () = not checked
    chunk_is_window: bool = False  # each chunk a shuffle window of its own (the format's: a Parquet row group)

    @property
    def rows(self) -> int:
        return int(self.chunk_rows.sum())

    def signature(self) -> list:
        """What a checkpoint's position is checked against: the files and their rows."""
        per_file = np.bincount(self.chunk_file, weights=self.chunk_rows, minlength=len(self.files))
        return [[path, int(rows)] for path, rows in zip(self.files, per_file)]


@dataclass(frozen=True)
class FileShard:
    """A file source as every rank of an attempt gets it: the plan, and the run's data seed."""

    name: str
    plan: FilePlan
    seed: int  # orders the epochs of a shuffle without a seed of its own
    whole: bool = False  # not split (DataConfig.datasets_to_split): every rank reads every row


def filesystem_of(path: str) -> tuple[Any, str]:
    """(pyarrow filesystem, path on it) for a local path or a URI (``s3://``, ``gs://``, ...)."""
    import pyarrow.fs as pafs

    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    import os

    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))


def list_files(source: FileSource) -> list[str]:
    """Every file the source names, a directory's files (recursively, sorted, without hidden
    and ``_``-prefixed names such as ``_SUCCESS``) in place of the directory; paths as the
    workers open them (a URI stays a URI)."""
    import pyarrow.fs as pafs

    found: list[str] = []
    for given in source.paths:
        filesystem, path = filesystem_of(given)
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise ConfigError(f"raytf.data.{source.format}_files: {given!r} does not exist")
        if info.type == pafs.FileType.Directory:
            inside = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
            names = sorted(
                i.path
                for i in inside
                if i.type == pafs.FileType.File
                and not any(part.startswith((".", "_")) for part in i.path[len(path) :].split("/"))
            )
            prefix = given.split("://", 1)[0] + "://" if "://" in given else ""
            found.extend(prefix + n if prefix and not n.startswith(prefix) else n for n in names)
        else:
            found.append(given if "://" in given else path)
    if not found:
        raise ConfigError(f"raytf.data.{source.format}_files: no files under {', '.join(source.paths)}")
    return found


def file_stats(files: Sequence[str]) -> list[Optional[tuple[int, int]]]:
    """Each file's (bytes, modification time in ns), None where it is gone: what a plan checks its
    files against at every pass, since a file rewritten with as many rows trains other rows."""
    import pyarrow.fs as pafs

    stats: list[Optional[tuple[int, int]]] = []
    for path in files:
        filesystem, on_fs = filesystem_of(path)
        info = filesystem.get_file_info(on_fs)
        stats.append(None if info.type == pafs.FileType.NotFound else (int(info.size), int(info.mtime_ns or 0)))
    return stats


def changed_files(plan: FilePlan, indices: Sequence[int]) -> list[str]:
    """The files among ``plan.files[indices]`` that are not as the plan counted them, each with
    what changed."""
    if not plan.file_stats:
        return []
    indices = sorted(set(int(i) for i in indices))
    now = file_stats([plan.files[i] for i in indices])
    problems = []
    for i, stat in zip(indices, now):
        was = plan.file_stats[i]
        if stat != was:
            problems.append(
                f"{plan.files[i]} (counted: {was[0]} bytes, modified at {was[1] / 1e9:.3f}; now: "
                + ("gone" if stat is None else f"{stat[0]} bytes, modified at {stat[1] / 1e9:.3f}")
                + ")"
            )
    return problems


@dataclass(frozen=True)
class Piece:
    """What one read takes: these chunks (in order, concatenated) and which of their rows."""

    chunks: np.ndarray
    take: np.ndarray


class Layout:
    """Epoch ``epoch``'s order of a plan's rows: chunks (permuted with ``shuffle``) in windows,
    each window's rows permuted with ``shuffle``."""

    def __init__(self, plan: FilePlan, shuffle: bool, seed: int, epoch: int):
        self.plan, self.shuffle, self.seed, self.epoch = plan, shuffle, seed, epoch
        count = len(plan.chunk_rows)
        self.order = np.random.default_rng((seed, epoch)).permutation(count) if shuffle else np.arange(count)
        rows, size = plan.chunk_rows[self.order], plan.chunk_bytes[self.order]
        per_window = plan.chunk_is_window
        bounds, taken, held = [0], 0, 0
        for i in range(count):
            taken, held = taken + int(rows[i]), held + int(size[i])
            if per_window or taken >= plan.source.shuffle_rows or held >= _WINDOW_BYTES or i == count - 1:
                bounds.append(i + 1)
                taken = held = 0
        self.window_chunks = np.array(bounds, dtype=np.int64)  # window w: order[window_chunks[w]:window_chunks[w+1]]
        starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.chunk_start = starts  # position of each chunk (in order) in the epoch
        self.window_start = starts[self.window_chunks]

    def _window_order(self, window: int) -> Optional[np.ndarray]:
        if not self.shuffle:
            return None
        length = int(self.window_start[window + 1] - self.window_start[window])
        return np.random.default_rng((self.seed, self.epoch, window)).permutation(length)

    def pieces(self, run: Ranges) -> list[Piece]:
        """The reads that yield the positions of ``run`` in order: one per window a range meets."""
        out = []
        for start, end in run:
            window = int(np.searchsorted(self.window_start, start, side="right")) - 1
            while start < end:
                w_start, w_end = int(self.window_start[window]), int(self.window_start[window + 1])
                stop = min(end, w_end)
                local = np.arange(start - w_start, stop - w_start, dtype=np.int64)
                permuted = self._window_order(window)
                if permuted is not None:
                    local = permuted[local]
                first, last = self.window_chunks[window], self.window_chunks[window + 1]
                chunk_starts = self.chunk_start[first : last + 1] - w_start
                which = np.searchsorted(chunk_starts, local, side="right") - 1
                needed = np.unique(which)
                lengths = np.diff(chunk_starts)[needed]
                new_start = np.zeros(len(chunk_starts) - 1, dtype=np.int64)
                new_start[needed] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
                take = new_start[which] + (local - chunk_starts[which])
                out.append(Piece(self.order[first + needed], take))
                start, window = stop, window + 1
        return out


def run_slice(run: Ranges, begin: int, end: int) -> Ranges:
    """The part of ``run`` from its ``begin``-th position to its ``end``-th."""
    out, seen = [], 0
    for start, stop in run:
        lo, hi = max(start, start + begin - seen), min(stop, start + end - seen)
        if lo < hi:
            out.append((lo, hi))
        seen += stop - start
    return tuple(out)

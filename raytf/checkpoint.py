"""Checkpoints: directories committed to the run's storage so that none is ever lost.

Layout under ``<storage_path>/<run name>/checkpoints/``::

    index.json                 the commit record: which checkpoints exist, newest last
    checkpoint_000003/         one committed checkpoint (the user's files)
        .raytf_manifest.json   every file's size and CRC32, written last into the staging copy
    .staging-<uuid>/           a checkpoint being uploaded; never listed in the index

The commit protocol: the chief uploads into a staging directory, writes the
manifest, moves the directory to its final name, and tells the driver; the
driver records it in ``index.json`` (written whole: a rename on a local disk,
one object PUT on S3), and only then does ``raytf.report`` return. So the
index never names a missing or partial checkpoint, a checkpoint whose report
returned survives the reporting worker dying the instant after, and anything
not in the index is debris to clean up. No pickle anywhere: files, and JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
import posixpath
import re
import shutil
import tempfile
import time
import uuid
import zlib
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Optional

import pyarrow.fs as pafs

from raytf._internal import storage as _storage
from raytf.errors import RaytfError

logger = logging.getLogger(__name__)

INDEX = "index.json"
MANIFEST = ".raytf_manifest.json"
STATE_PREFIX = "state"  # the tf.train.Checkpoint files of Checkpoint.from_state: state.index, state.data-*
STAGING_PREFIX = ".staging-"
_CHUNK = 1 << 20


class CheckpointError(RaytfError):
    """No usable checkpoint where one was expected (every committed one is corrupt)."""


def _crc32(stream: Any) -> tuple[int, int]:
    crc, size = 0, 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return crc, size
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)


_join = _storage.join
_NAME = re.compile(r"checkpoint_(\d{6,})")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_links(root: str) -> None:
    """Refuse symbolic links in a checkpoint directory that leave it, dangle or loop.

    Links that stay inside the directory are followed (their targets' bytes
    are stored). One that leaves it would copy files the user never meant to
    store (``/etc/passwd``), and a loop would be copied level after level.
    """
    real_root = os.path.realpath(root)

    def walk(path: str, ancestors: frozenset[str]) -> None:
        for entry in os.scandir(path):
            relative = os.path.relpath(entry.path, root)
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _within(target, real_root):
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} is a symbolic link to {target!r}, "
                        "outside the checkpoint; copy the file in, or point the link inside the directory"
                    )
                if not os.path.exists(entry.path):
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} is a symbolic link that dangles or "
                        "loops; remove it"
                    )
            if entry.is_dir():  # follows links to directories
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} links back to a directory that "
                        "contains it (a loop); remove the link"
                    )
                walk(entry.path, ancestors | {real})

    walk(root, frozenset({real_root}))


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
            raise ValueError(f"Checkpoint.from_directory: {local!r} is not a directory")
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
            raise ValueError("Checkpoint.from_state needs the objects to save, e.g. model=model, optimizer=optimizer")
        return StateCheckpoint(trackables)

    def restore_state(self, **trackables: Any) -> None:
        """Load a checkpoint made by :meth:`from_state` into the same objects, by the same names.

        Every object passed must be found in the checkpoint. Variables that do
        not exist yet (an optimizer's slots before its first step) are
        restored when they are created, so the files are kept until then.
        """
        import tensorflow as tf

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

    def to_directory(self, path: str | os.PathLike) -> str:
        """Copy the checkpoint's files into a local directory and return its path."""
        local = os.fspath(path)
        os.makedirs(local, exist_ok=True)
        pafs.copy_files(self.path, local, source_filesystem=self.filesystem,
                        destination_filesystem=pafs.LocalFileSystem())
        return local

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.path!r}, epoch={self.epoch}, step={self.step})"


def _kept_copy(checkpoint: Checkpoint) -> str:
    """A local copy of a remote checkpoint that lives as long as the process (for deferred restores)."""
    import atexit

    scratch = tempfile.mkdtemp(prefix="raytf-restore-")
    atexit.register(shutil.rmtree, scratch, True)
    return checkpoint.to_directory(scratch)


class StateCheckpoint:
    """TensorFlow objects to save as a ``tf.train.Checkpoint`` at ``raytf.report`` time."""

    def __init__(self, trackables: dict[str, Any]):
        self.trackables = dict(trackables)

    def write(self, directory: str) -> None:
        import tensorflow as tf

        tf.train.Checkpoint(**self.trackables).write(os.path.join(directory, STATE_PREFIX))

    def __repr__(self) -> str:
        return f"Checkpoint.from_state({', '.join(self.trackables)})"


@dataclass(frozen=True)
class CheckpointEntry:
    """One committed checkpoint as the index records it."""

    name: str
    seq: int
    attempt: int
    time: float
    epoch: Optional[int] = None
    step: Optional[int] = None
    metrics: dict[str, Any] = field(default_factory=dict)
    driver_start: int = 0  # which start of a driver for this run committed it (0: the first)


def _manifest(fs: pafs.FileSystem, root: str, *, checksums: bool = True) -> dict[str, dict[str, int]]:
    """Every file under ``root``: its size, and with ``checksums`` its CRC32 (which reads it)."""
    files = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root):].lstrip("/").lstrip(os.sep)
        if relative == MANIFEST:
            continue
        entry = {"size": info.size}
        if checksums:
            with fs.open_input_stream(info.path) as stream:
                entry["crc32"], entry["size"] = _crc32(stream)
        files[relative.replace(os.sep, "/")] = entry
    return files


def upload(checkpoint: Checkpoint, fs: pafs.FileSystem, checkpoints_dir: str, name: str) -> str:
    """Copy a local checkpoint into storage under ``name``, by way of a staging directory.

    Returns the final path. The manifest is computed from the source files
    (so nothing is read back from storage) and written last, so a torn upload
    can never look complete.
    """
    final = _join(fs, checkpoints_dir, name)
    # A local disk renames directories atomically; object stores cannot, so
    # there the upload goes straight to its final name, and the index write
    # (done by the driver afterwards) is the only commit point.
    local = isinstance(fs, pafs.LocalFileSystem)
    target = _join(fs, checkpoints_dir, f"{STAGING_PREFIX}{uuid.uuid4().hex}") if local else final
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        fs.delete_dir(final)  # debris of an upload whose commit never happened
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        check_links(checkpoint.path)  # again: the directory may have changed since from_directory
    manifest = {"files": _manifest(checkpoint.filesystem, checkpoint.path)}
    fs.create_dir(target, recursive=True)
    pafs.copy_files(checkpoint.path, target, source_filesystem=checkpoint.filesystem, destination_filesystem=fs)
    with fs.open_output_stream(_join(fs, target, MANIFEST)) as out:
        out.write(json.dumps(manifest, sort_keys=True).encode())
    if local:
        fs.move(target, final)
    return final


def verify(fs: pafs.FileSystem, path: str, *, checksums: bool = True) -> Optional[str]:
    """Why the checkpoint at ``path`` is unusable, or None if every file matches its manifest.

    ``checksums=False`` compares sizes from one listing (missing or truncated
    files) without reading the data: enough to commit a fresh upload. Resuming
    reads everything and checks the CRC32s too.
    """
    try:
        with fs.open_input_stream(_join(fs, path, MANIFEST)) as stream:
            expected = json.loads(stream.read())["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its manifest is missing or unreadable ({error})"
    found = _manifest(fs, path, checksums=checksums)
    for relative, want in expected.items():
        got = found.get(relative)
        if got is None:
            return f"file {relative!r} is missing"
        if got["size"] != want["size"]:
            return f"file {relative!r} has {got['size']} bytes, {want['size']} were written"
        if checksums and got["crc32"] != want["crc32"]:
            return f"file {relative!r} does not match its checksum"
    return None


def checkpoints_dir(fs: pafs.FileSystem, run_root: str) -> str:
    return _join(fs, run_root, "checkpoints")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_entry(raw: Any) -> CheckpointEntry:
    """One index entry, with every field's type checked; ValueError says what is wrong.

    Fields this version does not know (written by a newer raytf) are ignored.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"it is a {type(raw).__name__}, not an object")
    for key, check, what in (
        ("name", lambda v: isinstance(v, str), "a str"),
        ("seq", _is_int, "an int"),
        ("attempt", _is_int, "an int"),
        ("time", _is_number, "a number"),
    ):
        if not check(raw.get(key)):
            raise ValueError(f"its {key!r} is {raw.get(key)!r}, not {what}")
    for key in ("epoch", "step", "driver_start"):
        if raw.get(key) is not None and not _is_int(raw[key]):
            raise ValueError(f"its {key!r} is {raw[key]!r}, not an int")
    if not isinstance(raw.get("metrics", {}), dict):
        raise ValueError(f"its 'metrics' is {raw['metrics']!r}, not an object")
    fields = {k: v for k, v in raw.items() if k in CheckpointEntry.__dataclass_fields__}
    fields["driver_start"] = fields.get("driver_start") or 0
    return CheckpointEntry(**fields)


class CheckpointManager:
    """The driver's record of a run's checkpoints: commit, retention, what to resume from.

    An index entry whose fields are damaged (a hand edit, a buggy writer) is
    skipped with a warning that names the checkpoint used instead; it stays
    in the index under ``"damaged"`` and its directory is never deleted, so
    nothing is lost while a person looks at it.
    """

    def __init__(self, fs: pafs.FileSystem, run_root: str, *, num_to_keep: Optional[int] = None,
                 score_attribute: Optional[str] = None, mode: str = "max"):
        self.fs = fs
        self.dir = checkpoints_dir(fs, run_root)
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.mode = mode
        fs.create_dir(self.dir, recursive=True)
        self.damaged: list[Any] = []  # raw index entries that did not parse, kept as they were
        self.entries: list[CheckpointEntry] = self._read_index()

    @property
    def next_seq(self) -> int:
        """One past every checkpoint number in use, damaged entries' included: never reuse a name."""
        used = [e.seq for e in self.entries] + [
            s for s in (_seq_of_name(d.get("name")) for d in self.damaged if isinstance(d, dict)) if s is not None
        ]
        return max(used) + 1 if used else 0

    def path_of(self, entry: CheckpointEntry) -> str:
        return _join(self.fs, self.dir, entry.name)

    def _read_index(self) -> list[CheckpointEntry]:
        path = _join(self.fs, self.dir, INDEX)
        if not _storage.exists(self.fs, path):
            return []
        try:
            raw = _storage.read_json(self.fs, path)
            listed = list(raw["checkpoints"]) + list(raw.get("damaged", []))
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise CheckpointError(
                f"the checkpoint index {path} is unreadable ({error}); move it aside to start over, "
                "or restore it from a backup"
            ) from None
        entries, problems = [], []
        for position, item in enumerate(listed):
            try:
                entry = parse_entry(item)
            except ValueError as why:
                self.damaged.append(item)
                problems.append(f"entry {position} ({json.dumps(_storage.plain_json(item))[:200]}): {why}")
                continue
            # Names are raytf's own; one that is not (say "../../other-run") would make
            # restore and retention read or delete outside this run's directory.
            if entry.name != checkpoint_name(entry.seq):
                raise CheckpointError(
                    f"the checkpoint index {path} names {entry.name!r}, which is not a checkpoint of "
                    f"this run (expected {checkpoint_name(entry.seq)!r}); the index was edited or "
                    "corrupted: restore it from a backup or move it aside to start over"
                )
            entries.append(entry)
        entries.sort(key=lambda e: e.seq)
        if problems:
            instead = f"{entries[-1].name} (epoch={entries[-1].epoch}, step={entries[-1].step})" if entries else "none"
            logger.warning(
                "the checkpoint index %s is damaged; skipping %s. Newest intact checkpoint, used "
                "instead: %s. The damaged entries stay in the index under \"damaged\" and their "
                "directories are kept.", path, "; ".join(problems), instead,
            )
        return entries

    def _write_index(self) -> None:
        # One whole-file write: a rename on local disk, one PUT on an object store.
        value = {"version": 1, "checkpoints": [asdict(e) for e in self.entries]}
        if self.damaged:
            value["damaged"] = self.damaged
        _storage.write_json(self.fs, _join(self.fs, self.dir, INDEX), value)

    def commit(self, entry: CheckpointEntry) -> None:
        """Record an uploaded checkpoint; from here on it is the one to resume from."""
        if verify(self.fs, self.path_of(entry), checksums=False) is not None:
            raise CheckpointError(f"checkpoint {entry.name} did not arrive whole; not committing it")
        self.entries.append(entry)
        self._write_index()
        self._apply_retention()

    def score(self, entry: CheckpointEntry) -> Optional[float]:
        """The entry's ``score_attribute`` as a number, or None when it is missing, NaN or not a number."""
        value = entry.metrics.get(self.score_attribute) if self.score_attribute else None
        if not _is_number(value) or math.isnan(value):
            return None
        return float(value)

    def _ranked(self, entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
        """Best first by score; entries without a usable score rank last, always; ties keep the newer."""
        sign = 1.0 if self.mode == "max" else -1.0

        def key(entry: CheckpointEntry) -> tuple[bool, float, int]:
            score = self.score(entry)
            return (score is not None, sign * score if score is not None else 0.0, entry.seq)

        return sorted(entries, key=key, reverse=True)

    def _apply_retention(self) -> None:
        if self.num_to_keep is None or len(self.entries) <= self.num_to_keep:
            return
        latest = self.entries[-1]
        if self.score_attribute is None:
            keep = self.entries[-self.num_to_keep:]
        else:
            best = self._ranked(self.entries[:-1])[: self.num_to_keep - 1]
            keep = [e for e in self.entries if e in best or e is latest]
        dropped = [e for e in self.entries if e not in keep]
        self.entries = [e for e in self.entries if e in keep]
        self._write_index()  # forget first, then delete: the index never names a deleted directory
        for entry in dropped:
            self.fs.delete_dir(self.path_of(entry))

    def clean_debris(self) -> None:
        """Delete staging directories and checkpoint directories the index does not name.

        Directories named by damaged index entries are kept.
        """
        named = {e.name for e in self.entries} | {
            d.get("name") for d in self.damaged if isinstance(d, dict) and isinstance(d.get("name"), str)
        }
        for info in self.fs.get_file_info(pafs.FileSelector(self.dir)):
            base = posixpath.basename(info.path.rstrip("/"))
            if info.type == pafs.FileType.Directory and base not in named and (
                base.startswith(STAGING_PREFIX) or base.startswith("checkpoint_")
            ):
                logger.info("removing uncommitted checkpoint directory %s", info.path)
                self.fs.delete_dir(info.path)

    def newest(self) -> Optional[Checkpoint]:
        """The last committed checkpoint, as recorded (not re-read)."""
        if not self.entries:
            return None
        return Checkpoint(self.path_of(self.entries[-1]), self.fs, asdict(self.entries[-1]))

    def latest(self) -> Optional[tuple[CheckpointEntry, Checkpoint]]:
        """The newest committed checkpoint that verifies, falling back past corrupt ones.

        None if nothing was ever committed. If checkpoints were committed but
        none verifies, that is an error, never a silent restart from scratch.
        """
        problems = []
        for entry in reversed(self.entries):
            path = self.path_of(entry)
            problem = verify(self.fs, path)
            if problem is None:
                if problems:
                    logger.warning("resuming from %s; newer checkpoints are unusable: %s",
                                   entry.name, "; ".join(problems))
                return entry, Checkpoint(path, self.fs, asdict(entry))
            problems.append(f"{entry.name}: {problem}")
        if problems:
            raise CheckpointError(
                "every committed checkpoint is unusable, so the run cannot resume: "
                + "; ".join(problems)
                + ". Delete the run's checkpoints directory to start over."
            )
        return None


def checkpoint_name(seq: int) -> str:
    return f"checkpoint_{seq:06d}"


def _seq_of_name(name: Any) -> Optional[int]:
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    return int(match.group(1)) if match else None


def new_entry(seq: int, attempt: int, metrics: dict[str, Any], driver_start: int = 0) -> CheckpointEntry:
    epoch, step = metrics.get("epoch"), metrics.get("step")
    return CheckpointEntry(
        name=checkpoint_name(seq),
        seq=seq,
        attempt=attempt,
        time=time.time(),
        epoch=int(epoch) if _is_number(epoch) and math.isfinite(epoch) else None,
        step=int(step) if _is_number(step) and math.isfinite(step) else None,
        metrics=dict(metrics),
        driver_start=driver_start,
    )

"""The driver's record of a run's checkpoints: the index, commits, retention, and where a
restart resumes from.

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
import posixpath
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional, TypeGuard

import pyarrow.fs as pafs

from raytf._internal import storage as _storage
from raytf._internal.checkpoint.files import (
    STAGING_PREFIX,
    checkpoint_name,
    checkpoints_dir,
    merge_parts,
    parts_name,
    seq_of_name,
    verify,
)
from raytf._internal.protocol import Report, ResumePoint
from raytf.checkpoint import Checkpoint
from raytf.errors import CheckpointError

logger = logging.getLogger(__name__)

INDEX = "index.json"
_join = _storage.join


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
    data: dict[str, Any] = field(default_factory=dict)  # split datasets' positions (data/planned.py)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
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
    for key in ("metrics", "data"):
        if not isinstance(raw.get(key, {}), dict):
            raise ValueError(f"its {key!r} is {raw[key]!r}, not an object")
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

    def __init__(
        self,
        fs: pafs.FileSystem,
        run_root: str,
        *,
        num_to_keep: Optional[int] = None,
        score_attribute: Optional[str] = None,
        mode: str = "max",
        evaluator: bool = False,
    ):
        self.fs = fs
        self.dir = checkpoints_dir(fs, run_root)
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.mode = mode
        fs.create_dir(self.dir, recursive=True)
        self.damaged: list[Any] = []  # raw index entries that did not parse, kept as they were
        self.entries: list[CheckpointEntry] = self._read_index()
        # Checkpoints this driver committed (their files listed whole at the commit): a restart
        # lists them again rather than reading every byte back from storage (see latest()).
        self._committed_here: set[str] = set()
        # With an evaluator, which reads the newest checkpoint it has not evaluated while training goes
        # on: retention drops such a checkpoint from the index at once, but deletes its directory only
        # once the evaluator has reported a checkpoint at least as new (see note_evaluated).
        self._evaluated_seq: Optional[int] = -1 if evaluator else None
        self._deferred: list[CheckpointEntry] = []

    @property
    def next_seq(self) -> int:
        """One past every checkpoint number in use, damaged entries' included: never reuse a name."""
        used = [e.seq for e in self.entries] + [
            s for s in (seq_of_name(d.get("name")) for d in self.damaged if isinstance(d, dict)) if s is not None
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
                'instead: %s. The damaged entries stay in the index under "damaged" and their '
                "directories are kept.",
                path,
                "; ".join(problems),
                instead,
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
        problem = verify(self.fs, self.path_of(entry), checksums=False)
        if problem is not None:
            raise CheckpointError(f"checkpoint {entry.name} did not arrive whole ({problem}); not committing it")
        self.entries.append(entry)
        self._write_index()
        self._committed_here.add(entry.name)
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
            keep = self.entries[-self.num_to_keep :]
        else:
            best = self._ranked(self.entries[:-1])[: self.num_to_keep - 1]
            keep = [e for e in self.entries if e in best or e is latest]
        dropped = [e for e in self.entries if e not in keep]
        self.entries = [e for e in self.entries if e in keep]
        self._write_index()  # forget first, then delete: the index never names a deleted directory
        self._deferred.extend(dropped)
        self._delete_deferred()

    def note_evaluated(self, name: str) -> None:
        """The evaluator reported its metrics of checkpoint ``name``: it no longer reads it, nor
        anything older, so what retention dropped up to there may go."""
        seq = seq_of_name(name)
        if self._evaluated_seq is not None and seq is not None:
            self._evaluated_seq = max(self._evaluated_seq, seq)
        self._delete_deferred()

    def _delete_deferred(self, everything: bool = False) -> None:
        kept = []
        for entry in self._deferred:
            if not everything and self._evaluated_seq is not None and entry.seq > self._evaluated_seq:
                kept.append(entry)  # the evaluator may be reading it
                continue
            self.fs.delete_dir(self.path_of(entry))
        self._deferred = kept

    def finish(self) -> None:
        """The run's actors are gone (the evaluator with them): delete what retention held back."""
        self._delete_deferred(everything=True)

    def clean_debris(self) -> None:
        """Delete staging directories and checkpoint directories the index does not name.

        Directories named by damaged index entries are kept.
        """
        named = {e.name for e in self.entries} | {
            d.get("name") for d in self.damaged if isinstance(d, dict) and isinstance(d.get("name"), str)
        }
        for info in self.fs.get_file_info(pafs.FileSelector(self.dir)):
            base = posixpath.basename(info.path.rstrip("/"))
            if (
                info.type == pafs.FileType.Directory
                and base not in named
                and (base.startswith(STAGING_PREFIX) or base.startswith("checkpoint_"))
            ):
                logger.info("removing uncommitted checkpoint directory %s", info.path)
                self.fs.delete_dir(info.path)

    def resume_point(self) -> ResumePoint:
        """Before each attempt: clear uncommitted debris; where the attempt starts."""
        self.clean_debris()
        latest = self.latest()
        if latest is None:
            return ResumePoint(next_seq=self.next_seq)
        entry, _ = latest
        return ResumePoint(next_seq=self.next_seq, path=self.path_of(entry), entry=entry)

    def handle_report(
        self, report: Report, driver_start: int = 0, guard: Callable[[], None] = lambda: None
    ) -> tuple[Optional[str], Optional[str]]:
        """Commit the checkpoint a report carries: (the committed name, or None; why it failed, or None).

        ``guard`` runs first and may raise (this driver lost the run's lease).
        Any other failure is returned, not raised: the worker's ``report``
        raises it, and the run goes on recording.
        """
        if report.checkpoint is None:
            return None, None
        entry = new_entry(report.checkpoint.seq, report.attempt, report.metrics, driver_start, report.data)
        return self._commit_reported(entry, guard)

    def _commit_reported(
        self, entry: CheckpointEntry, guard: Callable[[], None], assemble: Callable[[], Any] = lambda: None
    ) -> tuple[Optional[str], Optional[str]]:
        """``guard()`` (which may raise), then ``assemble()`` and commit ``entry``: (its name, None), or
        (None, why not) for the reporting workers' ``report`` to raise while the run goes on."""
        guard()
        try:
            assemble()
            self.commit(entry)
        except Exception as failure:  # noqa: BLE001 - reported to the workers whose report it was
            error = f"{type(failure).__name__}: {failure}"
            logger.error("checkpoint %s was not committed: %s", entry.name, error)
            return None, error
        return entry.name, None

    def handle_parts(
        self, reports: list[Report], driver_start: int = 0, guard: Callable[[], None] = lambda: None
    ) -> tuple[Optional[str], Optional[str]]:
        """Merge and commit the checkpoint of one collective report (every rank's share of it in
        ``reports``): (the committed name, or None when no rank passed files; why it failed, or None).
        The ranks' uploads are assembled into one directory, then committed as any checkpoint is."""
        reports = sorted(reports, key=lambda r: r.rank)
        # A rank that passed files uploaded them to its staging directory (both None where it passed none).
        parts = [
            (r.rank, r.share.staging, r.share.files)
            for r in reports
            if r.share.files is not None and r.share.staging is not None
        ]
        first = reports[0]
        staging = _join(self.fs, self.dir, parts_name(first.attempt, first.share.round))
        if not parts:
            return None, None
        entry = new_entry(first.share.seq, first.attempt, first.metrics, driver_start, first.data)
        try:
            return self._commit_reported(entry, guard, lambda: merge_parts(self.fs, self.dir, entry.name, parts))
        finally:
            if _storage.exists(self.fs, staging):
                self.fs.delete_dir(staging)  # what was not moved: files several ranks sent alike

    def newest(self) -> Optional[Checkpoint]:
        """The last committed checkpoint, as recorded (not re-read)."""
        if not self.entries:
            return None
        return Checkpoint(self.path_of(self.entries[-1]), self.fs, asdict(self.entries[-1]))

    def latest(self) -> Optional[tuple[CheckpointEntry, Checkpoint]]:
        """The newest committed checkpoint that verifies, falling back past corrupt ones.

        None if nothing was ever committed. If checkpoints were committed but
        none verifies, that is an error, never a silent restart from scratch.
        Checkpoints of an earlier driver are read whole (every file's CRC32);
        those this driver committed are listed (every file there, at its size):
        reading a model of many GiB back from an object store before every
        restart would cost more than the restart, and their bytes are checked
        where they are read (a copy in memory against the manifest's CRC32s,
        ``Checkpoint.from_state`` files by TensorFlow's own per-tensor checksums).
        """
        problems: list[str] = []
        for entry in reversed(self.entries):
            path = self.path_of(entry)
            problem = verify(self.fs, path, checksums=entry.name not in self._committed_here)
            if problem is None:
                if problems:
                    logger.warning(
                        "resuming from %s; newer checkpoints are unusable: %s", entry.name, "; ".join(problems)
                    )
                return entry, Checkpoint(path, self.fs, asdict(entry))
            problems.append(f"{entry.name}: {problem}")
        if problems:
            raise CheckpointError(
                "every committed checkpoint is unusable, so the run cannot resume: "
                + "; ".join(problems)
                + ". Delete the run's checkpoints directory to start over."
            )
        return None


def new_entry(
    seq: int, attempt: int, metrics: dict[str, Any], driver_start: int = 0, data: Optional[dict[str, Any]] = None
) -> CheckpointEntry:
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
        data=dict(data or {}),
    )

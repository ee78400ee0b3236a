"""The run's history: every report of rank 0, over every attempt and driver start.

Kept in ``<run>/history.json`` (appended to what earlier drivers wrote, and
written with every committed checkpoint and every few seconds), shown by the
progress display, and plotted in TensorBoard. ``<run>/run.json`` lists the
driver starts.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from typing import Any, Callable, Optional

from raytf._internal.driver.progress import ProgressDisplay
from raytf._internal.driver.tensorboard import EventWriter
from raytf._internal.protocol import HISTORY_KEYS, Report, ReportStage
from raytf._internal.storage import RunStorage
from raytf.errors import RaytfError

logger = logging.getLogger(__name__)

HISTORY_FILE = "history.json"
RUN_FILE = "run.json"
_WRITE_INTERVAL_S = 10.0


def load_history(storage: RunStorage) -> list[dict[str, Any]]:
    """The run's history so far (earlier attempts and driver starts), or [] for a new run.

    A history.json that cannot be read is moved aside, not overwritten.
    """
    try:
        previous = storage.read_json(HISTORY_FILE, default=[])
        if isinstance(previous, list) and all(isinstance(e, dict) for e in previous):
            return previous
        problem = f"it holds a {type(previous).__name__}, not a list of reports"
    except (OSError, ValueError) as error:
        problem = str(error)
    aside = f"{HISTORY_FILE}.unreadable-{int(time.time())}"
    storage.filesystem.move(storage.path(HISTORY_FILE), storage.path(aside))
    logger.warning(
        "%s of run %s is unreadable (%s); moved it to %s and starting a new history",
        HISTORY_FILE,
        storage.uri,
        problem,
        aside,
    )
    return []


def record_start(storage: RunStorage, name: str) -> int:
    """Append this driver start to run.json; returns its number (0 for the run's first)."""
    from raytf._version import __version__

    problem = None
    try:
        record = storage.read_json(RUN_FILE, default={})
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        problem = f"{type(error).__name__}: {error}"
    else:
        if not isinstance(record, dict) or not isinstance(record.get("starts", []), list):
            problem = "it is not the object with a list of starts that raytf writes"
    if problem is not None:
        raise RaytfError(
            f"{storage.path(RUN_FILE)} is damaged ({problem}). It lists run {name!r}'s driver starts, which "
            "number the history's entries: repair it, or move it aside and raytf starts a new list (the "
            "run's checkpoints and history.json are not affected)"
        )
    starts = list(record.get("starts", []))
    starts.append(
        {
            "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "raytf_version": __version__,
        }
    )
    storage.write_json(RUN_FILE, {"name": name, "starts": starts})
    return len(starts) - 1


class RunHistory:
    """Rank 0's reports over the whole run, as entries with ``attempt``, ``driver_start``,
    ``report_seq`` and, when one was committed, ``checkpoint``."""

    def __init__(
        self,
        storage: RunStorage,
        display: ProgressDisplay,
        driver_start: int,
        previous: list[dict[str, Any]],
        events: Optional[EventWriter] = None,
        guard: Callable[[], None] = lambda: None,
    ):
        self.entries: list[dict[str, Any]] = list(previous)
        self._storage = storage
        self._display = display
        self._driver_start = driver_start
        self._events = events
        self._guard = guard  # before every write: raises once this driver lost the run
        self._last_write = time.monotonic()
        self._dirty = False

    def record(self, report: Report, checkpoint: Optional[str] = None) -> None:
        """Record a report of rank 0 (with the name of the checkpoint committed from it)."""
        logger.debug("report from rank 0, attempt %d: %s", report.attempt, report.metrics)
        self._display.report(report)
        entry = {
            **report.metrics,
            "attempt": report.attempt,
            "driver_start": self._driver_start,
            "report_seq": report.seq,
        }
        if checkpoint is not None:
            entry["checkpoint"], entry["committed_at"] = checkpoint, time.time()
        self.entries.append(entry)
        self._dirty = True
        if self._events is not None:
            step = report.metrics.get("step")
            self._events.add(
                step if isinstance(step, int) and not isinstance(step, bool) else len(self.entries) - 1, report.metrics
            )
        # With every checkpoint, and every few seconds: a driver that dies without a
        # word loses no report whose checkpoint it committed.
        if (
            checkpoint is not None
            or report.checkpoint is not None
            or time.monotonic() - self._last_write >= _WRITE_INTERVAL_S
        ):
            self.flush()

    def attach(self, report: Report, checkpoint: Optional[str]) -> None:
        """An asynchronous report's checkpoint was committed as ``checkpoint`` (None: it was not):
        name it, and when, in the entry recorded when the report was made."""
        if checkpoint is None:
            return
        for entry in reversed(self.entries):
            if (entry.get("report_seq"), entry.get("attempt"), entry.get("driver_start")) == (
                report.seq,
                report.attempt,
                self._driver_start,
            ):
                entry["checkpoint"], entry["committed_at"] = checkpoint, time.time()
                break
        else:  # its entry was never recorded (cannot happen: a rank's reports arrive in order)
            self.record(report, checkpoint)
            return
        self._dirty = True
        self.flush()

    def flush(self) -> None:
        if self._dirty:
            self._guard()
            self._storage.write_json(HISTORY_FILE, self.entries)
            if self._events is not None:
                self._events.flush()
            self._dirty = False
        self._last_write = time.monotonic()

    @property
    def last_metrics(self) -> dict[str, Any]:
        if not self.entries:
            return {}
        # The last training report: an evaluator's entries sit beside them in the history.
        training = [e for e in self.entries if "evaluated_checkpoint" not in e] or self.entries
        return {k: v for k, v in training[-1].items() if k not in HISTORY_KEYS}


def report_handler(
    checkpoints: Any,
    history: RunHistory,
    driver_start: int,
    guard: Callable[[], None] = lambda: None,
    acknowledge: Callable[[int, int, Optional[str]], None] = lambda rank, seq, error: None,
) -> "ReportHandler":
    """What the controller does with each report (see :class:`ReportHandler`)."""
    return ReportHandler(checkpoints, history, driver_start, guard, acknowledge)


class ReportHandler:
    """What the controller does with each report: rank 0's checkpoint committed by the checkpoint
    manager (returns why not, for the worker's ``report`` to raise), then the report recorded; an
    evaluator's metrics (which name the checkpoint they evaluated) recorded as they are.

    A collective report (``ranks="all"``) waits for every rank's share; then the ranks' files are
    merged and committed as one checkpoint, rank 0's report is recorded with it, and every rank is
    acknowledged here (``acknowledge(rank, seq, error)``), which returns its ``report``. Made
    asynchronously, a rank's share with files comes after its metrics (PENDING, recorded at once
    for rank 0) as an UPLOADED report, and its acknowledgement reaches its background upload. A rank
    whose ``train_fn`` returns while the others wait for its share fails the round (``phases``),
    so they raise instead of waiting forever.
    """

    def __init__(
        self,
        checkpoints: Any,
        history: RunHistory,
        driver_start: int,
        guard: Callable[[], None],
        acknowledge: Callable[[int, int, Optional[str]], None],
    ):
        self._checkpoints, self._history, self._driver_start = checkpoints, history, driver_start
        self._guard, self._acknowledge = guard, acknowledge
        self._rounds: dict[tuple[int, int], dict[int, Report]] = {}  # (attempt, round) -> rank -> its share

    def __call__(self, report: Report) -> Optional[str]:
        if "evaluated_checkpoint" in report.metrics:  # a parameter-server group's evaluator
            self._history.record(report)
            self._checkpoints.note_evaluated(report.metrics["evaluated_checkpoint"])
            return None
        if report.part is not None:
            self._on_part(report)
            return None
        if report.rank != 0:
            return None
        if report.stage is ReportStage.PENDING:  # its checkpoint is on its way: the metrics now
            self._history.record(report)
            return None
        committed, error = self._checkpoints.handle_report(report, self._driver_start, guard=self._guard)
        if report.stage is ReportStage.UPLOADED:
            self._history.attach(report, committed)
        else:
            self._history.record(report, committed)
        return error

    def _on_part(self, report: Report) -> None:
        for key in [k for k in self._rounds if k[0] < report.attempt]:
            del self._rounds[key]  # an attempt that ended: its ranks are gone, its uploads are debris
        key = (report.attempt, report.share.round)
        shares = self._rounds.setdefault(key, {})
        shares[report.rank] = report
        if len(shares) < report.share.parties:
            return
        del self._rounds[key]
        committed, error = self._checkpoints.handle_parts(list(shares.values()), self._driver_start, guard=self._guard)
        if 0 in shares and shares[0].stage is ReportStage.UPLOADED:  # recorded when rank 0 made it (PENDING)
            self._history.attach(shares[0], committed)
        elif 0 in shares:
            self._history.record(shares[0], committed)
        for share in shares.values():
            self._acknowledge(share.rank, share.seq, error)

    def phases(self, attempt: int, phases: dict[int, Any]) -> None:
        """The ranks' phases, as the last poll saw them: a rank that is done while a collective
        report waits for its share fails that report on every rank that made it."""
        done = {rank for rank, phase in phases.items() if str(phase) in ("finished", "failed", "preempted")}
        for key, shares in list(self._rounds.items()):
            missing = done - set(shares)
            if key[0] != attempt or not missing:
                continue
            del self._rounds[key]
            error = (
                f"rank {min(missing)} returned from train_fn without making this report: a report with "
                "ranks='all' (and raytf.train.report) is collective, so every rank makes it at the same points"
            )
            for share in shares.values():
                self._acknowledge(share.rank, share.seq, error)

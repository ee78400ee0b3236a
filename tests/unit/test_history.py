"""The run's history across attempts and driver starts, on a temp dir: no Ray."""

import json
import math
import os

import pytest

from raytf._internal.checkpoint.manager import CheckpointManager
from raytf._internal.driver.history import RunHistory, load_history, record_start, report_handler
from raytf._internal.driver.progress import ProgressDisplay
from raytf._internal.lease import RunLease
from raytf._internal.protocol import Report, UploadedCheckpoint
from raytf._internal.storage import RunStorage


class Driver:
    """What one driver start sets up: lease, checkpoints, history so far, its report handler."""

    def __init__(self, tmp_path):
        self.storage = RunStorage(str(tmp_path), "run")
        self.lease = RunLease(self.storage.filesystem, self.storage.root, "run")
        self.lease.acquire()
        checkpoints = CheckpointManager(self.storage.filesystem, self.storage.root)
        start = record_start(self.storage, "run")
        self.history = RunHistory(self.storage, ProgressDisplay("run", 0), start, load_history(self.storage),
                                  guard=self.lease.check)
        self.on_report = report_handler(checkpoints, self.history, start, guard=self.lease.check)
        self.entries = self.history.entries

    def flush(self):
        self.history.flush()


def driver(tmp_path):
    d = Driver(tmp_path)
    return d.storage, d.lease, d


def report(seq, attempt=0, **metrics):
    return Report(rank=0, seq=seq, metrics=metrics, time=float(seq), attempt=attempt)


def test_history_is_appended_across_driver_starts_and_says_where_each_entry_came_from(tmp_path):
    storage, lease, history = driver(tmp_path)
    for epoch in range(3):
        history.on_report(report(epoch, epoch=epoch))
    history.flush()
    lease.release()
    storage, lease, history = driver(tmp_path)  # a new driver resumes the run
    history.on_report(report(0, epoch=3))
    history.on_report(report(1, attempt=1, epoch=4))
    history.flush()
    lease.release()
    written = json.loads((tmp_path / "run" / "history.json").read_text())
    assert [(e["epoch"], e["driver_start"], e["attempt"]) for e in written] == [
        (0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 0), (4, 1, 1)
    ]
    assert written == history.entries
    starts = json.loads((tmp_path / "run" / "run.json").read_text())["starts"]
    assert [s["pid"] for s in starts] == [os.getpid(), os.getpid()]


def test_non_finite_metrics_are_written_as_standard_json_and_read_back(tmp_path):
    storage, lease, history = driver(tmp_path)
    history.on_report(report(0, loss=float("nan"), best=float("inf"), worst=float("-inf")))
    history.flush()
    lease.release()
    text = (tmp_path / "run" / "history.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert '"NaN"' in text and '"Infinity"' in text and '"-Infinity"' in text
    storage, lease, history = driver(tmp_path)
    [entry] = history.entries
    assert math.isnan(entry["loss"]) and entry["best"] == math.inf and entry["worst"] == -math.inf
    lease.release()


def test_a_report_whose_checkpoint_cannot_be_committed_is_still_in_the_history(tmp_path):
    storage, lease, history = driver(tmp_path)
    missing = Report(rank=0, seq=0, metrics={"epoch": 0}, time=0.0,
                     checkpoint=UploadedCheckpoint("checkpoint_000000", 0))  # never uploaded
    error = history.on_report(missing)
    assert "did not arrive whole" in error
    assert history.entries[0]["epoch"] == 0 and "checkpoint" not in history.entries[0]
    lease.release()


def test_an_unreadable_history_is_moved_aside_not_overwritten(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "history.json").write_text("{not json")
    storage, lease, history = driver(tmp_path)
    assert history.entries == []
    [aside] = [p for p in (tmp_path / "run").iterdir() if p.name.startswith("history.json.unreadable-")]
    assert aside.read_text() == "{not json"
    lease.release()

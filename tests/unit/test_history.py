"""The run's history across attempts and driver starts, on a temp dir: no Ray."""

import json
import math
import os

import pytest

from raytf._internal.lease import RunLease
from raytf._internal.driver.progress import ProgressDisplay
from raytf._internal.protocol import Report
from raytf._internal.storage import RunStorage
from raytf.checkpoint import CheckpointManager
from raytf.trainer import _History, _load_history, _record_start


def driver(tmp_path, manager_kwargs=None):
    """What one driver start sets up: lease, history so far, its start number."""
    storage = RunStorage(str(tmp_path), "run")
    lease = RunLease(storage.filesystem, storage.root, "run")
    lease.acquire()
    checkpoints = CheckpointManager(storage.filesystem, storage.root, **(manager_kwargs or {}))
    history = _History(storage, ProgressDisplay("run", 0), checkpoints, lease,
                       _record_start(storage, "run"), _load_history(storage))
    return storage, lease, history


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
                     checkpoint={"name": "checkpoint_000000", "seq": 0})  # never uploaded
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

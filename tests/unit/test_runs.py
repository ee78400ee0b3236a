"""``raytf runs`` reads a storage path alone: runs, attempts, latest checkpoint, last metrics."""

from raytf._internal.checkpoint.files import checkpoint_name, upload
from raytf._internal.checkpoint.manager import CheckpointManager, new_entry
from raytf._internal.runs import describe_runs, print_runs
from raytf._internal.storage import RunStorage
from raytf.checkpoint import Checkpoint


def test_runs_are_described_from_their_files(tmp_path, capsys):
    run = RunStorage(str(tmp_path), "mnist")
    run.write_json("run.json", {"name": "mnist", "starts": [{"pid": 1}, {"pid": 2}]})
    run.write_json("history.json", [
        {"epoch": 0, "loss": 1.0, "attempt": 0, "driver_start": 0, "report_seq": 0},
        {"epoch": 1, "loss": 0.5, "attempt": 1, "driver_start": 0, "report_seq": 0},
        {"epoch": 2, "loss": 0.25, "attempt": 0, "driver_start": 1, "report_seq": 0},
    ])
    manager = CheckpointManager(run.filesystem, run.root)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "w").write_text("weights")
    upload(Checkpoint.from_directory(tmp_path / "files"), run.filesystem, manager.dir, checkpoint_name(0))
    manager.commit(new_entry(0, 0, {"epoch": 2, "step": 30}))
    (tmp_path / "not-a-run").mkdir()
    [row] = describe_runs(str(tmp_path))
    assert row == {"name": "mnist", "driver_starts": 2, "attempts": 3, "reports": 3,
                   "latest_checkpoint": "checkpoint_000000 (epoch 2, step 30)",
                   "last_metrics": {"epoch": 2, "loss": 0.25}, "damaged": []}
    print_runs(str(tmp_path))
    out = capsys.readouterr().out
    assert "mnist: 2 driver start(s), 3 attempt(s) with reports" in out and "loss=0.25" in out


def test_a_run_with_damaged_files_is_listed_and_named_and_the_others_still_are(tmp_path, capsys):
    good = RunStorage(str(tmp_path), "good")
    good.write_json("run.json", {"name": "good", "starts": [{"pid": 1}]})
    good.write_json("history.json", [{"epoch": 0, "loss": 1.5, "attempt": 0, "driver_start": 0, "report_seq": 0}])
    truncated = RunStorage(str(tmp_path), "truncated")
    (tmp_path / "truncated" / "history.json").write_text('[{"epoch": 0, "lo')
    truncated.write_json("run.json", {"name": "truncated", "starts": [{"pid": 1}]})
    RunStorage(str(tmp_path), "wrong-shape")
    (tmp_path / "wrong-shape" / "run.json").write_text("[1, 2]")
    rows = {row["name"]: row for row in describe_runs(str(tmp_path))}
    assert set(rows) == {"good", "truncated", "wrong-shape"}
    assert rows["good"]["damaged"] == [] and rows["good"]["last_metrics"] == {"epoch": 0, "loss": 1.5}
    assert rows["truncated"]["driver_starts"] == 1 and rows["truncated"]["reports"] == 0
    [problem] = rows["truncated"]["damaged"]
    assert str(tmp_path / "truncated" / "history.json") in problem and "JSONDecodeError" in problem
    [problem] = rows["wrong-shape"]["damaged"]
    assert str(tmp_path / "wrong-shape" / "run.json") in problem and "not a JSON object" in problem
    print_runs(str(tmp_path))
    out = capsys.readouterr().out
    assert "good: 1 driver start(s)" in out and f"damaged: {tmp_path / 'truncated' / 'history.json'}" in out


def test_a_driver_start_on_a_damaged_run_json_names_the_file_and_the_fix(tmp_path):
    import pytest

    from raytf._internal.driver.history import record_start
    from raytf.errors import RaytfError

    run = RunStorage(str(tmp_path), "r")
    (tmp_path / "r" / "run.json").write_text('{"name": "r", "sta')
    with pytest.raises(RaytfError) as info:
        record_start(run, "r")
    message = str(info.value)
    assert str(tmp_path / "r" / "run.json") in message and "move it aside" in message
    assert (tmp_path / "r" / "run.json").read_text() == '{"name": "r", "sta'  # nothing overwritten

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
                   "last_metrics": {"epoch": 2, "loss": 0.25}}
    print_runs(str(tmp_path))
    out = capsys.readouterr().out
    assert "mnist: 2 driver start(s), 3 attempt(s) with reports" in out and "loss=0.25" in out

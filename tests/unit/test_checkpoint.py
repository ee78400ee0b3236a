"""The checkpoint commit protocol on a temp dir: no Ray, no TensorFlow."""

import json
import logging
import os

import pyarrow.fs as pafs
import pytest

from raytf import Checkpoint, CheckpointError
from raytf._internal.checkpoint.files import checkpoint_name, upload, verify
from raytf._internal.checkpoint.manager import CheckpointManager, new_entry

FS = pafs.LocalFileSystem()


def user_dir(tmp_path, label, size=100):
    d = tmp_path / f"user-{label}"
    d.mkdir()
    (d / "weights.bin").write_bytes(bytes([label % 256]) * size)
    (d / "sub").mkdir()
    (d / "sub" / "meta.txt").write_text(f"epoch {label}")
    return Checkpoint.from_directory(d)


def save(manager, tmp_path, seq, **metrics):
    upload(user_dir(tmp_path, seq), FS, manager.dir, checkpoint_name(seq))
    manager.commit(new_entry(seq, 0, {"epoch": seq, **metrics}))


def test_commit_then_resume_from_the_latest(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    assert manager.latest() is None
    save(manager, tmp_path, 0)
    save(manager, tmp_path, 1)
    entry, checkpoint = manager.latest()
    assert entry.name == "checkpoint_000001" and checkpoint.epoch == 1
    with checkpoint.as_directory() as d:
        assert open(os.path.join(d, "sub", "meta.txt")).read() == "epoch 1"
    # A new driver reads the same index.
    again = CheckpointManager(FS, str(tmp_path / "run"))
    assert [e.name for e in again.entries] == ["checkpoint_000000", "checkpoint_000001"]
    assert again.next_seq == 2


def test_a_crash_between_upload_and_commit_leaves_debris_that_is_never_chosen(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    # Uploaded but the driver never recorded it (the worker died before its report arrived).
    upload(user_dir(tmp_path, 1), FS, manager.dir, checkpoint_name(1))
    # And a staging directory from an upload cut short.
    os.makedirs(os.path.join(manager.dir, ".staging-deadbeef", "part"))
    assert manager.latest()[0].name == "checkpoint_000000"
    manager.clean_debris()
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000000", "index.json"]


def test_the_index_is_replaced_whole(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    index = json.loads(open(os.path.join(manager.dir, "index.json")).read())
    assert [c["name"] for c in index["checkpoints"]] == ["checkpoint_000000"]
    assert not [f for f in os.listdir(manager.dir) if ".tmp-" in f]


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete", "manifest"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, caplog, damage):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    save(manager, tmp_path, 1)
    newest = os.path.join(manager.path_of(manager.entries[-1]))
    weights = os.path.join(newest, "weights.bin")
    if damage == "truncate":
        open(weights, "r+b").truncate(10)
    elif damage == "garbage":
        open(weights, "wb").write(os.urandom(100))
    elif damage == "delete":
        os.remove(weights)
    else:
        open(os.path.join(newest, ".raytf_manifest.json"), "w").write("{not json")
    assert verify(FS, newest) is not None
    if damage == "garbage":  # the same size: only a driver that did not commit it reads the bytes back
        assert manager.latest()[0].name == "checkpoint_000001"
        manager = CheckpointManager(FS, str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING):
        entry, _ = manager.latest()
    assert entry.name == "checkpoint_000000"
    assert "checkpoint_000001" in caplog.text and "unusable" in caplog.text


def test_when_every_checkpoint_is_corrupt_resuming_is_an_error_not_a_fresh_start(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    open(os.path.join(manager.path_of(manager.entries[0]), "weights.bin"), "wb").write(b"x")
    with pytest.raises(CheckpointError, match="every committed checkpoint is unusable"):
        manager.latest()
    with pytest.raises(CheckpointError, match="every committed checkpoint is unusable"):
        CheckpointManager(FS, str(tmp_path / "run")).latest()


def test_an_unreadable_index_is_an_error(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    open(os.path.join(manager.dir, "index.json"), "w").write("garbage")
    with pytest.raises(CheckpointError, match="index .* is unreadable"):
        CheckpointManager(FS, str(tmp_path / "run"))


def test_an_index_naming_a_path_outside_the_run_is_refused(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    index = os.path.join(manager.dir, "index.json")
    raw = json.loads(open(index).read())
    raw["checkpoints"][0]["name"] = "../../other-run/checkpoints/checkpoint_000000"
    open(index, "w").write(json.dumps(raw))
    with pytest.raises(CheckpointError, match="names '../../other-run.*not a checkpoint of this run"):
        CheckpointManager(FS, str(tmp_path / "run"))


def test_a_checkpoint_that_did_not_arrive_whole_is_not_committed(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    upload(user_dir(tmp_path, 0), FS, manager.dir, checkpoint_name(0))
    os.remove(os.path.join(manager.dir, "checkpoint_000000", "sub", "meta.txt"))
    with pytest.raises(CheckpointError, match="did not arrive whole"):
        manager.commit(new_entry(0, 0, {}))
    assert manager.entries == []


def test_keep_the_newest_n(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=2)
    for seq in range(4):
        save(manager, tmp_path, seq)
    assert [e.name for e in manager.entries] == ["checkpoint_000002", "checkpoint_000003"]
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000002", "checkpoint_000003", "index.json"]


@pytest.mark.parametrize("mode, kept", [("max", {"checkpoint_000001", "checkpoint_000003"}),
                                        ("min", {"checkpoint_000002", "checkpoint_000003"})])
def test_keep_the_best_by_score_and_always_the_latest(tmp_path, mode, kept):
    manager = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=2, score_attribute="acc", mode=mode)
    for seq, acc in enumerate([0.5, 0.9, 0.1, 0.2]):  # the latest scores badly but is kept
        save(manager, tmp_path, seq, acc=acc)
    assert {e.name for e in manager.entries} == kept
    assert manager.latest()[0].name == "checkpoint_000003"


@pytest.mark.parametrize("scores, kept", [
    ([float("nan"), 0.9, 0.5, 0.1], {1, 3}),  # NaN is not the best: 0.9 stays
    ([0.9, None, 0.5, 0.4], {0, 3}),          # None does not crash retention
    ([0.9, "high", 0.5, 0.4], {0, 3}),        # nor does a string
    ([0.2, float("inf"), 0.5, 0.1], {1, 3}),  # inf is a number: the best in max mode
])
def test_scores_that_are_nan_missing_or_not_numbers_rank_worst(tmp_path, scores, kept):
    manager = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=2, score_attribute="acc")
    for seq, acc in enumerate(scores):
        save(manager, tmp_path, seq, acc=acc)
    assert {e.seq for e in manager.entries} == kept
    # The index is standard JSON (NaN and inf become strings) and a new driver reads it back.
    text = open(os.path.join(manager.dir, "index.json")).read()
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text.replace('"Infinity"', "")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    again = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=2, score_attribute="acc")
    assert [e.seq for e in again.entries] == sorted(kept)


def test_an_index_written_with_bad_scores_by_an_older_version_still_loads_and_commits(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    for seq, acc in enumerate([0.9, None]):
        save(manager, tmp_path, seq, acc=acc)
    index = os.path.join(manager.dir, "index.json")
    # What raytf 0.1 wrote for a NaN score: a bare NaN token.
    text = open(index).read()
    assert '"acc": null' in text
    open(index, "w").write(text.replace('"acc": null', '"acc": NaN'))
    again = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=2, score_attribute="acc")
    save(again, tmp_path, 2, acc=0.5)
    save(again, tmp_path, 3, acc=0.4)
    assert [e.seq for e in again.entries] == [0, 3]


def test_a_damaged_index_entry_is_skipped_named_and_kept(tmp_path, caplog):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    for seq in range(3):
        save(manager, tmp_path, seq)
    index = os.path.join(manager.dir, "index.json")
    raw = json.loads(open(index).read())
    raw["checkpoints"][2]["seq"] = "2"  # hand-edited
    open(index, "w").write(json.dumps(raw))
    with caplog.at_level(logging.WARNING):
        again = CheckpointManager(FS, str(tmp_path / "run"))
    assert "damaged" in caplog.text and "'seq' is '2', not an int" in caplog.text
    assert "used instead: checkpoint_000001" in caplog.text
    assert again.latest()[0].name == "checkpoint_000001"
    assert again.next_seq == 3  # its name is never reused
    again.clean_debris()
    assert os.path.isdir(os.path.join(manager.dir, "checkpoint_000002"))  # kept for a person to look at
    save(again, tmp_path, 3)
    reread = json.loads(open(index).read())
    assert [c["name"] for c in reread["checkpoints"]] == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000003"]
    assert reread["damaged"][0]["seq"] == "2"


def test_an_index_with_no_intact_entry_has_nothing_to_resume(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    save(manager, tmp_path, 0)
    index = os.path.join(manager.dir, "index.json")
    raw = json.loads(open(index).read())
    raw["checkpoints"][0]["attempt"] = None
    open(index, "w").write(json.dumps(raw))
    again = CheckpointManager(FS, str(tmp_path / "run"))
    assert again.entries == [] and again.next_seq == 1


def test_links_leaving_the_checkpoint_or_looping_are_refused(tmp_path):
    outside = tmp_path / "secret"
    outside.write_text("password")
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "weights").write_text("w")
    (d / "alias").symlink_to(d / "weights")  # inside: fine, its bytes are stored
    Checkpoint.from_directory(d)
    (d / "leak").symlink_to(outside)
    with pytest.raises(CheckpointError, match="'leak' is a symbolic link to .*secret.*outside the checkpoint"):
        Checkpoint.from_directory(d)
    os.remove(d / "leak")
    (d / "sub").mkdir()
    (d / "sub" / "loop").symlink_to(d)
    with pytest.raises(CheckpointError, match="links back to a directory that contains it"):
        Checkpoint.from_directory(d)
    os.remove(d / "sub" / "loop")
    (d / "self").symlink_to(d / "self")
    with pytest.raises(CheckpointError, match="dangles or loops"):
        Checkpoint.from_directory(d)


def test_upload_checks_links_again(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"))
    checkpoint = user_dir(tmp_path, 0)
    os.symlink("/etc/passwd", os.path.join(checkpoint.path, "passwd"))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        upload(checkpoint, FS, manager.dir, checkpoint_name(0))
    assert not [n for n in os.listdir(manager.dir) if n.startswith("checkpoint_")]


def test_with_an_evaluator_retention_keeps_what_it_may_be_reading_until_it_reports_past_it(tmp_path):
    from raytf._internal.driver.history import RunHistory, report_handler
    from raytf._internal.driver.progress import ProgressDisplay
    from raytf._internal.protocol import Report
    from raytf._internal.storage import RunStorage

    storage = RunStorage(str(tmp_path), "run")
    manager = CheckpointManager(FS, storage.root, num_to_keep=1, evaluator=True)
    on_report = report_handler(manager, RunHistory(storage, ProgressDisplay("run", 0), 0, []), 0)
    save(manager, tmp_path, 0)
    reading = CheckpointManager(FS, storage.root).latest()[1]  # the evaluator picks the newest: 0
    save(manager, tmp_path, 1)
    save(manager, tmp_path, 2)
    assert [e.name for e in manager.entries] == ["checkpoint_000002"]  # the index forgot 0 and 1 at once
    with reading.as_directory() as d:  # ... while the evaluator still reads 0
        assert open(os.path.join(d, "sub", "meta.txt")).read() == "epoch 0"
    on_report(Report(rank=-1, seq=0, metrics={"evaluated_checkpoint": "checkpoint_000000", "acc": 1.0}, time=0.0))
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000001", "checkpoint_000002", "index.json"]
    on_report(Report(rank=-1, seq=1, metrics={"evaluated_checkpoint": "checkpoint_000002", "acc": 1.0}, time=0.0))
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000002", "index.json"]
    save(manager, tmp_path, 3)  # the evaluator has not looked at 3 yet; 2 it evaluated: gone at once
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000003", "index.json"]
    save(manager, tmp_path, 4)
    manager.finish()  # the run ended: nothing reads 3 any more
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000004", "index.json"]


def test_restoring_a_checkpoint_deleted_meanwhile_says_so(tmp_path):
    manager = CheckpointManager(FS, str(tmp_path / "run"), num_to_keep=1)
    save(manager, tmp_path, 0)
    handed_out = manager.latest()[1]
    save(manager, tmp_path, 1)  # no evaluator: retention deletes 0
    with pytest.raises(CheckpointError) as info:
        handed_out.restore_state(model=object())
    assert "no longer exists" in str(info.value) and "num_to_keep" in str(info.value)
    assert "from_directory" not in str(info.value)


def _share(fs, manager, tmp_path, rank, files, round_=0, seq=0, parties=2):
    from raytf._internal.checkpoint.files import parts_name, upload_part
    from raytf._internal.protocol import CheckpointPart, Report

    if files is None:
        part = CheckpointPart(round_, parties, seq)
    else:
        d = tmp_path / f"rank{rank}-round{round_}"
        d.mkdir()
        for name, text in files.items():
            (d / name).write_text(text)
        staging, manifest = upload_part(Checkpoint.from_directory(d), fs, manager.dir, parts_name(0, round_), rank)
        part = CheckpointPart(round_, parties, seq, staging, manifest)
    return Report(rank=rank, seq=round_, metrics={"epoch": round_}, time=0.0, part=part)


def merged_parts(fs, root, tmp_path):
    """A collective report's shares through the driver's handler; what each rank is acknowledged."""
    from raytf._internal.driver.history import RunHistory, report_handler
    from raytf._internal.driver.progress import ProgressDisplay
    from raytf._internal.storage import RunStorage

    storage = RunStorage(root, "run", filesystem=fs)
    manager = CheckpointManager(fs, storage.root)
    acks = []
    on_report = report_handler(manager, RunHistory(storage, ProgressDisplay("run", 0), 0, []), 0,
                               acknowledge=lambda rank, seq, error: acks.append((rank, seq, error)))
    return manager, on_report, acks, storage


def test_a_collective_report_commits_what_any_rank_passes_with_every_ranks_files_merged(tmp_path):
    manager, on_report, acks, storage = merged_parts(FS, str(tmp_path / "runs"), tmp_path)
    on_report(_share(FS, manager, tmp_path, 1, {"rank1.txt": "one"}, round_=0, seq=0))
    assert acks == [] and manager.entries == []  # rank 0 has not reported yet: the report waits
    on_report(_share(FS, manager, tmp_path, 0, None, round_=0, seq=0))
    assert sorted(acks) == [(0, 0, None), (1, 0, None)]
    [entry] = manager.entries
    assert sorted(os.listdir(manager.path_of(entry))) == [".raytf_manifest.json", "rank1.txt"]
    assert verify(FS, manager.path_of(entry)) is None
    # Both ranks: their own files, and one file alike on both (kept once).
    on_report(_share(FS, manager, tmp_path, 0, {"rank0.txt": "zero", "vocab.txt": "a b"}, round_=1, seq=1))
    on_report(_share(FS, manager, tmp_path, 1, {"rank1.txt": "uno", "vocab.txt": "a b"}, round_=1, seq=1))
    assert [e.name for e in manager.entries] == ["checkpoint_000000", "checkpoint_000001"]
    newest = manager.path_of(manager.entries[-1])
    assert sorted(os.listdir(newest)) == [".raytf_manifest.json", "rank0.txt", "rank1.txt", "vocab.txt"]
    assert verify(FS, newest) is None
    assert [e["checkpoint"] for e in storage.read_json("history.json")] == ["checkpoint_000000", "checkpoint_000001"]
    # No rank passed one: every rank is released, nothing is committed; no staging is left.
    acks.clear()
    on_report(_share(FS, manager, tmp_path, 0, None, round_=2, seq=2))
    on_report(_share(FS, manager, tmp_path, 1, None, round_=2, seq=2))
    assert sorted(acks) == [(0, 2, None), (1, 2, None)] and len(manager.entries) == 2
    assert sorted(os.listdir(manager.dir)) == ["checkpoint_000000", "checkpoint_000001", "index.json"]


def test_two_ranks_writing_one_file_differently_is_an_error_naming_it_and_nothing_is_committed(tmp_path):
    manager, on_report, acks, _ = merged_parts(FS, str(tmp_path / "runs"), tmp_path)
    on_report(_share(FS, manager, tmp_path, 0, {"model.h5": "weights of rank 0"}))
    on_report(_share(FS, manager, tmp_path, 1, {"model.h5": "weights of rank 1!"}))
    errors = {rank: error for rank, _, error in acks}
    assert set(errors) == {0, 1} and errors[0] == errors[1]
    assert "ranks 0 and 1 both wrote 'model.h5'" in errors[0] and "names of their own" in errors[0]
    assert manager.entries == [] and sorted(os.listdir(manager.dir)) == []


def test_a_rank_that_returns_without_its_share_fails_the_collective_report_instead_of_a_hang(tmp_path):
    manager, on_report, acks, _ = merged_parts(FS, str(tmp_path / "runs"), tmp_path)
    on_report(_share(FS, manager, tmp_path, 0, {"rank0.txt": "zero"}))
    on_report.phases(0, {0: "training", 1: "training"})
    assert acks == []  # rank 1 may still report
    on_report.phases(0, {0: "training", 1: "finished"})
    [(rank, seq, error)] = acks
    assert (rank, seq) == (0, 0) and "rank 1 returned from train_fn without making this report" in error
    assert manager.entries == []

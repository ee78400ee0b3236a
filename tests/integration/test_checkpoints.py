"""Checkpoints committed through raytf.report and resumed from after failures."""

from __future__ import annotations

import json
import os

import pytest

import raytf
from raytf._internal.checkpoint import memory
from raytf._internal.protocol import StorageRef
from raytf._internal.storage import RunStorage
from tests import workloads

pytestmark = pytest.mark.integration


def run_config(tmp_path, name, **kw):
    return raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **kw)


def trainer(tmp_path, name, config, **run):
    # One worker: only the chief's report commits a checkpoint, as with several (a restore read
    # from host memory by two ranks: test_recovery.py's kill).
    return raytf.Trainer(
        workloads.checkpointed_train,
        config=config,
        scaling=raytf.ScalingConfig(num_workers=1),
        run=run_config(tmp_path, name, **run),
    )


def test_a_kill_during_a_checkpoint_save_resumes_from_the_previous_one_and_a_new_driver_resumes_the_run(
        tmp_path, no_leaks):
    # The default upload="async": epoch 1's report returned with its checkpoint in host memory, and
    # the chief died while the background upload was under way.
    result = trainer(
        tmp_path, "kill-during-save", {"epochs": 3, "kill_during_save": 1},
        failure_config=raytf.FailureConfig(max_failures=1),
    ).fit()
    # Epoch 1's upload was cut short: attempt 1 resumed from epoch 0's checkpoint.
    seen = [(h["attempt"], h["epoch"], h["resumed_at"]) for h in result.history]
    assert seen[0] == (0, 0, 0) and seen[-2:] == [(1, 1, 1), (1, 2, 1)]
    checkpoints = tmp_path / "results" / "kill-during-save" / "checkpoints"
    index = json.loads((checkpoints / "index.json").read_text())
    assert [(c["epoch"], c["attempt"]) for c in index["checkpoints"]] == [(0, 0), (1, 1), (2, 1)]
    # The half-written upload never reached the index and was cleared before attempt 1.
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002", "index.json"]
    # Epoch 0's checkpoint stayed in host memory on the node after its commit (restore_from_memory,
    # the default): the restarted chief read it from there, and the run's end removed the copy.
    assert [s.get("restored_from") for s in result.startup] == [None, "memory"]
    storage = RunStorage(str(tmp_path / "results"), "kill-during-save")
    assert memory.find(StorageRef(storage.filesystem, storage.root), "checkpoint_000002") is None

    # A new driver (as after the first one was lost) resumes the run; resume="never" refuses to.
    with pytest.raises(raytf.ConfigError, match="resume='never'.*already has 3 committed checkpoint"):
        trainer(tmp_path, "kill-during-save", {"epochs": 5}, resume="never").fit()
    second = trainer(tmp_path, "kill-during-save", {"epochs": 5},
                     checkpoint_config=raytf.CheckpointConfig(num_to_keep=1)).fit()
    # result.history is the whole run: the first driver's epochs, then the second's.
    assert [(h["epoch"], h["resumed_at"], h["driver_start"]) for h in second.history][-4:] == [
        (1, 1, 0), (2, 1, 0), (3, 3, 1), (4, 3, 1)
    ]
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_000004", "index.json"]  # num_to_keep=1 kept the latest


def test_a_kill_right_after_a_commit_on_s3_resumes_from_that_checkpoint_read_from_s3(s3_filesystem, cluster, no_leaks):
    """upload="sync": report returns once the checkpoint is committed (the default, "async", returns
    once it is in host memory; test_a_kill_during_a_checkpoint_save_... shows what an upload cut
    short by the chief's death leaves). Synchronous uploads of a directory keep no copy in memory,
    so the restart reads the checkpoint back from S3 (the loopback server). One worker, as in the
    test above."""
    import pyarrow.fs as pafs

    result = raytf.Trainer(
        workloads.checkpointed_train,
        config={"epochs": 4, "kill_after": 1},
        scaling=raytf.ScalingConfig(num_workers=1),
        run=raytf.RunConfig(
            name="on-s3", storage_path="raytf-test/runs", storage_filesystem=s3_filesystem, verbose=0,
            failure_config=raytf.FailureConfig(max_failures=1), checkpoint_config=raytf.CheckpointConfig(upload="sync"),
        ),
    ).fit()
    assert [s.get("restored_from") for s in result.startup] == [None, "storage"]
    # The chief died the instant its epoch-1 report returned: epoch 1 was committed and used.
    seen = [(h["attempt"], h["epoch"], h["resumed_at"]) for h in result.history]
    assert seen == [(0, 0, 0), (0, 1, 0), (1, 2, 2), (1, 3, 2)]
    assert result.attempts == 2
    # Weights were restored, not rebuilt: attempt 1 starts where attempt 0 ended.
    losses = [h["loss"] for h in result.history]
    assert losses[2] < losses[0]
    root = "raytf-test/runs/on-s3/checkpoints"
    with s3_filesystem.open_input_stream(f"{root}/index.json") as stream:
        index = json.loads(stream.read())
    assert [(c["name"], c["epoch"], c["attempt"]) for c in index["checkpoints"]] == [
        (f"checkpoint_00000{e}", e, a) for e, a in ((0, 0), (1, 0), (2, 1), (3, 1))]
    listed = {info.base_name for info in s3_filesystem.get_file_info(pafs.FileSelector(root))}
    assert listed == {"index.json", *(f"checkpoint_00000{e}" for e in range(4))}
    assert result.path == "s3://raytf-test/runs/on-s3"
    assert result.checkpoint.epoch == 3
    with result.checkpoint.as_directory() as local:
        assert os.path.exists(os.path.join(local, "state.index"))

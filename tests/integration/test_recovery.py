"""Recovery on a real cluster: a deterministic resume (preemption by SIGTERM and by Ray's drain
notice: test_exactly_once.py's run over TFRecord files; elastic shrinking and growth:
test_scale.py; peers that never start and collective errors: test_trainer.py's worker lost each
way; warm restarts and a lost node's kept shards: test_trainer.py's warm standby run)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import raytf
from tests import workloads

pytestmark = pytest.mark.integration

ROWS = 1024


def mlp_data(rows=ROWS):
    import ray

    return ray.data.range(rows, override_num_blocks=8).map_batches(workloads.mlp_features, batch_size=None).materialize()


def resumable(tmp_path, name, config, *, scaling=None, rows=ROWS, **run):
    return raytf.Trainer(
        workloads.resumable_train,
        config={"out_dir": str(tmp_path), "rows": rows, "epochs": 3, **config},
        datasets={"train": mlp_data(rows)},
        scaling=scaling or raytf.ScalingConfig(num_workers=2),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **run),
    )


def in_background(trainer):
    """fit() in a thread, so the test can act on the cluster meanwhile."""
    outcome = {}

    def target():
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # noqa: BLE001 - re-raised by the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join():
        thread.join(timeout=300)
        assert not thread.is_alive(), "fit() did not return"
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    return join


def weights(path):
    with np.load(path) as saved:
        return [saved[k] for k in sorted(saved.files)]


def test_a_run_with_one_kill_ends_with_the_weights_of_a_run_with_none(cluster, tmp_path, no_leaks):
    from ray.data import DataContext

    context = DataContext.get_current()
    preserve = context.execution_options.preserve_order
    context.execution_options.preserve_order = True  # the same rows to the same rank in every run
    try:
        clean_dir, killed_dir = tmp_path / "clean", tmp_path / "killed"
        clean_dir.mkdir(), killed_dir.mkdir()
        every_2 = raytf.CheckpointConfig(every_n_epochs=2)
        steps_per_epoch = ROWS // 32
        clean = resumable(clean_dir, "deterministic", {"epochs": 4}, checkpoint_config=every_2).fit()
        killed = resumable(
            killed_dir, "deterministic", {"epochs": 4, "kill": {"rank": 1, "step": 2 * steps_per_epoch + 5}},
            checkpoint_config=every_2, failure_config=raytf.FailureConfig(max_failures=1),
        ).fit()
    finally:
        context.execution_options.preserve_order = preserve
    assert (clean.attempts, killed.attempts) == (1, 2)
    # Rank 1 died; the chief's copy in host memory of epoch 1's checkpoint served the restart, and
    # every rank restored the same step (the weights below match a run without the kill). Rank 0
    # trained the restart in its own process, kept (FailureConfig.keep_survivors) with its
    # TensorFlow context made new: still the weights of a run with no kill.
    assert killed.startup[1]["restored_from"] == "memory"
    assert killed.startup[1]["kept_processes"] == 1
    # Checkpoints every 2 epochs: epochs 1 and 3. The kill in epoch 2 resumed from epoch 1's.
    assert [h["epoch"] for h in killed.history] == [0, 1, 2, 3]
    assert [h["resumed_at"] for h in killed.history] == [None, None, 2 * steps_per_epoch, 2 * steps_per_epoch]
    for directory in (clean_dir, killed_dir):
        index = json.loads((directory / "results" / "deterministic" / "checkpoints" / "index.json").read_text())
        assert [c["epoch"] for c in index["checkpoints"]] == [1, 3]
    assert [h["loss"] for h in killed.history] == [h["loss"] for h in clean.history]
    for a, b in zip(weights(clean_dir / "weights.npz"), weights(killed_dir / "weights.npz")):
        np.testing.assert_array_equal(a, b)

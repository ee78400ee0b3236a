"""Keras on raytf workers: Keras 3 through raytf.keras.fit, tf-keras through its own model.fit."""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest

import raytf
from tests import workloads
from tests.integration.conftest import assert_no_leaks

pytestmark = pytest.mark.integration


def datasets():
    import ray

    def make(rows, seed_offset):
        def features(batch):
            return workloads.mlp_features({"id": batch["id"] + seed_offset})

        return ray.data.range(rows, override_num_blocks=4).map_batches(features, batch_size=None).materialize()

    return {"train": make(2048, 0), "val": make(512, 10**6)}


def fit(fn, tmp_path, name, config, keras, datasets=None, workers=2, **kw):
    return raytf.Trainer(
        fn,
        config={"out_dir": str(tmp_path), **config},
        datasets=datasets,
        scaling=raytf.ScalingConfig(num_workers=workers),
        tensorflow=raytf.TensorflowConfig(keras=keras, mixed_precision=kw.pop("mixed_precision", None)),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **kw),
    ).fit()


def ranks(tmp_path):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def killed_runs(cluster, tmp_path_factory):
    """Each Keras path trained 4 epochs on two workers, one of them killed after epoch 1, then
    checks gradient accumulation in the same workers (Keras 3's also its callbacks and metrics, in
    keras3_checks): path -> (its result, its ranks' json, its directory)."""
    out = {}
    for path, workload in (("keras3", workloads.keras_train_then_callbacks_and_gradient_accumulation),
                           ("tf_keras", workloads.keras_train_then_gradient_accumulation)):
        root = tmp_path_factory.mktemp(path)
        result = fit(
            workload, root, f"keras-{path}", {"path": path, "epochs": 4, "kill_after_epoch": 1, "steps": 3},
            keras=path, datasets=datasets(), failure_config=raytf.FailureConfig(max_failures=1),
        )
        assert_no_leaks()
        out[path] = (result, ranks(root), root)
    return out


@pytest.mark.parametrize("path", ["keras3", "tf_keras"])
def test_each_keras_path_trains_two_workers_reports_and_resumes_after_a_kill(killed_runs, path):
    result, (r0, r1), _ = killed_runs[path]
    assert r0["keras_version"].startswith("3." if path == "keras3" else "2.")
    # ReportCallback reported every epoch with a checkpoint; the kill after epoch 1
    # cost one retry, which resumed at epoch 2 from epoch 1's checkpoint.
    assert [(h["attempt"], h["epoch"]) for h in result.history] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert all("checkpoint" in h for h in result.history)
    assert result.attempts == 2 and r0["attempt"] == 1
    losses = [h["loss"] for h in result.history]
    assert losses[2] < losses[0] and losses[3] < 0.6 * losses[0]  # resumed weights, not a fresh start
    assert result.history[-1]["val_accuracy"] > 0.7
    # Every rank saw the same aggregated epoch logs.
    assert r0["history"] == r1["history"] and len(r0["history"]["loss"]) == 2


def test_both_paths_reach_a_comparable_loss(killed_runs):
    # The same model, data, steps and resume on each path.
    keras3, tf_keras = killed_runs["keras3"][0], killed_runs["tf_keras"][0]
    a, b = keras3.metrics["loss"], tf_keras.metrics["loss"]
    assert abs(a - b) < 0.1 * max(a, b) + 0.02, (a, b)
    assert abs(keras3.metrics["val_accuracy"] - tf_keras.metrics["val_accuracy"]) < 0.05


def test_keras3_fit_aggregates_metrics_over_workers_and_runs_callbacks(keras3_checks):
    r0, r1 = ranks(keras3_checks)
    assert r0 == r1  # identical epoch logs on both ranks
    # Locally the mean label is 0 (rank 0) or 1 (rank 1); over both workers it is 0.5.
    assert r0["history"]["mean_label"] == [0.5, 0.5] and r0["history"]["val_mean_label"] == [0.5, 0.5]
    # EarlyStopping(patience=0) on a metric that never improves stopped both ranks after epoch 1.
    assert len(r0["history"]["loss"]) == 2
    assert r0["rates"] == pytest.approx([0.1, 0.05])  # LearningRateScheduler ran each epoch


@pytest.fixture(scope="module")
def keras3_checks(killed_runs):
    """The directory of Keras 3's checks after its killed run (workloads.keras_train_then_callbacks_and_gradient_accumulation)."""
    return killed_runs["keras3"][2] / "checks"


@pytest.fixture
def accumulated(request):
    """The directory of a run that ran workloads.gradient_accumulation on ``request.param``'s Keras path."""
    if request.param == "keras3":
        return request.getfixturevalue("keras3_checks")
    return request.getfixturevalue("killed_runs")["tf_keras"][2]


@pytest.mark.parametrize("accumulated", ["keras3", "tf_keras"], indirect=True)
def test_gradient_accumulation_over_micro_batches_or_steps_equals_one_step_on_all_rows(accumulated):
    tmp_path = accumulated
    with np.load(tmp_path / "whole.npz") as whole, np.load(tmp_path / "parts.npz") as parts, \
            np.load(tmp_path / "deferred.npz") as deferred:
        for key in whole.files:
            np.testing.assert_allclose(parts[key], whole[key], rtol=1e-4, atol=1e-5)
            # K steps of b rows, all-reduced and applied once: the same update as one step on K x b rows.
            np.testing.assert_allclose(deferred[key], parts[key], rtol=1e-5, atol=1e-6)
    moved = json.loads((tmp_path / "moved.json").read_text())
    assert moved["moved"] > 1e-2  # the steps did change the weights
    assert moved["updates"] == {"whole": 3, "parts": 3, "deferred": 3}  # 12 steps of 16 rows, 3 updates


def assert_mixed_precision(tmp_path, result, policy):
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    assert r0["compute_dtype"] == policy.split("_")[1] and r0["variable_dtype"] == "float32"
    # float16 needs loss scaling (compile wraps the optimizer); bfloat16 has float32's range and does not.
    assert (r0["optimizer"] == "LossScaleOptimizer") == (policy == "mixed_float16")
    losses = [h["loss"] for h in result.history if "loss" in h]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_tf_keras_mixed_bfloat16_computes_in_half_precision_without_loss_scaling(cluster, tmp_path, no_leaks):
    """(Keras 3's mixed_float16: the preemption test below, on two workers.) One worker: the policy is
    each worker's own."""
    result = fit(workloads.keras_train, tmp_path, "mixed-tf_keras", {"path": "tf_keras", "epochs": 2},
                 keras="tf_keras", datasets=datasets(), mixed_precision="mixed_bfloat16", workers=1)
    assert_mixed_precision(tmp_path, result, "mixed_bfloat16")


def test_keras3_mixed_float16_fit_checkpoints_on_preemption_and_resumes_at_that_step(cluster, tmp_path, no_leaks):
    """Keras 3 under mixed_float16 (its LossScaleOptimizer's state in the checkpoint), SIGTERM to rank 1."""
    from tests.integration.conftest import wait_for

    outcome = {}
    trainer = raytf.Trainer(
        workloads.keras_train,
        config={"out_dir": str(tmp_path), "path": "keras3", "epochs": 3, "mark_batch": 6, "step_sleep": 0.2,
                "check_every": 4},
        datasets=datasets(),
        scaling=raytf.ScalingConfig(num_workers=2),
        tensorflow=raytf.TensorflowConfig(keras="keras3", mixed_precision="mixed_float16"),
        run=raytf.RunConfig(name="keras-preempted", storage_path=str(tmp_path / "results"), verbose=0),
    )
    thread = threading.Thread(target=lambda: outcome.update(result=trainer.fit()), daemon=True)
    thread.start()
    running = wait_for(lambda: (tmp_path / "running1.json").exists() and tmp_path / "running1.json", 120, "training")
    os.kill(json.loads(running.read_text())["pid"], signal.SIGTERM)
    thread.join(timeout=300)
    result = outcome["result"]
    # ReportCallback saw the preemption, checkpointed the step and stopped; it cost no failure
    # (max_failures=0), and fit() resumed at that step: 32 steps an epoch, none trained twice.
    assert result.attempts == 2 and [f.kind for f in result.failures] == ["preempted"]
    [preempted] = [h for h in result.history if "preempted_at_step" in h]
    assert preempted["attempt"] == 0 and 8 <= preempted["preempted_at_step"] < 32
    assert [(h["attempt"], h["epoch"]) for h in result.history if "preempted_at_step" not in h] == [(1, 0), (1, 1), (1, 2)]
    assert result.history[-1]["step"] == 3 * 32
    assert ranks(tmp_path)[0]["iterations"] == 3 * 32
    assert_mixed_precision(tmp_path, result, "mixed_float16")

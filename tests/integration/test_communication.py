"""The gradient all-reduce's options: fusion (bytes_per_pack) and 16-bit compression.

Each run trains the same seeded models on the same per-rank rows (workloads.communication_update),
so runs differ only in how the gradients crossed between the workers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import raytf
import raytf.keras
from tests import workloads

FIT_EPOCHS = 4
LOCAL_SGD_STEPS = 7  # averaged inside steps 3 and 6, and at the epoch's end after step 7
RUNS = {
    # name: (TensorflowConfig arguments, Keras epochs, the local-SGD run made in the same processes);
    # per-variable's processes also make its steps with one fused all-reduce ("fused", also_fused).
    "per-variable": (dict(bytes_per_pack=1, keras="tf_keras"), FIT_EPOCHS, "local-sgd-tf-keras"),
    "bfloat16-ef": (dict(gradient_compression="bfloat16", error_feedback=True, keras="tf_keras"), FIT_EPOCHS,
                    "local-sgd-bfloat16-ef"),
    "keras3": (dict(keras="keras3"), FIT_EPOCHS, "local-sgd-keras3"),
    "keras3-float16": (dict(gradient_compression="float16", keras="keras3"), FIT_EPOCHS, None),
}


@pytest.fixture(scope="module")
def all_runs(cluster, tmp_path_factory):
    """Every run of RUNS once: (name -> (its json, its saved weights), local-SGD name -> ([rank 0's
    json, rank 1's json], the kernel in the run's last checkpoint)). A local-SGD run shares the
    processes of the run with its options: each group's start is several seconds of the suite."""
    import tensorflow as tf

    from raytf.checkpoint import STATE_PREFIX

    root = tmp_path_factory.mktemp("communication")
    out, local_sgd = {}, {}
    for name, (tensorflow, epochs, local) in RUNS.items():
        result = raytf.Trainer(
            workloads.communication_update,
            config={"out_dir": str(root), "name": name, "fit_epochs": epochs, "local_sgd": local,
                    "steps": LOCAL_SGD_STEPS, "also_fused": name == "per-variable"},
            scaling=raytf.ScalingConfig(num_workers=2),
            tensorflow=raytf.TensorflowConfig(**tensorflow),
            run=raytf.RunConfig(name=name, storage_path=str(root / "runs"), verbose=0),
        ).fit()
        with np.load(root / f"{name}.npz") as weights:
            out[name] = (json.loads((root / f"{name}.json").read_text()), {k: weights[k] for k in weights.files})
        if name == "per-variable":
            with np.load(root / f"{name}-fused.npz") as weights:
                out["fused"] = (None, {k: weights[k] for k in weights.files})
        if local is None:
            continue
        reader = tf.train.load_checkpoint(f"{result.checkpoint.path}/{STATE_PREFIX}")
        kernels = {n: reader.get_tensor(n) for n, shape in reader.get_variable_to_shape_map().items()
                   if shape == [4, 1] and "/_variables/" not in n}  # not an optimizer slot
        assert len(kernels) == 1, sorted(kernels)
        [kernel] = kernels.values()
        local_sgd[local] = ([json.loads((root / f"{local}-rank{r}.json").read_text()) for r in range(2)], kernel)
    return out, local_sgd


@pytest.fixture(scope="module")
def runs(all_runs):
    return all_runs[0]


@pytest.fixture(scope="module")
def local_sgd_runs(all_runs):
    return all_runs[1]


def test_fused_and_per_variable_all_reduces_give_the_same_update(runs):
    """bytes_per_pack reaches the strategy (1 where set, TensorFlow's 0 by default); one concatenated
    all-reduce (0) and one per variable (1) move the weights identically."""
    (_, fused), (per_variable_info, per_variable) = runs["fused"], runs["per-variable"]
    assert per_variable_info["bytes_per_pack"] == 1 and runs["keras3"][0]["bytes_per_pack"] == 0
    assert len(fused) == 17  # 14 MLP variables, the manual loop's w and b, the first kernel before training
    for key in fused:
        np.testing.assert_allclose(fused[key], per_variable[key], rtol=1e-6, atol=1e-7)
    # The steps did move the weights (the comparison is not of two untouched initializations).
    assert not np.allclose(fused["arr_0"], fused["initial"])


@pytest.mark.parametrize("compressed, reference", [("bfloat16-ef", "per-variable"), ("keras3-float16", "keras3")])
def test_compressed_all_reduce_keeps_float32_weights_and_converges_as_float32_does(runs, compressed, reference):
    (info, weights), (reference_info, reference_weights) = runs[compressed], runs[reference]
    # Weights and optimizer state stay float32: only what crosses the network is 16-bit.
    assert info["dtypes"] == reference_info["dtypes"] == ["float32"]
    # Through the Keras optimizer (arr_0..arr_13) and raytf.all_reduce_gradients (arr_14, arr_15):
    # the update is the float32 one up to 16-bit rounding of the gradients, and not exactly it
    # (the compression did happen).
    for key in [k for k in weights if k != "initial"]:
        np.testing.assert_allclose(weights[key], reference_weights[key], atol=2e-3)
    assert max(np.abs(weights[k] - reference_weights[k]).max() for k in ("arr_0", "arr_14")) > 1e-7
    # Training through the Keras path converges: final loss within 2% of float32's.
    losses, reference_losses = info["losses"], reference_info["losses"]
    assert len(losses) == FIT_EPOCHS and losses[-1] < 0.5 * losses[0]
    assert abs(losses[-1] - reference_losses[-1]) <= 0.02 * reference_losses[-1], (losses, reference_losses)


def test_error_feedback_keeps_each_workers_rounding_residual(runs):
    assert runs["bfloat16-ef"][0]["residual"] > 0  # what bfloat16 rounded away, kept for the next step
    assert runs["keras3-float16"][0]["residual"] == 0 and runs["per-variable"][0]["residual"] == 0


def test_bytes_per_pack_must_be_a_whole_number_of_bytes():
    with pytest.raises(raytf.ConfigError, match="bytes_per_pack"):
        raytf.TensorflowConfig(bytes_per_pack=-1)


def test_compression_settings_are_checked():
    with pytest.raises(raytf.ConfigError, match="gradient_compression must be None, 'bfloat16' or 'float16'"):
        raytf.TensorflowConfig(gradient_compression="int8")
    with pytest.raises(raytf.ConfigError, match="error_feedback=True .* set gradient_compression"):
        raytf.TensorflowConfig(error_feedback=True)
    compressed = raytf.TensorflowConfig(gradient_compression="bfloat16")
    with pytest.raises(raytf.ConfigError, match="parameter-server workers send their updates"):
        raytf.ParameterServerTrainer(lambda: None, tensorflow=compressed)
    with pytest.raises(raytf.ConfigError, match="a launched script builds its own"):
        from raytf.launch import Launcher

        Launcher(["python", "train.py"], tensorflow=compressed)


# -- local SGD (raytf.keras.local_sgd): each worker steps alone, the weights averaged every K steps --


def simulate_local_sgd(ranks: list[dict], every: int, lr: float = 0.05, batch: int = 8) -> list[list]:
    """Local SGD in numpy: per step, each rank's (kernel, bias) after the step (and the average
    that ends it, every ``every``-th step); the last entry is the final, averaged model."""
    weights = [[np.array(w, "float64") for w in rank["initial"]] for rank in ranks]
    after = []
    for step in range(LOCAL_SGD_STEPS):
        for w, rank in zip(weights, ranks):
            x = np.array(rank["x"])[step * batch:(step + 1) * batch]
            error = x @ w[0] + w[1] - np.array(rank["y"])[step * batch:(step + 1) * batch]
            w[0] -= lr * 2 / batch * x.T @ error  # mean squared error's gradient, this rank's rows only
            w[1] -= lr * 2 / batch * error.sum(0)
        if (step + 1) % every == 0:
            weights = [[np.mean([w[i] for w in weights], axis=0) for i in range(2)] for _ in ranks]
        after.append([[w[0].copy(), w[1].copy()] for w in weights])
    final = [np.mean([w[i] for w in weights], axis=0) for i in range(2)]
    return after, final


@pytest.mark.parametrize("name", ["local-sgd-tf-keras", "local-sgd-keras3"])
def test_local_sgd_steps_each_worker_alone_and_averages_every_k_steps(local_sgd_runs, name):
    ranks, checkpointed = local_sgd_runs[name]
    after, final = simulate_local_sgd(ranks, every=3)
    for r, rank in enumerate(ranks):
        assert rank["initial"] == ranks[0]["initial"]  # every worker starts from the chief's weights
        assert len(rank["seen"]) == LOCAL_SGD_STEPS
        for step, seen in enumerate(rank["seen"]):
            for got, want in zip(seen, after[step][r]):
                np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-5, err_msg=f"rank {r} step {step + 1}")
        for got, want in zip(rank["final"], final):
            np.testing.assert_allclose(np.array(got), want, rtol=1e-4, atol=1e-5)
        # One optimizer step per training step (not one per K, as accumulate_gradients(steps=K) takes).
        assert rank["iterations"] == LOCAL_SGD_STEPS
    # Between averages the workers' weights differ; at the K-th step and at the end they are one.
    assert np.abs(np.array(ranks[0]["seen"][1][0]) - np.array(ranks[1]["seen"][1][0])).max() > 1e-2
    assert ranks[0]["seen"][2] == ranks[1]["seen"][2]
    assert ranks[0]["seen"][6] != ranks[1]["seen"][6] and ranks[0]["final"] == ranks[1]["final"]
    if name == "local-sgd-tf-keras":  # validation, after step 7, already sees the averaged model
        assert ranks[0]["at_validation"] == ranks[1]["at_validation"] == [ranks[0]["final"]]
    # The checkpoint ReportCallback wrote at the epoch's end holds the averaged model.
    np.testing.assert_allclose(checkpointed, np.array(ranks[0]["final"][0]), rtol=1e-6)


def test_local_sgd_with_compression_averages_16_bit_changes_and_keeps_float32_weights(local_sgd_runs):
    ranks, _ = local_sgd_runs["local-sgd-bfloat16-ef"]
    reference, _ = local_sgd_runs["local-sgd-tf-keras"]
    _, final = simulate_local_sgd(ranks, every=3)
    # The average is float32 weights plus bfloat16 changes: close to the exact average, one model on
    # every worker, and not exactly float32's (the changes did cross in 16 bits).
    assert ranks[0]["final"] == ranks[1]["final"] and ranks[0]["seen"][2] == ranks[1]["seen"][2]
    for got, want in zip(ranks[0]["final"], final):
        np.testing.assert_allclose(np.array(got), want, rtol=2e-2, atol=2e-3)
    assert ranks[0]["initial"] == reference[0]["initial"]
    assert max(np.abs(np.array(g) - np.array(w)).max() for g, w in zip(ranks[0]["final"], reference[0]["final"])) > 1e-5


def test_local_sgd_steps_are_checked():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    with pytest.raises(raytf.RaytfError, match="model has no optimizer; call model.compile"):
        raytf.keras.local_sgd(model, steps=2)
    model.compile(optimizer="sgd", loss="mse")
    for steps in (0, 2.0, True):
        with pytest.raises(raytf.RaytfError, match="steps must be an int >= 1"):
            raytf.keras.local_sgd(model, steps=steps)
    model.compile(optimizer=tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD()), loss="mse")
    with pytest.raises(raytf.RaytfError, match="LossScaleOptimizer.*mixed_bfloat16"):
        raytf.keras.local_sgd(model, steps=2)

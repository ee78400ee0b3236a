"""The gradient all-reduce's options: fusion (bytes_per_pack) and 16-bit compression.

Each run trains the same seeded models on the same per-rank rows (workloads.communication_update),
so runs differ only in how the gradients crossed between the workers.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import raytf
from tests import workloads

FIT_EPOCHS = 4
RUNS = {
    # name: (TensorflowConfig arguments, Keras epochs)
    "per-variable": (dict(bytes_per_pack=1, keras="tf_keras"), FIT_EPOCHS),
    "fused": (dict(bytes_per_pack=0, keras="tf_keras"), 0),
    "bfloat16-ef": (dict(gradient_compression="bfloat16", error_feedback=True, keras="tf_keras"), FIT_EPOCHS),
    "keras3": (dict(keras="keras3"), FIT_EPOCHS),
    "keras3-float16": (dict(gradient_compression="float16", keras="keras3"), FIT_EPOCHS),
}


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Every run of RUNS once: name -> (its json, its saved weights)."""
    root = tmp_path_factory.mktemp("communication")
    out = {}
    for name, (tensorflow, epochs) in RUNS.items():
        raytf.Trainer(
            workloads.communication_update, config={"out_dir": str(root), "name": name, "fit_epochs": epochs},
            scaling=raytf.ScalingConfig(num_workers=2),
            tensorflow=raytf.TensorflowConfig(**tensorflow),
            run=raytf.RunConfig(name=name, storage_path=str(root / "runs"), verbose=0),
        ).fit()
        with np.load(root / f"{name}.npz") as weights:
            out[name] = (json.loads((root / f"{name}.json").read_text()), {k: weights[k] for k in weights.files})
    return out


def test_fused_and_per_variable_all_reduces_give_the_same_update(runs):
    """bytes_per_pack reaches the strategy; one concatenated all-reduce (0) and one per variable (1)
    move the weights identically."""
    (fused_info, fused), (per_variable_info, per_variable) = runs["fused"], runs["per-variable"]
    assert fused_info["bytes_per_pack"] == 0 and per_variable_info["bytes_per_pack"] == 1
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

"""Ray Train code on raytf, with only its imports changed (raytf inside Ray Tune trials:
test_docs_examples.py).

Each of Ray Train's TensorFlow examples (tests/ray_train_examples.py) runs to the
end on raytf and reaches the loss it reaches on Ray Train, on the same data.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import ray_train_examples as examples

pytestmark = pytest.mark.integration


def raytf_run(fn, config, tmp_path, name, datasets=None, keras=None, num_workers=2):
    from raytf.train import RunConfig, ScalingConfig, TensorflowConfig, TensorflowTrainer

    return TensorflowTrainer(
        fn, train_loop_config={**config, "api": "raytf"},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name=name, storage_path=str(tmp_path / "raytf")),
        tensorflow_config=TensorflowConfig(keras=keras) if keras else None,
        datasets=datasets,
    ).fit()


def ray_train_run(fn, config, tmp_path, datasets=None):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    return TensorflowTrainer(
        fn, train_loop_config={**config, "api": "ray"}, scaling_config=ScalingConfig(num_workers=2),
        # Ray Train sets TF_USE_LEGACY_KERAS in the worker after TensorFlow may be loaded; set it first.
        run_config=RunConfig(storage_path=str(tmp_path / "ray_train"),
                             worker_runtime_env={"env_vars": {"TF_USE_LEGACY_KERAS": "1"}},
                             # The reference run, not raytf's, may restart once. Ray Train leaves
                             # TensorFlow's coordination service at its 10 s heartbeat timeout, which
                             # a loaded two-core machine has outlasted in CI (task 0's own heartbeat).
                             # The examples seed their models and restore no checkpoint: a restart
                             # trains from the start and reaches the same loss.
                             failure_config=FailureConfig(max_failures=1)),
        datasets=datasets,
    ).fit()


def test_the_mnist_keras_example_reaches_ray_trains_loss(cluster, tmp_path, no_leaks):
    config = {"epochs": 3, "steps_per_epoch": 30, "lr": 0.05}
    ours = raytf_run(examples.mnist_keras, config, tmp_path, "mnist")
    theirs = ray_train_run(examples.mnist_keras, config, tmp_path)
    assert [h["epoch"] for h in ours.history] == [0, 1, 2]
    assert ours.checkpoint is not None and ours.checkpoint.epoch == 2
    # The same model, data and steps: the same loss, within what the shuffles' orders give.
    assert ours.metrics["loss"] == pytest.approx(theirs.metrics["loss"], rel=0.25)
    assert ours.metrics["loss"] < ours.history[0]["loss"]


def test_the_regression_example_on_a_ray_dataset_with_to_tf_reaches_ray_trains_loss(cluster, tmp_path, no_leaks):
    datasets = {"train": examples.concatenate(examples.regression_data()).materialize()}
    theirs = ray_train_run(examples.regression, {"epochs": 2, "batch_size": 32, "lr": 0.03}, tmp_path, datasets=datasets)
    # Ray Train hands to_tf's batches straight to model.fit, and MultiWorkerMirroredStrategy
    # splits a batch of unknown size across the workers: each step trains on half of every
    # worker's batch, twice the steps per epoch. raytf trains every row of every batch (a
    # raytf shard is distributed per worker), so it takes twice the epochs for as many updates.
    ours = raytf_run(examples.regression, {"epochs": 4, "batch_size": 32, "lr": 0.03}, tmp_path, "regression",
                     datasets=datasets)
    # fit() is called once per epoch: the epochs reported are the run's.
    assert [h["epoch"] for h in ours.history] == list(range(4))
    assert ours.history[-1]["step"] == 4 * (1000 // 32 + 1)
    assert ours.metrics["loss"] <= 1.25 * theirs.metrics["loss"]
    assert ours.metrics["loss"] < 0.5 * ours.history[0]["loss"]


def test_the_autoencoder_example_trains_from_iter_tf_batches(cluster, tmp_path, no_leaks):
    import ray

    images = np.random.default_rng(0).random((1024, 64)).astype("float32")
    datasets = {"train": ray.data.from_items([{"image": row} for row in images]).materialize()}
    # One worker: the split of a Ray Dataset between workers is the regression example's test above.
    result = raytf_run(examples.autoencoder, {"epochs": 4}, tmp_path, "autoencoder", datasets=datasets, num_workers=1)
    losses = [h["loss"] for h in result.history]
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_the_quick_start_with_its_own_strategy_trains_under_keras_3(cluster, tmp_path, no_leaks):
    # Under Ray Train, Keras 3's model.fit fails with a PerReplica error; raytf runs it.
    config = {"epochs": 2, "steps_per_epoch": 30, "lr": 0.05, "callback": False}
    result = raytf_run(examples.mnist_keras, config, tmp_path, "keras3", keras="keras3")
    assert result.metrics["epoch"] == 1 and result.metrics["loss"] < 2.0

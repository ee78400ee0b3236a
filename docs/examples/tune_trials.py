"""Hyperparameter search with Ray Tune: each trial a raytf run.

The guide "Coming from Ray Train" quotes this file; ``tests/integration/test_docs_examples.py``
runs it with two trials of two workers.

    python docs/examples/tune_trials.py
"""

from __future__ import annotations

import os

import ray

import raytf


def train_fn(config: dict) -> None:
    import tensorflow as tf

    import raytf.keras

    train = raytf.get_dataset_shard("train", batch_size=64, features="x", label="y", shuffle=True, seed=0)
    with raytf.strategy().scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.SGD(config["lr"]),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    raytf.keras.fit(model, train, epochs=config["epochs"], callbacks=[raytf.keras.ReportCallback()])


def rows(batch: dict) -> dict:
    import numpy as np

    x = np.random.default_rng(int(batch["id"][0])).standard_normal((len(batch["id"]), 8)).astype("float32")
    return {"x": x, "y": (x[:, 0] > 0).astype("int64")}


def main(storage_path: str = "~/raytf_results", learning_rates: tuple = (1e-3, 1e-2), num_workers: int = 2,
         epochs: int = 3, num_rows: int = 4096, max_concurrent_trials: int | None = None):
    storage_path = os.path.abspath(os.path.expanduser(storage_path))
    # --8<-- [start:tune]
    from ray import tune

    def trial(config: dict) -> None:
        result = raytf.Trainer(
            train_fn, config=config,
            datasets={"train": ray.data.range(num_rows).map_batches(rows, batch_size=None)},
            scaling=raytf.ScalingConfig(num_workers=num_workers),
            run=raytf.RunConfig(name=tune.get_context().get_trial_name(), storage_path=storage_path),
        ).fit()
        tune.report({"loss": result.metrics["loss"]})

    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 0.01}),  # the trial itself only waits on its workers
        param_space={"lr": tune.grid_search(list(learning_rates)), "epochs": epochs},
        # As many trials at once as the cluster holds groups of num_workers (None: as many as start).
        tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent_trials),
        run_config=tune.RunConfig(storage_path=storage_path, name="search"),
    )
    best = tuner.fit().get_best_result(metric="loss", mode="min")
    print(best.config["lr"], best.metrics["loss"])
    # --8<-- [end:tune]
    return best


if __name__ == "__main__":
    main()

"""A tf-keras model on 4 GPU workers, its checkpoints in S3, surviving lost workers.

The recipe page quotes this file; ``tests/integration/test_docs_examples.py`` runs it on CPU
workers against a loopback S3-compatible server (moto), with ``storage_path`` an ``s3://`` URI.

    python docs/examples/recipe_gpus_s3.py --storage-path s3://my-bucket/raytf-runs
"""

from __future__ import annotations

import argparse

import ray

import raytf


# --8<-- [start:train_fn]
def train_fn(config: dict) -> None:
    import tensorflow as tf  # tf.keras is tf-keras here: TensorflowConfig(keras="tf_keras")

    import raytf.keras

    train = raytf.get_dataset_shard("train", batch_size=config["batch_per_worker"], features="x", label="y",
                                    shuffle=True, seed=0)
    with raytf.strategy().scope():
        model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(256, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    initial_epoch = raytf.keras.restore(model)  # 0, or the epoch after the latest checkpoint's
    # The shard itself, not train.repeat() with steps_per_epoch: each epoch is one pass over it, so a
    # run stopped mid-epoch resumes at the next untrained row and every row trains once per epoch.
    model.fit(train, epochs=config["epochs"], initial_epoch=initial_epoch, verbose=0,
              callbacks=[raytf.keras.ReportCallback()])  # each epoch: metrics, checkpoint to S3
# --8<-- [end:train_fn]


def images(batch: dict) -> dict:
    """784 features and a class of 10 (W1's rows: a fixed random projection decides the class)."""
    import numpy as np

    x = np.random.default_rng(int(batch["id"][0])).standard_normal((len(batch["id"]), 784)).astype("float32")
    w = np.random.default_rng(0).standard_normal((784, 10)).astype("float32")
    return {"x": x, "y": np.argmax(x @ w, axis=1)}


def main(storage_path: str = "s3://my-bucket/raytf-runs", num_workers: int = 4, gpus_per_worker: int = 1,
         cpus_per_worker: int = 4, epochs: int = 10, num_rows: int = 60_000) -> raytf.Result:
    # --8<-- [start:fit]
    result = raytf.Trainer(
        train_fn,
        config={"epochs": epochs, "batch_per_worker": 128},
        datasets={"train": ray.data.range(num_rows).map_batches(images, batch_size=None)},
        scaling=raytf.ScalingConfig(num_workers=num_workers, gpus_per_worker=gpus_per_worker,
                                    cpus_per_worker=cpus_per_worker),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),  # model.fit under the strategy: tf-keras
        run=raytf.RunConfig(
            name="tf-keras-gpus", storage_path=storage_path,  # s3://bucket/prefix, credentials as AWS reads them
            failure_config=raytf.FailureConfig(max_failures=3),  # lost workers or nodes survived
            checkpoint_config=raytf.CheckpointConfig(num_to_keep=3),
        ),
    ).fit()
    print(result.metrics["accuracy"], result.path)  # s3://my-bucket/raytf-runs/tf-keras-gpus
    # --8<-- [end:fit]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default="s3://my-bucket/raytf-runs")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--gpus-per-worker", type=int, default=1)
    args = parser.parse_args()
    main(args.storage_path, args.num_workers, args.gpus_per_worker)

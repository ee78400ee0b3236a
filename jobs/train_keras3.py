"""Train a Keras 3 classifier on 2 workers with raytf.keras.fit and print the final metrics.

Keras 3 (what ``tf.keras`` is in TensorFlow 2.21) cannot ``model.fit`` under
MultiWorkerMirroredStrategy; ``raytf.keras.fit`` trains the compiled model
with its own ``train_step`` under the strategy instead: the optimizer, loss
and metrics from ``compile``, metrics aggregated over every worker,
validation, and Keras callbacks (early stopping, a learning-rate schedule,
and raytf's ReportCallback, which reports each epoch and checkpoints).

    python jobs/train_keras3.py [--mixed-precision mixed_bfloat16] [--micro-batches 2]
    ray job submit --working-dir . -- python jobs/train_keras3.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_mlp  # noqa: E402  (the W1 data, shared by the jobs)

import raytf  # noqa: E402


def train_fn(config: dict) -> None:
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras  # Keras 3: TensorflowConfig(keras="keras3")
    train = raytf.get_dataset_shard(
        "train", global_batch_size=config["batch_size"], features="x", label="y",
        shuffle=True, seed=0, drop_remainder=True,
    )
    val = raytf.get_dataset_shard("val", batch_size=512, features="x", label="y")
    with raytf.strategy().scope():
        model = keras.Sequential(
            [keras.Input((784,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(config["lr"]),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    if config["micro_batches"] > 1:
        raytf.keras.accumulate_gradients(model, config["micro_batches"])
    raytf.keras.fit(
        model, train, epochs=config["epochs"], validation_data=val,
        steps_per_execution=config["steps_per_execution"],
        callbacks=[
            keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr if epoch < 3 else lr * 0.5),
            keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=False),
            raytf.keras.ReportCallback(),  # reports every epoch, with a checkpoint
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps-per-execution", type=int, default=8)
    parser.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation: parts per batch")
    parser.add_argument("--mixed-precision", choices=["mixed_float16", "mixed_bfloat16"], default=None)
    parser.add_argument("--storage-path", default="~/raytf_results")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(train_mlp)  # the workers cannot import jobs/ modules
    if not ray.is_initialized():
        ray.init()
    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "steps_per_execution": args.steps_per_execution, "micro_batches": args.micro_batches},
        datasets={
            "train": train_mlp.w1_dataset(args.rows).materialize(),
            "val": train_mlp.w1_dataset(4096, offset=10**9).materialize(),
        },
        scaling=raytf.ScalingConfig(num_workers=args.num_workers, cpus_per_worker=1),
        tensorflow=raytf.TensorflowConfig(keras="keras3", mixed_precision=args.mixed_precision),
        run=raytf.RunConfig(name=args.name, storage_path=args.storage_path,
                            checkpoint_config=raytf.CheckpointConfig(num_to_keep=2)),
    ).fit()
    print(json.dumps({"final_metrics": result.metrics, "path": result.path}, indent=1))


if __name__ == "__main__":
    main()

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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags, Ray start-up and W1's data, shared by the jobs)

import raytf  # noqa: E402


# --8<-- [start:train_fn]
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
# --8<-- [end:train_fn]


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=5, batch_size=256)
    p.add_argument("--rows", type=int, default=60_000, help="training rows in all")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps-per-execution", type=int, default=8)
    p.add_argument("--micro-batches", type=int, default=1, help="gradient accumulation: parts per batch")
    p.add_argument("--mixed-precision", choices=["mixed_float16", "mixed_bfloat16"], default=None)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(common)
    # --8<-- [start:fit]
    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "steps_per_execution": args.steps_per_execution, "micro_batches": args.micro_batches},
        datasets={
            "train": common.w1_dataset(args.rows).materialize(),
            "val": common.w1_dataset(4096, offset=10**9).materialize(),
        },
        scaling=common.scaling(args),
        tensorflow=raytf.TensorflowConfig(keras="keras3", mixed_precision=args.mixed_precision),
        run=common.run_config(args, checkpoint_config=raytf.CheckpointConfig(num_to_keep=2)),
    ).fit()
    # --8<-- [end:fit]
    common.print_result(result)

if __name__ == "__main__":
    main()

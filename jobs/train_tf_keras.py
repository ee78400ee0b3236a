"""Train a tf-keras classifier on 2 workers with its own model.fit and print the final metrics.

``TensorflowConfig(keras="tf_keras")`` sets ``TF_USE_LEGACY_KERAS=1`` on every
worker before TensorFlow is imported, so ``tf.keras`` is tf-keras 2 there and
``model.fit`` runs under MultiWorkerMirroredStrategy. Each worker's shard
goes through ``raytf.keras.distribute`` (batches taken as they are: each is
this worker's share of the global batch), ``raytf.keras.restore`` resumes
from the latest checkpoint, and ``raytf.keras.ReportCallback`` reports and
checkpoints every epoch.

    python jobs/train_tf_keras.py
    ray job submit --working-dir . -- python jobs/train_tf_keras.py
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

    keras = tf.keras  # tf-keras 2 here
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
            steps_per_execution=config["steps_per_execution"],
        )
    model.fit(
        raytf.keras.distribute(train.repeat()),
        steps_per_epoch=int(train.cardinality()),  # cached shards know their length
        validation_data=raytf.keras.distribute(val.repeat()),
        validation_steps=int(val.cardinality()),
        epochs=config["epochs"],
        initial_epoch=raytf.keras.restore(model),
        callbacks=[raytf.keras.ReportCallback()],
        verbose=0,
    )
# --8<-- [end:train_fn]


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=5, batch_size=256)
    p.add_argument("--rows", type=int, default=60_000, help="training rows in all")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--steps-per-execution", type=int, default=8)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(common)
    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "steps_per_execution": args.steps_per_execution},
        datasets={
            "train": common.w1_dataset(args.rows).materialize(),
            "val": common.w1_dataset(4096, offset=10**9).materialize(),
        },
        scaling=common.scaling(args),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),
        run=common.run_config(args, checkpoint_config=raytf.CheckpointConfig(num_to_keep=2)),
    ).fit()
    common.print_result(result)

if __name__ == "__main__":
    main()

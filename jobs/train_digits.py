"""Recognise handwritten digits on 2 workers (or --num-workers): real data, no download.

scikit-learn ships its digits dataset (1,797 8x8 grey images of the digits 0 to 9,
from 43 writers) inside the package, so this job trains on real data anywhere,
with no network: ``pip install "raytf[digits]"``. 80% of the images train a
small Keras 3 network with ``raytf.keras.fit`` (each worker its shard), 20% are
held out; the job reaches a validation accuracy of 0.95 or more with the
defaults, reports every epoch with a checkpoint, and resumes from the latest
one when submitted again with the same --name.

    python jobs/train_digits.py
    ray job submit --working-dir jobs -- python train_digits.py --name digits
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags and Ray start-up, shared by the jobs)

import raytf  # noqa: E402

TARGET_ACCURACY = 0.95


def digits():
    """(train, validation) Ray Datasets of scikit-learn's bundled digits: x (64 floats in 0..1), y."""
    import numpy as np
    import ray
    from sklearn.datasets import load_digits

    images = load_digits()
    x = (images.data / 16.0).astype("float32")
    y = images.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(x))
    cut = int(0.8 * len(x))

    def rows(index):
        return ray.data.from_items([{"x": x[i], "y": y[i]} for i in index])

    return rows(order[:cut]), rows(order[cut:])


def train_fn(config: dict) -> None:
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    train = raytf.get_dataset_shard("train", global_batch_size=config["batch_size"], features="x", label="y",
                                    shuffle=True, seed=0)
    val = raytf.get_dataset_shard("val", batch_size=128, features="x", label="y")
    with raytf.strategy().scope():
        model = keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dropout(0.1),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(config["lr"]),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    raytf.keras.fit(model, train, epochs=config["epochs"], validation_data=val,
                    callbacks=[raytf.keras.ReportCallback()])  # resumes from the run's checkpoint


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=30, batch_size=64)
    p.add_argument("--lr", type=float, default=3e-3)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(common)
    train, val = digits()
    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        datasets={"train": train.materialize(), "val": val.materialize()},
        data_config=raytf.DataConfig(datasets_to_split=["train"]),  # every worker scores all of val
        scaling=common.scaling(args),
        tensorflow=raytf.TensorflowConfig(keras="keras3"),
        run=common.run_config(args, checkpoint_config=raytf.CheckpointConfig(
            num_to_keep=2, score_attribute="val_accuracy")),
    ).fit()
    common.print_result(result)
    accuracy = result.metrics.get("val_accuracy", 0.0)
    print(f"validation accuracy {accuracy:.3f} (target {TARGET_ACCURACY})")


if __name__ == "__main__":
    main()

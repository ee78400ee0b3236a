"""Train a classifier from Parquet or CSV files with raytf, reading them through Ray Data.

    python jobs/train_files.py --data /path/to/parquet_dir --features x --label y
    python jobs/train_files.py --data table.csv --features f0,f1,f2 --label y

With no --data, the job first writes a small generated Parquet dataset (a
784-float tensor column "x" and an int64 label "y") to a temporary directory,
so it runs anywhere. Features may be one tensor column or several scalar
columns; labels must be integer class ids.
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags and Ray start-up, shared by the jobs)

import raytf  # noqa: E402


def write_demo_parquet(directory: str, files: int = 4, rows: int = 4096, dim: int = 784) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    w = np.random.default_rng(0).standard_normal((dim, 10)).astype("float32")
    for i in range(files):
        x = np.random.default_rng(i + 1).standard_normal((rows, dim)).astype("float32")
        pq.write_table(
            pa.table({
                "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim),
                "y": pa.array(np.argmax(x @ w, axis=1).astype("int64")),
            }),
            os.path.join(directory, f"part-{i:03d}.parquet"),
        )


def train_fn(config: dict) -> None:
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    features = config["features"]
    batch = config["batch_size"] // ctx.world_size
    data = raytf.get_dataset_shard(
        "train", batch_size=batch, features=features if len(features) > 1 else features[0],
        label=config["label"], shuffle=True, seed=0, drop_remainder=True,
    )

    def as_matrix(x):  # several scalar columns arrive as a dict of tensors
        if isinstance(x, dict):
            return tf.stack([tf.cast(x[c], tf.float32) for c in features], axis=1)
        return tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])

    data = data.map(lambda x, y: (as_matrix(x), y))
    dim = int(data.element_spec[0].shape[-1])
    distributed = strategy.distribute_datasets_from_function(lambda _: data)
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((dim,)), tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(config["classes"]),
        ])
        optimizer = tf.keras.optimizers.Adam(config["lr"])
        optimizer.build(model.trainable_variables)
    start = 0
    if (resumed := raytf.get_checkpoint()) is not None:
        resumed.restore_state(model=model, optimizer=optimizer)
        start = resumed.epoch + 1
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(inputs):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                                  global_batch_size=batch * ctx.world_size)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=inputs), axis=None)

    for epoch in range(start, config["epochs"]):
        losses = [float(train_step(inputs)) for inputs in distributed]
        raytf.report({"epoch": epoch, "step": int(optimizer.iterations.numpy()),
                      "loss": sum(losses) / len(losses), "steps": len(losses)},
                     checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer))


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=3, batch_size=256)
    p.add_argument("--data", help="a Parquet file or directory, or a .csv file (default: generated)")
    p.add_argument("--features", default="x", help="comma-separated feature columns")
    p.add_argument("--label", default="y")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    import ray

    common.connect()
    with tempfile.TemporaryDirectory() as scratch:
        path = args.data
        if path is None:
            path = scratch
            write_demo_parquet(path)
        read = ray.data.read_csv if path.endswith(".csv") else ray.data.read_parquet
        data = read(path).materialize()  # read while every CPU is free
        result = raytf.Trainer(
            train_fn,
            config={"features": args.features.split(","), "label": args.label, "classes": args.classes,
                    "epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
            datasets={"train": data},
            scaling=common.scaling(args),
            run=common.run_config(args),
        ).fit()
    common.print_result(result)


if __name__ == "__main__":
    main()

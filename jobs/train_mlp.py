"""Train an MLP classifier on 2 workers with raytf and print the final metrics.

The data is generated, so the job needs no download: W1 of raytf's benchmarks,
784 standard-normal features and a label that is the argmax of a fixed random
projection, built as a Ray Dataset. Each worker gets its shard of it as a
tf.data.Dataset, and the model trains with a custom loop under
MultiWorkerMirroredStrategy, which works with Keras 3.

Run it anywhere Ray runs:

    python jobs/train_mlp.py                      # starts a local Ray
    RAY_ADDRESS=auto python jobs/train_mlp.py     # on a running cluster
    ray job submit --working-dir . -- python jobs/train_mlp.py
"""

from __future__ import annotations

import argparse
import json
import time

import raytf


def w1_block(batch: dict, offset: int = 0) -> dict:
    """W1 rows: x ~ N(0, 1) in 784 dimensions, seeded by the block's first row id;
    y = argmax(x @ W), W fixed by seed 0."""
    import numpy as np

    ids = batch["id"] + offset
    w = np.random.default_rng(0).standard_normal((784, 10)).astype("float32")
    x = np.random.default_rng(int(ids[0])).standard_normal((len(ids), 784)).astype("float32")
    return {"x": x, "y": np.argmax(x @ w, axis=1).astype("int64")}


def w1_dataset(rows: int, offset: int = 0):
    import ray

    return ray.data.range(rows, override_num_blocks=16).map_batches(
        w1_block, batch_size=None, fn_kwargs={"offset": offset}
    )


def train_fn(config: dict) -> None:
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    global_batch = config["batch_size"]
    per_worker = global_batch // ctx.world_size

    train = raytf.get_dataset_shard(
        "train", batch_size=per_worker, features="x", label="y", shuffle=True, seed=0,
        drop_remainder=True,
    )
    val = raytf.get_dataset_shard("val", batch_size=1024, features="x", label="y")
    # Each worker's batches are its own: distribute them as they are. (Through
    # experimental_distribute_dataset each would count as a global batch, and
    # each worker would train on only its slice of it.)
    dist_train = strategy.distribute_datasets_from_function(lambda _: train)

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((784,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        optimizer = tf.keras.optimizers.Adam(config["lr"])
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )

    @tf.function
    def train_step(batch):
        def step(features, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(features, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        losses = strategy.run(step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    for epoch in range(config["epochs"]):
        start = time.perf_counter()
        total, steps = 0.0, 0
        for batch in dist_train:
            total += float(train_step(batch))
            steps += 1
        seconds = time.perf_counter() - start
        correct = rows = 0
        for x_val, y_val in val:  # 'val' is not split: every worker scores all of it
            logits = model(x_val, training=False)
            correct += int(tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y_val, tf.int32)))
            rows += int(y_val.shape[0])
        accuracy = correct / rows
        raytf.report(
            {
                "epoch": epoch,
                "loss": total / steps,
                "val_accuracy": accuracy,
                "samples_per_s": steps * global_batch / seconds,
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=60_000, help="training rows in all")
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--storage-path", default="~/raytf_results")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    import ray

    if not ray.is_initialized():
        ray.init()  # RAY_ADDRESS (set by `ray job submit`) or a new local Ray

    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        # Materialized up front, while every CPU is free: the workers take them all here.
        datasets={
            "train": w1_dataset(args.rows).materialize(),
            "val": w1_dataset(4096, offset=10**9).materialize(),
        },
        data_config=raytf.DataConfig(datasets_to_split=["train"]),
        scaling=raytf.ScalingConfig(num_workers=args.num_workers, cpus_per_worker=1),
        run=raytf.RunConfig(name=args.name, storage_path=args.storage_path),
    ).fit()
    print(json.dumps({"final_metrics": result.metrics, "path": result.path}, indent=1))


if __name__ == "__main__":
    main()

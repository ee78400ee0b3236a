"""Train an MLP classifier on 2 workers with raytf and print the final metrics.

The data is generated, so the job needs no download: 784 standard-normal
features and a label that is the argmax of a fixed random projection (the
benchmark workload W1 of raytf's design, smaller). Each worker builds its own
shard from its rank, and the model trains with a custom loop under
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


def make_data(rows: int, seed: int):
    """W1 rows: x ~ N(0, 1) in 784 dimensions, y = argmax(x @ W), W fixed by seed 0."""
    import numpy as np

    w = np.random.default_rng(0).standard_normal((784, 10)).astype("float32")
    x = np.random.default_rng(seed).standard_normal((rows, 784)).astype("float32")
    y = np.argmax(x @ w, axis=1).astype("int64")
    return x, y


def train_fn(config: dict) -> None:
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    global_batch = config["batch_size"]
    per_worker = global_batch // ctx.world_size

    x, y = make_data(config["rows_per_worker"], seed=1000 + ctx.world_rank)
    x_val, y_val = make_data(2048, seed=7)
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=ctx.world_rank)
    train = train.batch(per_worker, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
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
        logits = model(x_val, training=False)
        accuracy = float(tf.reduce_mean(tf.cast(tf.argmax(logits, 1) == y_val, tf.float32)))
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
    parser.add_argument("--rows-per-worker", type=int, default=30_000)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch size")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--storage-path", default="~/raytf_results")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()

    result = raytf.Trainer(
        train_fn,
        config={
            "epochs": args.epochs,
            "rows_per_worker": args.rows_per_worker,
            "batch_size": args.batch_size,
            "lr": args.lr,
        },
        scaling=raytf.ScalingConfig(num_workers=args.num_workers, cpus_per_worker=1),
        run=raytf.RunConfig(name=args.name, storage_path=args.storage_path),
    ).fit()
    print(json.dumps({"final_metrics": result.metrics, "path": result.path}, indent=1))


if __name__ == "__main__":
    main()

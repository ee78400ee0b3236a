"""Train an MLP classifier on 2 workers (or --num-workers) with raytf and print the final metrics.

The data is generated, so the job needs no download: W1 of raytf's benchmarks,
784 standard-normal features and a label that is the argmax of a fixed random
projection, built as a Ray Dataset. Each worker gets its shard of it as a
tf.data.Dataset, and the model trains with a custom loop under
MultiWorkerMirroredStrategy, which works with Keras 3.

Run it anywhere Ray runs:

    python jobs/train_mlp.py                      # starts a local Ray
    RAY_ADDRESS=auto python jobs/train_mlp.py     # on a running cluster
    ray job submit --working-dir jobs -- python train_mlp.py --num-workers 4 --gpus-per-worker 1
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags, Ray start-up and W1's data, shared by the jobs)

import raytf  # noqa: E402


# --8<-- [start:start]
def train_fn(config: dict) -> None:
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    global_batch = config["batch_size"]
    per_worker = global_batch // ctx.world_size
# --8<-- [end:start]

    # --8<-- [start:data]
    train = raytf.get_dataset_shard(
        "train", batch_size=per_worker, features="x", label="y", shuffle=True, seed=0,
        drop_remainder=True,
    )
    val = raytf.get_dataset_shard("val", batch_size=1024, features="x", label="y")
    # Each worker's batches are its own: distribute them as they are.
    dist_train = strategy.distribute_datasets_from_function(lambda _: train)
    # --8<-- [end:data]

    # --8<-- [start:model]
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((784,)),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(10),
            ]
        )
        optimizer = tf.keras.optimizers.Adam(config["lr"])
        optimizer.build(model.trainable_variables)  # its slots exist before a restore fills them
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"
        )
    # --8<-- [end:model]
    # --8<-- [start:resume]
    start = 0
    resumed = raytf.get_checkpoint()  # None on a fresh start
    if resumed is not None:
        resumed.restore_state(model=model, optimizer=optimizer)
        start = resumed.epoch + 1
    # --8<-- [end:resume]

    # --8<-- [start:step]
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
    # --8<-- [end:step]

    # --8<-- [start:loop]
    for epoch in range(start, config["epochs"]):
        start = time.perf_counter()
        total, steps = 0.0, 0
        for batch in dist_train:
            total += float(train_step(batch))
            steps += 1
    # --8<-- [end:loop]
        seconds = time.perf_counter() - start
        correct = rows = 0
        for x_val, y_val in val:  # 'val' is not split: every worker scores all of it
            logits = model(x_val, training=False)
            correct += int(tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y_val, tf.int32)))
            rows += int(y_val.shape[0])
        accuracy = correct / rows
        # --8<-- [start:report]
        raytf.report(
            {
                "epoch": epoch,
                "step": int(optimizer.iterations.numpy()),
                "loss": total / steps,
                "val_accuracy": accuracy,
                "samples_per_s": steps * global_batch / seconds,
            },
            checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer),
        )
        # --8<-- [end:report]


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=5, batch_size=256)
    p.add_argument("--rows", type=int, default=60_000, help="training rows in all")
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    # --8<-- [start:fit]
    common.connect(common)
    result = raytf.Trainer(
        train_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr},
        # Materialized up front, while every CPU is free: the workers may take them all.
        datasets={
            "train": common.w1_dataset(args.rows).materialize(),
            "val": common.w1_dataset(4096, offset=10**9).materialize(),
        },
        data_config=raytf.DataConfig(datasets_to_split=["train"]),
        scaling=common.scaling(args),
        run=common.run_config(args),
    ).fit()
    common.print_result(result)
    # --8<-- [end:fit]


if __name__ == "__main__":
    main()

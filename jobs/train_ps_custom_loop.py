"""Parameter-server training of W1's MLP with a Keras 3 custom loop: the coordinator's schedule and join.

One chief runs this train_fn with ParameterServerStrategy; --num-workers
workers compute, each on its own piece of the Ray Dataset; --num-ps
parameter servers hold the variables; an evaluator scores every committed
checkpoint on held-out rows, and its metrics join the run's history. Kill a
worker while it runs: the coordinator reruns its steps on the others and raytf
replaces it in place, with no restart.

    python jobs/train_ps_custom_loop.py                    # starts a local Ray
    ray job submit --working-dir jobs -- python train_ps_custom_loop.py --num-workers 8 --num-ps 2
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags, Ray start-up and W1's data, shared by the jobs)

import raytf  # noqa: E402


def build_model():
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                                tf.keras.layers.Dense(10)])


# --8<-- [start:train_fn]
def train_fn(config: dict) -> None:
    import tensorflow as tf

    strategy = raytf.strategy()  # ParameterServerStrategy, connected to every worker and ps
    coordinator = raytf.coordinator()  # tf.distribute.coordinator.ClusterCoordinator(strategy) is the same
    # Each worker reads its own piece of "train"; the pipeline runs on the workers.
    shard = raytf.get_dataset_shard("train", batch_size=config["batch_size"], features="x", label="y",
                                    shuffle=True, seed=0)
    iterator = iter(coordinator.create_per_worker_dataset(shard))
    with strategy.scope():
        model = build_model()
        optimizer = tf.keras.optimizers.Adam(config["lr"])
        optimizer.build(model.trainable_variables)
        steps_done = tf.Variable(0, dtype=tf.int64)  # counted on the ps; exact under asynchronous updates
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(iterator):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            steps_done.assign_add(1)
            return loss

        return strategy.run(step, args=next(iterator))

    start = 0
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        resumed.restore_state(model=model, optimizer=optimizer, steps_done=steps_done)
        start = resumed.epoch + 1
    for epoch in range(start, config["epochs"]):
        began = time.perf_counter()
        losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(config["steps_per_epoch"])]
        coordinator.join()  # every scheduled step ran, on whichever workers were alive
        seconds = time.perf_counter() - began
        raytf.report(
            {"epoch": epoch, "step": int(steps_done.numpy()), "loss": sum(float(v.fetch()) for v in losses) / len(losses),
             "samples_per_s": config["steps_per_epoch"] * config["batch_size"] / seconds},
            checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer, steps_done=steps_done),
        )
# --8<-- [end:train_fn]


def evaluate_fn(checkpoint: raytf.Checkpoint, config: dict) -> dict:
    """Run by the evaluator on each committed checkpoint."""
    import numpy as np
    import tensorflow as tf

    model = build_model()
    optimizer = tf.keras.optimizers.Adam(config["lr"])
    optimizer.build(model.trainable_variables)
    checkpoint.restore_state(model=model, optimizer=optimizer, steps_done=tf.Variable(0, dtype=tf.int64))
    held_out = common.w1_block({"id": np.arange(10**9, 10**9 + 4096)})
    logits = model(held_out["x"])
    return {"val_accuracy": float(np.mean(np.argmax(logits, 1) == held_out["y"]))}


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=3, batch_size=128, cpus_per_worker=0.5)
    common.parameter_server_flags(p)
    p.add_argument("--rows", type=int, default=30_000, help="training rows in all")
    p.add_argument("--steps-per-epoch", type=int, default=200, help="steps, each one worker's batch")
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(common)
    result = raytf.ParameterServerTrainer(
        train_fn, evaluate_fn=evaluate_fn,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "steps_per_epoch": args.steps_per_epoch},
        datasets={"train": common.w1_dataset(args.rows)},
        scaling=common.parameter_server_scaling(args, evaluators=1),
        run=common.run_config(args),
    ).fit()
    common.print_result(result)


if __name__ == "__main__":
    main()

"""A custom training loop with checkpoints, preemption checks and an elastic group.

The guides on checkpoints, failures and elastic groups quote this file;
``tests/integration/test_docs_examples.py`` runs it.

    python docs/examples/custom_loop.py
"""

from __future__ import annotations

import ray

import raytf


# --8<-- [start:train_fn]
def train_fn(config: dict) -> None:
    import tensorflow as tf

    strategy = raytf.strategy()
    shard = raytf.get_dataset_shard("train", global_batch_size=config["global_batch"],
                                    features="x", label="y", shuffle=True, seed=0)
    batches = strategy.distribute_datasets_from_function(lambda _: shard)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.Adam(1e-2)
        optimizer.build(model.trainable_variables)  # its slots exist before a restore fills them
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    first_epoch = 0
    if (resumed := raytf.get_checkpoint()) is not None:  # None on a fresh start
        resumed.restore_state(model=model, optimizer=optimizer)
        first_epoch = resumed.epoch + 1  # the epoch after the last completed one

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                per_row = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_row, global_batch_size=config["global_batch"])
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=(x, y)), axis=None)

    for epoch in range(first_epoch, config["epochs"]):
        losses = []
        for x, y in batches:  # after a mid-epoch checkpoint, the rest of that epoch
            losses.append(float(train_step(x, y)))
            step = int(optimizer.iterations.numpy())
            if step % 20 == 0 and raytf.preemption_requested():  # on every rank at the same steps
                raytf.report({"epoch": epoch - 1, "step": step},
                             checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer))
                return  # raytf restarts the group from this checkpoint
        raytf.report({"epoch": epoch, "step": int(optimizer.iterations.numpy()),
                      "loss": sum(losses) / len(losses)},
                     checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer))
# --8<-- [end:train_fn]


def rows(batch: dict) -> dict:
    """8 features from each row's id, and a label of 2 classes that depends on them."""
    import numpy as np

    x = np.random.default_rng(int(batch["id"][0])).standard_normal((len(batch["id"]), 8)).astype("float32")
    return {"x": x, "y": (x[:, 0] + x[:, 1] > 0).astype("int64")}


def main(storage_path: str = "~/raytf_results", min_workers: int = 2, max_workers: int = 4, epochs: int = 5,
         num_rows: int = 20_000) -> raytf.Result:
    # --8<-- [start:fit]
    data = ray.data.range(num_rows).map_batches(rows, batch_size=None)
    result = raytf.Trainer(
        train_fn,
        config={"epochs": epochs, "global_batch": 64},
        datasets={"train": data},
        scaling=raytf.ScalingConfig(num_workers=(min_workers, max_workers), resize_timeout_s=60),
        run=raytf.RunConfig(
            name="custom-loop", storage_path=storage_path,
            failure_config=raytf.FailureConfig(max_failures=3),
            checkpoint_config=raytf.CheckpointConfig(num_to_keep=2, score_attribute="loss", mode="min"),
        ),
    ).fit()
    print(result.metrics["loss"], result.checkpoint.path)
    # --8<-- [end:fit]
    return result


if __name__ == "__main__":
    main()

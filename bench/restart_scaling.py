"""What a restart costs against the number of workers: a real group of N raytf workers loses one.

    python bench/restart_scaling.py [--workers 2,4,8] [--cpus 2]

For each N, on a local Ray of ``--cpus`` CPUs whatever N is (this machine's two cores: N workers
share them, as a node's cores are shared by its workers), a group of N workers
(``cpus_per_worker=cpus/N``, one TensorFlow thread each) trains a small tf-keras model in a custom
loop on its shard,
checkpointing every 20 steps, until rank 1 exits at step 30 (``os._exit``, a crash); the group
restarts from the step-20 checkpoint, once with the default ``FailureConfig`` (the N-1 ranks that
outlived the attempt kept in their processes, ``keep_survivors``: ``"restart": "kept"``) and once
with ``keep_survivors=False`` (every rank a new process: ``"cold"``). One JSON line per N and way:

- ``kill_to_first_step_s``: from the kill (rank 1's clock) to the retry's first step (rank 0's);
- ``components_s``: ``detect``, from the kill to the driver hearing of it (the failure's time in
  ``result.failures``), then the retry's own start-up as ``result.startup`` records it (placement,
  actors, loading: importing TensorFlow and ``train_fn``, connect, first step, as the driver saw
  them); what is left of the total is the driver deciding and the old group stopping;
- ``first_start_s``: the first attempt's start-up, the same parts, for comparison;
- ``kept_processes``: how many of the retry's ranks were the first attempt's processes.

What grows with N on one machine, cold, is the loading (N processes import TensorFlow at once on
the same cores) and the first step; the driver's own parts (detect, stop, placement) should not,
and with the survivors kept the loading is one process's, whatever N.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

KILL_STEP, CHECKPOINT_EVERY, ROWS = 30, 20, 16_384


def _train(config):
    import tensorflow as tf

    import raytf

    context = raytf.get_context()
    marks = config["marks"]
    dataset = raytf.get_dataset_shard("train", batch_size=32, features="x", label="y", drop_remainder=True)
    with raytf.strategy().scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.01)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = raytf.get_checkpoint()
    if checkpoint is not None:
        checkpoint.restore_state(model=model, optimizer=optimizer, step=step)
    strategy = raytf.strategy()

    @tf.function
    def train_step(batch):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(x)[:, 0] - y), global_batch_size=32 * context.world_size)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

    first = True
    for batch in strategy.experimental_distribute_dataset(dataset.repeat()):
        train_step(batch)
        step.assign_add(1)
        now = int(step.numpy())
        if first and context.world_rank == 0:
            with open(os.path.join(marks, f"first_step_{context.attempt}"), "w") as out:
                out.write(str(time.time()))
        first = False
        if context.attempt == 0 and context.world_rank == 1 and now == KILL_STEP:
            with open(os.path.join(marks, "killed"), "w") as out:
                out.write(str(time.time()))
            os._exit(1)
        if now % CHECKPOINT_EVERY == 0:
            raytf.report({"step": now}, checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer,
                                                                             step=step))
        if now >= KILL_STEP + 10:
            return


def measure(workers: int, cpus: float, workdir: str, keep: bool) -> dict:
    import numpy as np
    import ray

    import raytf

    marks = tempfile.mkdtemp(dir=workdir)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 32)).astype("float32")
    dataset = ray.data.from_numpy(x).map_batches(lambda b: {"x": b["data"], "y": b["data"].sum(axis=1)})
    result = raytf.Trainer(
        _train,
        config={"marks": marks},
        datasets={"train": dataset.materialize()},
        scaling=raytf.ScalingConfig(num_workers=workers, cpus_per_worker=cpus / workers),
        run=raytf.RunConfig(name=f"restart-{workers}-{'kept' if keep else 'cold'}", storage_path=workdir, verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=1, keep_survivors="auto" if keep else False)),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras", intra_op_threads=1, inter_op_threads=1),
    ).fit()

    def read(name: str) -> float:
        with open(os.path.join(marks, name)) as f:
            return float(f.read())

    killed, resumed = read("killed"), read("first_step_1")
    retry = {k: v for k, v in result.startup[1].items() if isinstance(v, float) and k != "total"}
    return {
        "workers": workers,
        "restart": "kept" if keep else "cold",
        "cpus": cpus,
        "attempts": result.attempts,
        "kill_to_first_step_s": round(resumed - killed, 2),
        # The driver's record of the loss is dated when it heard of it (both clocks are this machine's).
        "components_s": {"detect": round(result.failures[0].time - killed, 2), **retry},
        "retry_restored_from": result.startup[1].get("restored_from"),
        "first_start_s": result.startup[0],
        "kept_processes": result.startup[1].get("kept_processes", 0),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4,8")
    parser.add_argument("--cpus", type=float, default=2.0)
    args = parser.parse_args(argv)
    import ray

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for n in (int(v) for v in args.workers.split(",")):
            for keep in (False, True):
                results.append(measure(n, args.cpus, workdir, keep))
                print(json.dumps(results[-1]), flush=True)
    print(json.dumps({"summary": {"workers": [r["workers"] for r in results],
                                  "restart": [r["restart"] for r in results],
                                  "kill_to_first_step_s": [r["kill_to_first_step_s"] for r in results]}}))


if __name__ == "__main__":
    main()

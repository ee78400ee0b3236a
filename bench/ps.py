"""Parameter-server training against MultiWorkerMirroredStrategy on W1, in one invocation.

    python bench/ps.py [--steps-per-execution 8] [--repeats 3]

Both train W1 (bench/w1.py: the MLP, Adam, tf-keras ``model.fit``, 2 workers
of 1 CPU, 128 rows per worker batch) on raytf; the parameter-server run adds
one ps and the chief (half a CPU each). Prints one JSON line per run and a
summary:

- ``samples_per_s`` of the last epoch, each system, and ``ps/mwms``;
- recovery from a worker killed mid-run (SIGKILL to its process):
  ``ps.first_step_after_kill_s``, the time from the kill to the next step the
  parameter-server chief saw complete (the other worker goes on; raytf
  replaces the dead one in place), ``ps.replaced_s``, when the replacement's
  TensorFlow server served again, and ``ps.attempts``; against
  ``mwms.resume_s`` from bench/recovery.py's measurement of raytf's Trainer
  (the whole group restarts from the last checkpoint).

``--repeats N`` makes every run N times, round by round (each round in a run directory of its
own, so that no run resumes another), every line saying its ``repeat`` and whether it had a
``fault``; each round ends with its summary.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import recovery  # noqa: E402
import throughput  # noqa: E402
import w1  # noqa: E402

CHUNK = 10  # steps the recovery run schedules between timestamps


def _ps_fit_train(config):
    import tensorflow as tf

    import raytf

    keras = tf.keras  # tf-keras (TF_USE_LEGACY_KERAS=1, as for every W1 system)
    shard = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y",
                                    shuffle=True, seed=0)

    class EpochTimer(keras.callbacks.Callback):  # epoch hooks only: tf-keras allows no batch hooks here
        def on_train_begin(self, logs=None):
            self.epochs = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(time.perf_counter() - self.start)

    strategy = raytf.strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((w1.DIM,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(w1.CLASSES)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=w1.STEPS_PER_EXECUTION)
    steps = w1.ROWS // w1.WORKER_BATCH  # every row once per epoch, one worker batch per step
    timer = EpochTimer()
    history = model.fit(shard, epochs=w1.EPOCHS, steps_per_epoch=steps, verbose=0, callbacks=[timer])
    raytf.report({"last_epoch_s": timer.epochs[-1], "steps_per_epoch": steps,
                  "samples_per_s": steps * w1.WORKER_BATCH / timer.epochs[-1],
                  "loss": float(history.history["loss"][-1])})


def _ps_recovery_train(config):
    import tensorflow as tf

    import raytf

    keras = tf.keras
    strategy, coordinator = raytf.strategy(), raytf.coordinator()
    shard = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y", shuffle=True)
    iterator = iter(coordinator.create_per_worker_dataset(shard))
    with strategy.scope():
        model = keras.Sequential([keras.Input((w1.DIM,)), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(w1.CLASSES)])
        optimizer = keras.optimizers.Adam(1e-3)
        done = tf.Variable(0, dtype=tf.int64)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            done.assign_add(1)

        strategy.run(replica, args=next(iterator))

    finished = []
    for chunk in range(config["chunks"]):
        for _ in range(CHUNK):
            coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        finished.append(time.time())
        if chunk == config["kill_after_chunk"]:
            with open(config["mark"], "w") as f:
                f.write("1")
    raytf.report({"finished": finished, "steps": int(done.numpy()), "scheduled": config["chunks"] * CHUNK})


def _ps_trainer(train_fn, dataset, workdir, name, config=None):
    import raytf

    return raytf.ParameterServerTrainer(
        train_fn, config=config or {}, datasets={"train": dataset},
        scaling=raytf.ParameterServerScaling(num_workers=w1.WORKERS, num_ps=1, cpus_per_worker=1,
                                             cpus_per_ps=0.5, cpus_per_chief=0.5),
        run=raytf.RunConfig(name=name, storage_path=workdir, verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=1)),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),
    )


def run_ps(dataset, workdir: str) -> dict:
    start = time.perf_counter()
    result = _ps_trainer(_ps_fit_train, dataset, workdir, "bench-ps").fit()
    return {**result.metrics, "fit_wall_s": time.perf_counter() - start}


def _pid_of(name: str) -> int:
    from ray.util.state import list_actors

    found = list_actors(filters=[("name", "=", name), ("state", "=", "ALIVE")])
    return found[0].pid


def run_ps_recovery(dataset, workdir: str) -> dict:
    import ray

    mark = os.path.join(workdir, "ps-kill-mark")
    config = {"chunks": 300, "kill_after_chunk": 20, "mark": mark}  # long enough for the replacement to serve
    killed: dict = {}

    def kill_worker():
        while not os.path.exists(mark):
            time.sleep(0.05)
        try:
            pid = _pid_of("raytf:bench-ps-recovery:0:worker-1")
        except Exception as error:  # noqa: BLE001 - reported in the output, not lost in a thread
            killed["error"] = repr(error)
            return
        killed["time"] = time.time()
        os.kill(pid, signal.SIGKILL)
        while True:  # the replacement serving again: its TensorFlow server up, the phase "training"
            try:
                replacement = ray.get_actor("raytf:bench-ps-recovery:0:worker-1:1")
                if str(ray.get(replacement.poll.remote(), timeout=5).phase) == "training":
                    killed["replaced"] = time.time()
                    return
            except ValueError:
                pass  # not created yet
            time.sleep(0.1)

    thread = threading.Thread(target=kill_worker, daemon=True)
    thread.start()
    result = _ps_trainer(_ps_recovery_train, dataset, workdir, "bench-ps-recovery", config).fit()
    thread.join(timeout=30)
    if "time" not in killed:
        raise RuntimeError(f"the recovery run's worker was not killed: {killed.get('error', 'the run ended first')}")
    finished = result.metrics["finished"]
    gaps = [b - a for a, b in zip(finished, finished[1:])]
    after = [t for t in finished if t > killed["time"]]
    return {
        "attempts": result.attempts, "steps": result.metrics["steps"], "scheduled": result.metrics["scheduled"],
        "chunk_s_median": round(sorted(gaps)[len(gaps) // 2], 3),
        "first_step_after_kill_s": round(after[0] - killed["time"], 2) if after else None,
        "replaced_s": round(killed["replaced"] - killed["time"], 2) if "replaced" in killed else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="every run this many times, round by round")
    args = parser.parse_args()
    os.environ["W1_STEPS_PER_EXECUTION"] = str(args.steps_per_execution)
    w1.STEPS_PER_EXECUTION = args.steps_per_execution

    import ray
    from ray import cloudpickle

    for module in (w1, throughput, recovery, sys.modules[__name__]):
        cloudpickle.register_pickle_by_value(module)
    # The dashboard serves Ray's state API, which finds the worker process the recovery run kills.
    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": w1.WORKER_ENV}, log_to_driver=False,
             include_dashboard=True)
    dataset = w1.ray_dataset()
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            workdir = os.path.join(root, f"round-{repeat}")
            os.makedirs(workdir)
            round_ = {"repeat": repeat} if args.repeats > 1 else {}
            mwms = throughput.run_raytf(dataset, workdir)
            print(json.dumps({**round_, "system": "mwms", "fault": False, **mwms}), flush=True)
            ps = run_ps(dataset, workdir)
            print(json.dumps({**round_, "system": "ps", "fault": False, **ps}), flush=True)
            ps_recovery = run_ps_recovery(dataset, workdir)
            print(json.dumps({**round_, "system": "ps", "fault": True, **ps_recovery}), flush=True)
            mwms_recovery = recovery.measure("raytf", dataset, workdir, recovery.KILL_STEP)
            print(json.dumps({**round_, **mwms_recovery, "system": "mwms"}), flush=True)
            print(json.dumps({**round_, "summary": {
                "samples_per_s": {"mwms": round(mwms["samples_per_s"]), "ps": round(ps["samples_per_s"])},
                "ps/mwms": round(ps["samples_per_s"] / mwms["samples_per_s"], 3),
                "recovery": {
                    "ps": {k: ps_recovery[k] for k in ("first_step_after_kill_s", "replaced_s", "attempts",
                                                       "chunk_s_median")},
                    "mwms": {"resume_s": mwms_recovery.get("resume_s"), "attempts": mwms_recovery.get("retries", 0) + 1,
                             "steps_redone": mwms_recovery.get("steps_redone")},
                },
            }}), flush=True)


if __name__ == "__main__":
    main()

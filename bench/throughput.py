"""W1 training throughput: raytf against Ray Train's TensorflowTrainer and plain
MultiWorkerMirroredStrategy, in one invocation on one machine.

    python bench/throughput.py [--systems raytf,ray_train,plain_mwms] [--repeats 1] [--steps-per-execution 1]

Prints one JSON line per system and run (samples/s of the last epoch, fit()
wall time) and a final line of ratios of the medians. Targets on the 2-CPU
development machine: raytf >= 0.95x plain MWMS and >= 3x Ray Train.

``raytf_keras3`` is raytf's Keras 3 path (``raytf.keras.fit``) on the same shards.
``ray_train`` trains exactly as the others do (global batch 256). ``ray_train_as_documented``
passes ``to_tf`` to model.fit directly, as Ray's examples do; MultiWorkerMirroredStrategy
then splits each batch in two, so it trains at global batch 128 with twice the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402


def run_plain_mwms(dataset, workdir: str, workload: str = "w1") -> dict:
    """Two local processes, TF_CONFIG by hand, each with its half of ``dataset``'s rows in memory
    (``workload``: the bench module defining it, "w1" or "w2"; ``dataset`` None: the workload
    makes its rows itself)."""
    import numpy as np

    arrays = {} if dataset is None else {
        k: np.concatenate([b[k] for b in dataset.iter_batches(batch_size=None, batch_format="numpy")])
        for k in ("x", "y")}
    half = len(arrays["y"]) // w1.WORKERS if arrays else 0
    ports = []
    for _ in range(w1.WORKERS):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    workers = [f"127.0.0.1:{p}" for p in ports]
    start = time.perf_counter()
    processes, outputs = [], []
    for rank in range(w1.WORKERS):
        data_path = "-"
        if arrays:
            data_path = os.path.join(workdir, f"plain{rank}.npz")
            rows = slice(rank * half, (rank + 1) * half)
            np.savez(data_path, x=arrays["x"][rows], y=arrays["y"][rows])
        out = os.path.join(workdir, f"plain{rank}.json")
        outputs.append(out)
        tf_config = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
        processes.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_plain_worker.py"), str(rank), tf_config, data_path, out,
             workload],
            env={**os.environ, **w1.WORKER_ENV, **w1.plain_worker_gpus(rank)},
        ))
    for p in processes:
        if p.wait() != 0:
            raise RuntimeError(f"a plain MWMS worker exited with {p.returncode}")
    wall = time.perf_counter() - start
    with open(outputs[0]) as f:
        return {**json.load(f), "fit_wall_s": wall}


def _raytf_train(config):
    import raytf

    dataset = raytf.get_dataset_shard(
        "train", batch_size=w1.WORKER_BATCH, features="x", label="y", drop_remainder=True
    )
    raytf.report(w1.fit(dataset, raytf.strategy()))


def _fit_raytf(train_fn, dataset, workdir: str, keras: str) -> dict:
    import raytf

    start = time.perf_counter()
    result = raytf.Trainer(
        train_fn,
        datasets={"train": dataset},
        scaling=w1.raytf_scaling(),
        run=raytf.RunConfig(name=f"bench-raytf-{keras}", storage_path=workdir, verbose=0),
        tensorflow=raytf.TensorflowConfig(communication=w1.communication(), keras=keras),
    ).fit()
    return {**result.metrics, "fit_wall_s": time.perf_counter() - start}


def run_raytf(dataset, workdir: str) -> dict:
    """raytf with tf-keras's model.fit, as every other system trains."""
    return _fit_raytf(_raytf_train, dataset, workdir, "tf_keras")


def _raytf_keras3_train(config):
    import tensorflow as tf

    import raytf
    import raytf.keras

    keras = tf.keras  # Keras 3 on these workers

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds, self.loss = time.perf_counter() - self.start, float(logs["loss"])

    dataset = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y",
                                      drop_remainder=True)
    with raytf.strategy().scope():
        model = keras.Sequential(
            [keras.Input((w1.DIM,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(w1.CLASSES)]
        )
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = EpochTimer()
    raytf.keras.fit(model, dataset, epochs=w1.EPOCHS, callbacks=[timer],
                    steps_per_execution=w1.STEPS_PER_EXECUTION)
    raytf.report({
        "last_epoch_s": timer.seconds,
        "samples_per_s": w1.WORKERS * w1.STEPS_PER_EPOCH * w1.WORKER_BATCH / timer.seconds,
        "loss": timer.loss,
    })


def run_raytf_keras3(dataset, workdir: str) -> dict:
    """raytf's Keras 3 path: raytf.keras.fit on the same shards, model and batch."""
    return _fit_raytf(_raytf_keras3_train, dataset, workdir, "keras3")


def _ray_train_train(config):
    from ray import train

    strategy = w1.mwms_strategy()
    dataset = train.get_dataset_shard("train").to_tf("x", "y", batch_size=w1.WORKER_BATCH, drop_last=True)
    # model.fit cannot run several steps per call on data of unknown length: the documented way runs one.
    outcome = w1.fit(dataset, strategy, distribute=config["distribute"],
                     steps_per_execution=None if config["distribute"] else 1)
    if train.get_context().get_world_rank() == 0:
        # Ray Train 2 keeps in Result only the metrics reported with a checkpoint.
        with open(config["out"], "w") as f:
            json.dump(outcome, f)


def run_ray_train(dataset, workdir: str, distribute: bool = True) -> dict:
    from ray.train import RunConfig
    from ray.train.tensorflow import TensorflowTrainer

    out = os.path.join(workdir, f"ray_train_{distribute}.json")
    start = time.perf_counter()
    result = TensorflowTrainer(
        _ray_train_train,
        train_loop_config={"out": out, "distribute": distribute},
        datasets={"train": dataset},
        scaling_config=w1.ray_train_scaling(),
        run_config=RunConfig(name="bench-ray-train", storage_path=workdir),
    ).fit()
    wall = time.perf_counter() - start
    if result.error is not None:
        raise RuntimeError(f"Ray Train's run failed: {result.error!r}")
    with open(out) as f:
        return {**json.load(f), "fit_wall_s": wall}


def run_ray_train_as_documented(dataset, workdir: str) -> dict:
    """Ray Train as its examples use it: model.fit(shard.to_tf(...)) directly (steps_per_execution 1:
    tf-keras cannot run several steps per call on a dataset of unknown length)."""
    return run_ray_train(dataset, workdir, distribute=False)


SYSTEMS = {
    "plain_mwms": run_plain_mwms,
    "raytf": run_raytf,
    "raytf_keras3": run_raytf_keras3,
    "ray_train": run_ray_train,
    "ray_train_as_documented": run_ray_train_as_documented,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps-per-execution", type=int, default=1,
                        help="Keras steps_per_execution, the same for every system")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help=w1.GPU_FLAG_HELP)
    args = parser.parse_args()
    w1.use_gpus(args.gpus_per_worker)
    systems = args.systems.split(",")
    os.environ["W1_STEPS_PER_EXECUTION"] = str(args.steps_per_execution)  # the plain workers' processes
    w1.STEPS_PER_EXECUTION = args.steps_per_execution  # pickled with w1 to the Ray workers

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        address="local",  # a Ray of its own, whatever else runs on the machine
        num_cpus=4,  # 2 workers x 1 CPU, with room for Ray Data and Ray Train's controller
        runtime_env={"env_vars": w1.WORKER_ENV},
        log_to_driver=False,
        include_dashboard=False,
    )
    dataset = w1.ray_dataset()
    samples: dict[str, list[float]] = {s: [] for s in systems}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for system in systems:
                outcome = SYSTEMS[system](dataset, workdir)
                samples[system].append(outcome["samples_per_s"])
                print(json.dumps({"system": system, "repeat": repeat, **outcome}), flush=True)
    median = {s: statistics.median(v) for s, v in samples.items()}
    ratios = {
        f"{ours}/{other}": round(median[ours] / median[other], 3)
        for ours in ("raytf", "raytf_keras3") if ours in median
        for other in systems if other != ours
    }
    print(json.dumps({"median_samples_per_s": {s: round(v) for s, v in median.items()}, "ratios": ratios}))


if __name__ == "__main__":
    main()

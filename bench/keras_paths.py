"""W1 through raytf's two Keras paths, with and without steps_per_execution, in one invocation.

    python bench/keras_paths.py [--repeats 3] [--steps-per-execution 8]

- ``tf_keras``: ``TensorflowConfig(keras="tf_keras")`` and tf-keras's own
  ``model.fit`` on ``raytf.keras.distribute(shard)``;
- ``keras3``: Keras 3 and ``raytf.keras.fit``.

Each at ``steps_per_execution`` 1 and N. Same data path (``get_dataset_shard``,
cached), same model, optimizer and global batch as W1. Prints one JSON line
per run (samples/s of the last epoch, final loss) and the ratios of the
medians. Target: Keras 3 path >= 0.9x the tf-keras path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402


def _train(config):
    import tensorflow as tf

    import raytf
    import raytf.keras

    keras = tf.keras

    class EpochTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.start)
            self.loss = float(logs["loss"])

    dataset = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y",
                                      drop_remainder=True)
    with raytf.strategy().scope():
        model = keras.Sequential(
            [keras.Input((w1.DIM,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(w1.CLASSES)]
        )
        compile_args = {"steps_per_execution": config["spe"]} if config["keras"] == "tf_keras" else {}
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), **compile_args)
    timer = EpochTimer()
    if config["keras"] == "tf_keras":
        model.fit(raytf.keras.distribute(dataset.repeat()), epochs=w1.EPOCHS,
                  steps_per_epoch=int(dataset.cardinality()), callbacks=[timer], verbose=0)
    else:
        raytf.keras.fit(model, dataset, epochs=w1.EPOCHS, callbacks=[timer], steps_per_execution=config["spe"])
    raytf.report({
        "samples_per_s": w1.WORKERS * w1.STEPS_PER_EPOCH * w1.WORKER_BATCH / timer.seconds[-1],
        "loss": timer.loss,
        "keras_version": keras.Sequential.__module__.split(".")[0],
    })


def run(dataset, workdir: str, keras: str, spe: int) -> dict:
    import raytf

    start = time.perf_counter()
    result = raytf.Trainer(
        _train,
        config={"keras": keras, "spe": spe},
        datasets={"train": dataset},
        scaling=raytf.ScalingConfig(num_workers=w1.WORKERS, cpus_per_worker=1),
        run=raytf.RunConfig(name=f"bench-{keras}-{spe}", storage_path=workdir, verbose=0),
        tensorflow=raytf.TensorflowConfig(communication="ring", keras=keras),
    ).fit()
    return {**result.metrics, "fit_wall_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps-per-execution", type=int, default=8)
    args = parser.parse_args()

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env = {k: v for k, v in w1.WORKER_ENV.items() if k != "TF_USE_LEGACY_KERAS"}  # set per run
    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": env}, log_to_driver=False,
             include_dashboard=False)
    dataset = w1.ray_dataset()
    configs = [(k, s) for k in ("tf_keras", "keras3") for s in (1, args.steps_per_execution)]
    samples: dict[str, list[float]] = {f"{k}/spe{s}": [] for k, s in configs}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for keras, spe in configs:
                outcome = run(dataset, workdir, keras, spe)
                samples[f"{keras}/spe{spe}"].append(outcome["samples_per_s"])
                print(json.dumps({"path": keras, "steps_per_execution": spe, "repeat": repeat, **outcome}), flush=True)
    median = {k: statistics.median(v) for k, v in samples.items()}
    n = args.steps_per_execution
    ratios = {
        "keras3/tf_keras, spe1": round(median["keras3/spe1"] / median["tf_keras/spe1"], 3),
        f"keras3/tf_keras, spe{n}": round(median[f"keras3/spe{n}"] / median[f"tf_keras/spe{n}"], 3),
        f"tf_keras spe{n}/spe1": round(median[f"tf_keras/spe{n}"] / median["tf_keras/spe1"], 3),
        f"keras3 spe{n}/spe1": round(median[f"keras3/spe{n}"] / median["keras3/spe1"], 3),
    }
    print(json.dumps({"median_samples_per_s": {k: round(v) for k, v in median.items()}, "ratios": ratios}))


if __name__ == "__main__":
    main()

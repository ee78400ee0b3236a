"""Benchmark workload W2, communication-bound: W1's data, a model of 20M parameters.

    python bench/w2.py [--configs plain_mwms,raytf,...] [--repeats 1] [--rows 8192]

W2: the first 8,192 rows (``--rows``) of W1's data (bench/w1.py), MLP 784-4096-4096-10
(20,037,642 float32 parameters, 80 MB of gradients per step), Adam 1e-3,
global batch 64 (32 per worker), 2 epochs, 2 workers with 1 CPU and 1 thread
each, tf-keras ``model.fit``, every system training on the same rows in the
same steps (worker r takes rows r, r + 2, ..., made in the worker: W2 measures
the all-reduce, not ingest). At 32 rows per worker the step is the gradient
all-reduce (computing it takes ~0.04 s of a ~0.5 s step here), which is what W2
is for: the options that cut the bytes exchanged.

Runs, in one invocation, plain MultiWorkerMirroredStrategy (TF_CONFIG by hand,
float32, TensorFlow's defaults: the anchor) and raytf under each
communication option, and prints one JSON line per run: samples/s of the last
epoch, the final epoch's loss, and the bytes each worker all-reduces per
training sample (gradient bytes per all-reduce / samples per all-reduce). The
last line holds the ratios to the anchor (and to raytf's float32 run):
samples/s and loss.
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
import throughput  # noqa: E402
import w1  # noqa: E402

# --rows, passed on to the plain processes and Ray's workers in the environment (main sets it).
ROWS = int(os.environ.get("RAYTF_BENCH_W2_ROWS", 8_192))
HIDDEN = 4096
WORKER_BATCH = 32
GLOBAL_BATCH = w1.WORKERS * WORKER_BATCH
EPOCHS = 2
STEPS_PER_EPOCH = ROWS // GLOBAL_BATCH
PARAMETERS = w1.DIM * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * w1.CLASSES + w1.CLASSES
WORKER_ENV = w1.WORKER_ENV
mwms_strategy = w1.mwms_strategy

BF16_EF = {"gradient_compression": "bfloat16", "error_feedback": True}
FP16_EF = {"gradient_compression": "float16", "error_feedback": True}
# name: (TensorflowConfig options, {"accumulate_steps": K} or {"local_sgd_steps": K} or {})
CONFIGS = {
    "raytf": ({}, {}),
    "raytf_per_variable": ({"bytes_per_pack": 1}, {}),
    "raytf_packs_4mb": ({"bytes_per_pack": 4 << 20}, {}),
    "raytf_bfloat16": ({"gradient_compression": "bfloat16"}, {}),
    "raytf_bfloat16_ef": (BF16_EF, {}),
    "raytf_float16_ef": (FP16_EF, {}),
    "raytf_accumulate4": ({}, {"accumulate_steps": 4}),
    "raytf_bfloat16_ef_accumulate4": (BF16_EF, {"accumulate_steps": 4}),
    "raytf_local_sgd2": ({}, {"local_sgd_steps": 2}),
    "raytf_local_sgd4": ({}, {"local_sgd_steps": 4}),
    "raytf_bfloat16_ef_local_sgd4": (BF16_EF, {"local_sgd_steps": 4}),
    "raytf_float16_ef_local_sgd4": (FP16_EF, {"local_sgd_steps": 4}),
}


def layers(keras) -> list:
    return [keras.Input((w1.DIM,)), keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(w1.CLASSES)]


def rows(rank: int, workers: int):
    """Worker ``rank``'s rows of W2, made here (W1's generator, block by block as bench/w1.py's Ray
    Dataset makes them): rows rank, rank + workers, ... of the first ROWS, in order. Every system
    trains on the same rows in the same steps, so their losses compare."""
    import numpy as np

    block = w1.ROWS // w1.BLOCKS
    parts = [w1.common.w1_block({"id": np.arange(start, min(start + block, ROWS))}) for start in range(0, ROWS, block)]
    x, y = (np.concatenate([p[k] for p in parts]) for k in ("x", "y"))
    return x[rank::workers], y[rank::workers]


def fit(dataset, strategy, accumulate_steps: int = 1, local_sgd_steps: int = 1) -> dict:
    """Train W2 (``dataset`` unused: see rows()); bench/w1.py's fit and report."""
    import tensorflow as tf

    x, y = rows(strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(WORKER_BATCH, drop_remainder=True).cache()
    return w1.fit(data, strategy, layers=layers, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH,
                  worker_batch=WORKER_BATCH, accumulate_steps=accumulate_steps, local_sgd_steps=local_sgd_steps,
                  steps_per_execution=1)


def bytes_per_sample(tensorflow: dict, keras: dict) -> float:
    """Bytes each worker hands the all-reduce per sample trained: gradients, or local SGD's weight
    changes (the ring then sends and receives 2(n-1)/n times that per worker)."""
    wire = 2 if tensorflow.get("gradient_compression") else 4
    every = keras.get("accumulate_steps", 1) * keras.get("local_sgd_steps", 1)
    return PARAMETERS * wire / (GLOBAL_BATCH * every)


def _raytf_train(config):
    import raytf

    raytf.report(fit(None, raytf.strategy(), **config))


def run_raytf(workdir: str, name: str) -> dict:
    import raytf

    tensorflow, keras = CONFIGS[name]
    start = time.perf_counter()
    result = raytf.Trainer(
        _raytf_train, config=keras,
        scaling=w1.raytf_scaling(),
        run=raytf.RunConfig(name=f"bench-w2-{name}", storage_path=workdir, verbose=0),
        tensorflow=raytf.TensorflowConfig(communication=w1.communication(), keras="tf_keras", **tensorflow),
    ).fit()
    return {**result.metrics, "fit_wall_s": time.perf_counter() - start,
            "allreduce_bytes_per_sample": bytes_per_sample(tensorflow, keras)}


def run_plain(workdir: str) -> dict:
    return {**throughput.run_plain_mwms(None, workdir, workload="w2"),
            "allreduce_bytes_per_sample": bytes_per_sample({}, {})}


def main() -> None:
    global ROWS, STEPS_PER_EPOCH
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(["plain_mwms", *CONFIGS]))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rows", type=int, default=ROWS, help="W2's rows: 2 epochs of rows / 64 steps each")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help=w1.GPU_FLAG_HELP)
    args = parser.parse_args()
    configs = args.configs.split(",")
    if args.rows < 2 * GLOBAL_BATCH:
        parser.error(f"--rows {args.rows}: at least {2 * GLOBAL_BATCH} (two steps of the global batch)")
    os.environ["RAYTF_BENCH_W2_ROWS"] = str(args.rows)  # before Ray starts: its workers inherit it
    ROWS, STEPS_PER_EPOCH = args.rows, args.rows // GLOBAL_BATCH
    unknown = [c for c in configs if c != "plain_mwms" and c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from plain_mwms, {', '.join(CONFIGS)}")
    w1.use_gpus(args.gpus_per_worker)
    bfloat16 = [c for c in configs if c in CONFIGS and CONFIGS[c][0].get("gradient_compression") == "bfloat16"]
    if args.gpus_per_worker and bfloat16:
        parser.error(f"{bfloat16} all-reduce bfloat16, which TensorFlow's GPU collectives refuse: "
                     "leave them out on GPUs (the float16 configs compress there)")

    import ray
    from ray import cloudpickle

    for module in (w1, w1.common, throughput, sys.modules[__name__]):
        cloudpickle.register_pickle_by_value(module)
    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": w1.WORKER_ENV}, log_to_driver=False,
             include_dashboard=False)
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for config in configs:
                outcome = run_plain(workdir) if config == "plain_mwms" else run_raytf(workdir, config)
                runs[config].append(outcome)
                print(json.dumps({"config": config, "repeat": repeat, **outcome}), flush=True)
    median = {c: {k: statistics.median(r[k] for r in rs) for k in ("samples_per_s", "loss")} for c, rs in runs.items()}
    summary = {"parameters": PARAMETERS, "rows": ROWS, "epochs": EPOCHS, "median": {c: {k: round(v, 4) for k, v in m.items()} for c, m in median.items()}}
    for anchor in ("plain_mwms", "raytf"):
        if anchor in median:
            summary[f"vs_{anchor}"] = {
                c: {"samples_per_s": round(m["samples_per_s"] / median[anchor]["samples_per_s"], 3),
                    "loss": round(m["loss"] / median[anchor]["loss"], 4)}
                for c, m in median.items() if c != anchor
            }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

"""Benchmark workload W3: a large model's checkpoints, raytf against Ray Train, in one invocation.

    python bench/w3.py [--gib 1] [--steps 60] [--every 20] [--storages local,s3]
                       [--systems raytf_async,raytf_sync,ray_train_async,ray_train_sync]
                       [--gpus-per-worker 0.5] [--table variable|keras] [--worker-env NAME=VALUE ...]
                       [--repeats 3]

W3: one embedding table of ``--gib`` GiB (float32 rows of 1,024) and a 1,024 x 1 head, trained
on 2 workers under MultiWorkerMirroredStrategy with SGD on random ids (256 per worker per step;
the table's gradient is sparse, so a step costs little next to a checkpoint of the whole table).
Every system runs the same training code and checkpoints the table and the head every
``--every`` steps: raytf with ``Checkpoint.from_state`` and ``CheckpointConfig(upload=...)``,
Ray Train (``TensorflowTrainer``) with a ``tf.train.Checkpoint`` written to a local directory on
every rank and ``ray.train.report(..., checkpoint_upload_mode=SYNC or ASYNC)``. Storage: a local
directory and a loopback S3 server (moto), or one of them with ``--storages``. With
``--gpus-per-worker`` every system trains on GPUs (0.5: two workers share one GPU's machine),
so a checkpoint's pause includes the state's copy from the GPU to the host. ``--table keras``
makes the table ``tf.keras.layers.Embedding`` (Keras 3, or tf-keras with ``--worker-env
TF_USE_LEGACY_KERAS=1``), checkpointed as the layer: a user's embedding model.

Prints one JSON line per run and a summary line:

- ``blocked_s``: the seconds each checkpoint kept rank 0 from training (from the start of the
  save, Ray Train's local write included, to the return of ``report``), and their mean;
- ``steps_per_s``: the training loop's steps per second, checkpoints included, and
  ``steps_per_s_without``: the same run's system with no checkpoint at all (one run per system
  and storage with ``--every 0``, made first);
- ``fit_s``: the whole ``fit()``, which for raytf's asynchronous uploads includes waiting for
  the last commit.

Ratios in the summary are raytf's over Ray Train's with the same upload mode and storage.
``--repeats N`` makes every run N times, round by round (each line says its ``repeat``); the
summary then gives each figure's median over the N runs.

``--restores`` measures restarts instead: rank 0 of the first attempt exits right after its
first checkpoint (``--every`` steps in, synchronous upload, so it is committed), and the next
attempt's rank 0 times ``restore_s``, from asking for the checkpoint to the state restored into
the model: raytf from its copy in host memory (``raytf_memory``, the default
``restore_from_memory=True``; ``restored_from`` says which it used), raytf from storage
(``raytf_storage``), and Ray Train (``ray_train``: ``get_checkpoint()``, ``as_directory()``,
``tf.train.Checkpoint.read``). The summary gives storage's time over memory's, per storage.
"""

from __future__ import annotations

import argparse
import atexit
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402  (the anchors' strategy, one thread each)

DIM = 1024
WORKER_ENV: dict = {}  # --worker-env
ROWS_PER_GIB = (1 << 30) // (DIM * 4)
BATCH = 256
LR = 0.1


def train_w3(strategy, rank: int, config: dict, save, restore=None) -> dict:
    """Train W3 for ``config["steps"]`` steps, ``save(step, trackables)`` every ``config["every"]``;
    rank 0 writes its timings to ``config["out"]``. With ``config["crash"]`` and ``restore``: the
    first attempt's rank 0 raises after its first checkpoint, and the next attempt times
    ``restore(trackables)`` (which returns False where there was nothing to restore)."""
    import tensorflow as tf

    rows = int(config["gib"] * ROWS_PER_GIB)
    with strategy.scope():
        head = tf.Variable(tf.fill([DIM, 1], 0.01), name="head")
        if config.get("table", "variable") == "variable":
            table = tf.Variable(tf.zeros([rows, DIM]), name="table")
            owner = table
        else:  # --table keras: an Embedding layer of tf.keras (Keras 3, or tf-keras with TF_USE_LEGACY_KERAS=1)
            owner = tf.keras.layers.Embedding(rows, DIM, embeddings_initializer="zeros", name="table")
            owner.build((None,))
            table = owner.embeddings if isinstance(owner.embeddings, tf.Variable) else owner.embeddings.value
    trackables = {"table": owner, "head": head}  # the layer itself is checkpointed, as a user would

    @tf.function
    def train_step():
        def replica():
            ids = tf.random.uniform([BATCH], maxval=rows, dtype=tf.int64)
            target = tf.cast(ids % 2, tf.float32)[:, None]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.gather(table, ids) @ head - target))
            g_table, g_head = tape.gradient(loss, [table, head])
            context = tf.distribute.get_replica_context()  # the sparse gradient is all-gathered
            g_table, g_head = context.all_reduce(tf.distribute.ReduceOp.MEAN, [g_table, g_head])
            return g_table.values, g_table.indices, g_head, loss

        values, indices, g_head, loss = [strategy.experimental_local_results(t)[0] for t in strategy.run(replica)]
        # Every worker applies the same all-reduced update to its copy (cross-replica context).
        table.scatter_sub(tf.IndexedSlices(LR * values, indices))
        head.assign_sub(LR * g_head)
        return loss

    restore_s = None
    if restore is not None:
        began = time.perf_counter()
        if restore(trackables):
            restore_s = time.perf_counter() - began
    train_step()  # traced before the clock starts
    blocked = []
    start = time.perf_counter()
    for step in range(1, config["steps"] + 1):
        loss = float(train_step())
        if config["every"] and step % config["every"] == 0:
            began = time.perf_counter()
            save(step, loss, trackables)
            blocked.append(time.perf_counter() - began)
            if config.get("crash") and restore_s is None and rank == 0:
                time.sleep(3)  # the report's checkpoint reaches each system's record (Ray Train's controller polls)
                os._exit(1)  # the crash --restores measures the recovery from (a process lost, as to OOM)
    loop = time.perf_counter() - start
    if rank == 0:  # a file: Ray Train V2 keeps only the metrics reported with a checkpoint
        with open(config["out"], "w") as f:
            json.dump({"loop_s": loop, "steps_per_s": config["steps"] / loop, "blocked_s": blocked,
                       "restore_s": restore_s}, f)


def _raytf_train(config):
    import raytf

    def save(step, loss, trackables):
        raytf.report({"step": step, "loss": loss}, checkpoint=raytf.Checkpoint.from_state(**trackables))

    def restore(trackables):
        checkpoint = raytf.get_checkpoint()
        if checkpoint is not None:
            checkpoint.restore_state(**trackables)
        return checkpoint is not None

    train_w3(raytf.strategy(), raytf.get_context().world_rank, config, save, restore)


def run_raytf(config: dict, storage: dict, upload: str, memory: bool = True) -> dict:
    import raytf

    start = time.perf_counter()
    result = raytf.Trainer(
        _raytf_train, config=config, scaling=raytf.ScalingConfig(num_workers=2, gpus_per_worker=w1.GPUS_PER_WORKER),
        run=raytf.RunConfig(name=f"w3-raytf-{upload}-{config['every']}-{time.time_ns()}", verbose=0,
                            checkpoint_config=raytf.CheckpointConfig(num_to_keep=2, upload=upload,
                                                                     restore_from_memory=memory),
                            failure_config=raytf.FailureConfig(max_failures=1), **storage),
        tensorflow=raytf.TensorflowConfig(intra_op_threads=1, inter_op_threads=1, communication=w1.communication(),
                                          worker_env=WORKER_ENV),
    ).fit()
    fit = time.perf_counter() - start
    restored = [s["restored_from"] for s in result.startup if "restored_from" in s]
    return {**_timings(config), "fit_s": fit, **({"restored_from": restored[0]} if restored else {})}


def _ray_train_train(config):
    import tensorflow as tf
    from ray import train
    from ray.train import CheckpointUploadMode

    strategy = w1.mwms_strategy()
    rank = train.get_context().get_world_rank()
    mode = CheckpointUploadMode[config["upload"].upper()]

    def save(step, loss, trackables):
        # Under the bench's own scratch directory, which it removes (Ray Train keeps rank 1's
        # unreported copies, a GiB each, in the system's temporary directory otherwise).
        os.makedirs(config["scratch"], exist_ok=True)
        directory = tempfile.mkdtemp(dir=config["scratch"])
        tf.train.Checkpoint(**trackables).write(os.path.join(directory, "state"))  # every rank
        checkpoint = train.Checkpoint.from_directory(directory) if rank == 0 else None
        train.report({"step": step, "loss": loss}, checkpoint=checkpoint, checkpoint_upload_mode=mode)

    def restore(trackables):
        checkpoint = train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as directory:
                tf.train.Checkpoint(**trackables).read(os.path.join(directory, "state")).expect_partial()
        return checkpoint is not None

    train_w3(strategy, rank, config, save, restore)


def run_ray_train(config: dict, storage: dict, upload: str, memory: bool = False) -> dict:
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    start = time.perf_counter()
    scratch = os.path.join(os.path.dirname(config["out"]), f"ray-train-local-{time.time_ns()}")
    result = TensorflowTrainer(
        _ray_train_train, train_loop_config={**config, "upload": upload, "scratch": scratch},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=w1.GPUS_PER_WORKER > 0,
                                     resources_per_worker={"GPU": w1.GPUS_PER_WORKER} if w1.GPUS_PER_WORKER else None),
        run_config=RunConfig(name=f"w3-ray-train-{upload}-{config['every']}-{time.time_ns()}",
                             checkpoint_config=CheckpointConfig(num_to_keep=2),
                             failure_config=FailureConfig(max_failures=1), **storage),
    ).fit()
    fit = time.perf_counter() - start
    shutil.rmtree(scratch, ignore_errors=True)
    if result.error is not None:
        return {"failed": repr(result.error)[:300], "fit_s": fit}
    return {**_timings(config), "fit_s": fit}


def _timings(config: dict) -> dict:
    with open(config["out"]) as f:
        return json.load(f)


def _s3_storage() -> tuple[dict, dict, object]:
    """A moto S3 server on loopback: (raytf's storage options, Ray Train's, the server process)."""
    import socket
    import subprocess

    import pyarrow.fs as pafs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fs = None
    for _ in range(100):
        try:
            fs = pafs.S3FileSystem(access_key="w3", secret_key="w3", region="us-east-1",
                                   endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
            fs.create_dir("raytf-w3")
            break
        except OSError:
            time.sleep(0.2)
    options = {"storage_path": "raytf-w3/runs", "storage_filesystem": fs}
    return options, dict(options), server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--storages", default="local,s3", help="local, s3 (a moto server on loopback), or both")
    parser.add_argument("--systems", default="raytf_async,raytf_sync,ray_train_async,ray_train_sync")
    parser.add_argument("--restores", action="store_true", help="measure restarts (see above), not checkpoints")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help=w1.GPU_FLAG_HELP)
    parser.add_argument("--table", choices=["variable", "keras"], default="variable",
                        help="the table: a tf.Variable, or tf.keras's Embedding layer (Keras 3; tf-keras with "
                             "--worker-env TF_USE_LEGACY_KERAS=1), checkpointed as the layer")
    parser.add_argument("--repeats", type=int, default=1, help="every run this many times, round by round")
    parser.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in every system's workers (raytf: TensorflowConfig.worker_env, which wins over "
                             "raytf's own settings; Ray Train: the runtime env), e.g. TF_ENABLE_ONEDNN_OPTS=0 for "
                             "a CPU without AVX-512, TF_CPU_ALLOCATOR_USE_BFC=false for TensorFlow's own allocator")
    parser.add_argument("--conditions", default=None, metavar="NAME=VALUE,...;...",
                        help="raytf's systems only: each run once per condition, round by round, a condition being "
                             "the workers' environment (semicolon-separated; NAME=VALUE pairs comma-separated; an "
                             "empty one is raytf's defaults), set through TensorflowConfig.worker_env alone")
    args = parser.parse_args()
    conditions = [{}]
    if args.conditions is not None:
        if args.worker_env or any(not s.startswith("raytf_") for s in args.systems.split(",")):
            parser.error("--conditions applies to raytf's systems alone, without --worker-env")
        conditions = [dict(pair.split("=", 1) for pair in c.split(",") if pair) for c in args.conditions.split(";")]
    w1.use_gpus(args.gpus_per_worker)
    WORKER_ENV.update(dict(pair.split("=", 1) for pair in args.worker_env))
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    gpu_env = {k: v for k, v in w1.WORKER_ENV.items() if k == "TF_FORCE_GPU_ALLOW_GROWTH"}
    cluster_env = {**gpu_env, **WORKER_ENV}
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": cluster_env} if cluster_env else None)
    local = tempfile.mkdtemp(prefix="w3-")
    atexit.register(shutil.rmtree, local, True)  # every run's checkpoints: GiBs each
    storages = {}
    if "local" in args.storages.split(","):
        storages["local"] = ({"storage_path": local}, {"storage_path": local}, None)
    if "s3" in args.storages.split(","):
        storages["s3"] = _s3_storage()
    systems = args.systems.split(",")
    runners = {"raytf": run_raytf, "ray_train": run_ray_train}
    results = []
    if args.restores:
        try:
            restores(args, storages, local)
        finally:
            for _, _, server in storages.values():
                if server is not None:
                    server.terminate()
        return
    try:
        for repeat in range(args.repeats):
            for (storage, (raytf_storage, ray_storage, _)), condition in itertools.product(storages.items(), conditions):
                if args.conditions is not None:
                    WORKER_ENV.clear()
                    WORKER_ENV.update(condition)
                for system in systems:
                    name, _, upload = system.rpartition("_")
                    options = raytf_storage if name == "raytf" else ray_storage
                    row = {"system": system, "storage": storage, "gib": args.gib, "steps": args.steps,
                           "every": args.every, "worker_env": dict(WORKER_ENV), "table": args.table, "repeat": repeat}
                    out = os.path.join(local, "timings.json")
                    config = {"gib": args.gib, "steps": args.steps, "out": out, "table": args.table}
                    without = runners[name]({**config, "every": 0}, options, upload)
                    row.update(runners[name]({**config, "every": args.every}, options, upload))
                    row["steps_per_s_without"] = without.get("steps_per_s")
                    if row.get("blocked_s"):
                        row["blocked_mean_s"] = sum(row["blocked_s"]) / len(row["blocked_s"])
                    print(json.dumps(row), flush=True)
                    results.append(row)
    finally:
        for _, _, server in storages.values():
            if server is not None:
                server.terminate()
    if args.conditions is not None:  # rows of one system under several environments: nothing to pair
        return
    summary = {"summary": "w3", "gib": args.gib, "repeats": args.repeats}
    for storage in storages:
        for system in systems:
            if not system.startswith("raytf_"):
                continue
            key = f"{system}_{storage}"
            ours = _median(results, system, storage, "blocked_mean_s")
            anchor = _median(results, "ray_train_" + system.split("_")[1], storage, "blocked_mean_s")
            summary[f"{key}_blocked_mean_s"] = ours
            if ours and anchor:
                summary[f"{key}_blocked_vs_ray_train"] = ours / anchor
                summary[f"{key}_steps_per_s_vs_ray_train"] = (
                    _median(results, system, storage, "steps_per_s")
                    / _median(results, "ray_train_" + system.split("_")[1], storage, "steps_per_s"))
    print(json.dumps(summary), flush=True)


def _median(rows: list[dict], system: str, storage: str, key: str):
    """The median of ``key`` over the runs of ``system`` on ``storage``; None where none has it."""
    values = [r[key] for r in rows if r["system"] == system and r["storage"] == storage and r.get(key) is not None]
    return statistics.median(values) if values else None


def restores(args, storages: dict, local: str) -> None:
    """``--restores``: one crash and restart per system and storage; restore_s of the restart."""
    summary = {"summary": "w3_restores", "gib": args.gib, "repeats": args.repeats}
    rows = []
    for repeat in range(args.repeats):
        for storage, (raytf_storage, ray_storage, _) in storages.items():
            for system, run in (("raytf_memory", lambda c: run_raytf(c, raytf_storage, "sync", memory=True)),
                                ("raytf_storage", lambda c: run_raytf(c, raytf_storage, "sync", memory=False)),
                                ("ray_train", lambda c: run_ray_train(c, ray_storage, "sync"))):
                config = {"gib": args.gib, "steps": args.steps, "every": args.every, "crash": True,
                          "out": os.path.join(local, "timings.json")}
                row = {"system": system, "storage": storage, "gib": args.gib, "repeat": repeat, **run(config)}
                row.pop("blocked_s", None)
                print(json.dumps(row), flush=True)
                rows.append(row)
    for storage in storages:
        times = {system: _median(rows, system, storage, "restore_s")
                 for system in ("raytf_memory", "raytf_storage", "ray_train")}
        for system in ("raytf_storage", "ray_train"):
            if times.get(system) and times.get("raytf_memory"):
                summary[f"{system}_over_raytf_memory_{storage}"] = times[system] / times["raytf_memory"]
        summary.update({f"{system}_{storage}_restore_s": t for system, t in times.items()})
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

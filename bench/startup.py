"""Start-up: from fit() to the first training step, raytf against plain TensorFlow.

    python bench/startup.py [--repeats 3] [--workers 1,2,4]

The anchor is plain MultiWorkerMirroredStrategy as fast as it starts: two
processes spawned with TF_CONFIG set by hand, each importing TensorFlow,
connecting the strategy and running one training step (a Dense layer's
gradients all-reduced and applied). raytf runs the same step in ``train_fn``
from ``Trainer(...).fit()``: placement group, actors, loading, connect, first
step, as ``result.startup`` breaks it down; ``raytf`` with its CPU workers
forked from their node's fork server (the default; its first run starts the
server), ``raytf_spawn`` with ``TensorflowConfig(start_method="spawn")``, each
worker a new process that imports TensorFlow.

Prints one JSON line per run, then a summary: the median seconds to the first
step of each, raytf's ratio to plain's, raytf's median per phase, and, for each worker
count in ``--workers``, the driver's blocking round trips while starting the
group (its ``ray.get``/``ray.wait`` calls until every worker has its rank and
TF_CONFIG) next to the actor calls it sent: the calls grow with N, the round
trips do not.
"""

from __future__ import annotations

import argparse
import functools
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

WORKERS = 2


def first_step(strategy) -> None:
    """One training step under ``strategy``: gradients of a small Dense layer, all-reduced and applied."""
    import tensorflow as tf

    with strategy.scope():
        kernel = tf.Variable(tf.ones((32, 4)))
        optimizer = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.matmul(tf.ones((8, 32)), kernel) ** 2)
            optimizer.apply_gradients([(tape.gradient(loss, kernel), kernel)])

        strategy.run(replica)

    step()


def plain_worker(tf_config: str, out: str) -> None:
    """One process of the anchor (``--plain-worker``): import, connect, one step, each timed."""
    os.environ.update({**w1.WORKER_ENV, "TF_CONFIG": tf_config})
    marks = {"started": time.time()}
    import tensorflow as tf

    marks["imported"] = time.time()
    strategy = w1.mwms_strategy()
    marks["connected"] = time.time()
    first_step(strategy)
    marks["first_step"] = time.time()
    del tf
    with open(out, "w") as f:
        json.dump(marks, f)


def run_plain(workdir: str) -> dict:
    ports = []
    for _ in range(WORKERS):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    began = time.time()
    processes, outputs = [], []
    for rank in range(WORKERS):
        out = os.path.join(workdir, f"plain{rank}.json")
        outputs.append(out)
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
        processes.append(subprocess.Popen([sys.executable, __file__, "--plain-worker", tf_config, out],
                                          env={**os.environ, **w1.WORKER_ENV}))
    for p in processes:
        if p.wait() != 0:
            raise RuntimeError(f"a plain MWMS worker exited with {p.returncode}")
    marks = [json.load(open(out)) for out in outputs]
    last = {k: max(m[k] for m in marks) for k in marks[0]}
    return {"to_first_step_s": round(last["first_step"] - began, 2),
            "phases": {"process": round(last["started"] - began, 2), "import": round(last["imported"] - last["started"], 2),
                       "connect": round(last["connected"] - last["imported"], 2),
                       "first_step": round(last["first_step"] - last["connected"], 2)}}


def _raytf_train(config):
    import raytf

    first_step(raytf.strategy())
    raytf.report({"first_step_at": time.time()})


def run_raytf(workdir: str, workers: int = WORKERS, start_method: str = "auto") -> dict:
    import raytf

    began = time.time()
    result = raytf.Trainer(
        _raytf_train,
        scaling=raytf.ScalingConfig(num_workers=workers, cpus_per_worker=1),
        run=raytf.RunConfig(name=f"bench-startup-{workers}-{began}", storage_path=workdir, verbose=0),
        tensorflow=raytf.TensorflowConfig(communication="ring", start_method=start_method),
    ).fit()
    return {"to_first_step_s": round(result.metrics["first_step_at"] - began, 2), "phases": result.startup[0]}


def count_round_trips(workdir: str, workers: int) -> dict:
    """The driver's blocking waits and actor calls while it starts a group of ``workers``."""
    import ray
    from ray.actor import ActorMethod

    from raytf._internal.driver.group import WorkerGroup

    counts = {"blocking_round_trips": 0, "actor_calls": 0}
    starting = [False]
    original = (ray.get, ray.wait, ActorMethod.remote, WorkerGroup._start_members)

    def counted(function, key):
        def wrapper(*args, **kwargs):
            if starting[0]:
                counts[key] += 1
            return function(*args, **kwargs)
        return wrapper

    def start_actors(self, *args, **kwargs):
        starting[0] = True
        try:
            return original[3](self, *args, **kwargs)
        finally:
            starting[0] = False

    ray.get, ray.wait = counted(original[0], "blocking_round_trips"), counted(original[1], "blocking_round_trips")
    ActorMethod.remote = counted(original[2], "actor_calls")
    WorkerGroup._start_members = start_actors
    try:
        run_raytf(workdir, workers)
    finally:
        ray.get, ray.wait, ActorMethod.remote, WorkerGroup._start_members = original
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", default="1,2,4", help="worker counts to count the driver's round trips for")
    parser.add_argument("--plain-worker", nargs=2, metavar=("TF_CONFIG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_worker:
        plain_worker(*args.plain_worker)
        return

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=8, runtime_env={"env_vars": w1.WORKER_ENV}, log_to_driver=False,
             include_dashboard=False)
    # raytf's CPU workers come from their node's fork server (TensorflowConfig.start_method="auto"),
    # which the first run starts; raytf_spawn's are new processes that import TensorFlow themselves.
    systems = {"plain_mwms": run_plain, "raytf_spawn": functools.partial(run_raytf, start_method="spawn"),
               "raytf": run_raytf}
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for system, run in systems.items():
                outcome = run(workdir)
                runs[system].append(outcome)
                print(json.dumps({"system": system, "repeat": repeat, **outcome}), flush=True)
        trips = {n: count_round_trips(workdir, n) for n in map(int, args.workers.split(","))}
    median = {s: statistics.median(r["to_first_step_s"] for r in rs) for s, rs in runs.items()}
    phases = {k: round(statistics.median(r["phases"][k] for r in runs["raytf"]), 2)
              for k in runs["raytf"][0]["phases"] if k != "attempt"}
    print(json.dumps({
        "median_to_first_step_s": median,
        "ratio_raytf/plain_mwms": round(median["raytf"] / median["plain_mwms"], 3),
        "raytf_phases_median_s": phases,
        "driver_start_by_workers": trips,
    }))


if __name__ == "__main__":
    main()

"""W3 on parameter servers: a large table partitioned over the servers, checkpointed while training.

    python bench/w3_ps.py [--gib 1] [--num-ps 2] [--steps 60] [--every 20] [--writers chief,servers]
                          [--repeats 3]

A ``ParameterServerTrainer`` with ``--num-ps`` parameter servers (half a CPU each), one worker
and the chief: W3's table (``--gib`` GiB of float32 rows of 1,024, ``FixedShardsPartitioner``
over the servers) and head, SGD on random ids scheduled through the ``ClusterCoordinator``, a
``Checkpoint.from_state`` of both every ``--every`` steps (asynchronous, the default). Storage
is a local directory (removed when the bench exits). One run per writer (``--repeats``: each
that many times, round by round, every line saying its ``repeat``):

- ``chief``: raytf's way. ``report`` copies each part on its own server (a host copy there,
  no bytes moved) and returns; the chief's background thread writes the files, every server
  sending its part over gRPC at once (``CheckpointOptions(experimental_io_device=<the chief's
  CPU>)``), which works whatever node each server is on;
- ``servers``: TensorFlow's default, each server writing its own part into the checkpoint's
  directory in parallel and the last one merging the index: what writing in parallel on the
  servers would buy. It works here only because every process shares one disk; on a cluster
  the directory exists only on the chief's node.

Prints one JSON line per run (``blocked_s``: how long each ``report`` kept the chief from
scheduling steps; ``commit_s``: from each report to its checkpoint's commit, writing and
uploading included; ``steps_per_s``) and a summary with the servers' commit time over the
chief's.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from w3 import BATCH, DIM, LR, ROWS_PER_GIB  # noqa: E402


def _parts(variable):
    """A variable's parts, one per parameter server it was split over."""
    return list(variable.variables) if hasattr(variable, "variables") else [variable]


def _train(config):
    import tensorflow as tf

    import raytf

    if config["writer"] == "servers":  # TensorFlow's default placement of the save ops
        from raytf._internal.checkpoint import state

        state.save_options = lambda device=None: tf.train.CheckpointOptions()
    strategy, coordinator = raytf.strategy(), raytf.coordinator()
    rows = int(config["gib"] * ROWS_PER_GIB)
    with strategy.scope():
        table = tf.Variable(tf.zeros([rows, DIM]), name="table")
        head = tf.Variable(tf.fill([DIM, 1], 0.01), name="head")

    @tf.function
    def step():
        def replica():
            ids = tf.random.uniform([BATCH], maxval=rows, dtype=tf.int64)
            target = tf.cast(ids % 2, tf.float32)[:, None]
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.nn.embedding_lookup(table, ids) @ head - target))
            parts = _parts(table) + _parts(head)
            for part, g in zip(parts, tape.gradient(loss, parts)):  # each server's part takes its updates
                if isinstance(g, tf.IndexedSlices):
                    part.scatter_sub(tf.IndexedSlices(LR * g.values, g.indices))
                elif g is not None:
                    part.assign_sub(LR * g)
            return loss

        return strategy.run(replica)

    coordinator.schedule(step)
    coordinator.join()  # traced and every server reached before the clock starts
    blocked, reported = [], []
    start = time.perf_counter()
    for done in range(1, config["steps"] + 1):
        coordinator.schedule(step)
        if done % config["every"] == 0:
            coordinator.join()  # the state of exactly `done` steps
            began = time.perf_counter()
            reported.append(time.time())
            raytf.report({"step": done, "reported_at": reported[-1]},
                         checkpoint=raytf.Checkpoint.from_state(table=table, head=head))
            blocked.append(time.perf_counter() - began)
    coordinator.join()
    loop = time.perf_counter() - start
    raytf.report({"step": config["steps"], "loop_s": loop, "blocked_s": blocked})


def run(config: dict, workdir: str) -> dict:
    import tensorflow as tf

    import raytf

    start = time.perf_counter()
    result = raytf.ParameterServerTrainer(
        _train, config=config,
        scaling=raytf.ParameterServerScaling(num_workers=1, num_ps=config["num_ps"], cpus_per_worker=0.5,
                                             cpus_per_ps=0.5, cpus_per_chief=0.5),
        variable_partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(config["num_ps"]),
        run=raytf.RunConfig(name=f"w3-ps-{config['writer']}-{time.time_ns()}", storage_path=workdir, verbose=0,
                            checkpoint_config=raytf.CheckpointConfig(num_to_keep=2)),
    ).fit()
    fit = time.perf_counter() - start
    commits = [entry["committed_at"] - entry["reported_at"] for entry in result.history
               if entry.get("committed_at") and entry.get("reported_at")]
    last = result.history[-1]
    return {"writer": config["writer"], "gib": config["gib"], "num_ps": config["num_ps"], "steps": config["steps"],
            "every": config["every"], "blocked_s": last["blocked_s"], "commit_s": commits,
            "steps_per_s": config["steps"] / last["loop_s"], "fit_s": fit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--num-ps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--writers", default="chief,servers")
    parser.add_argument("--repeats", type=int, default=1, help="every run this many times, round by round")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=4, include_dashboard=False)
    workdir = tempfile.mkdtemp(prefix="w3-ps-")
    atexit.register(shutil.rmtree, workdir, ignore_errors=True)  # each run's checkpoints: GiBs
    rows = []
    for repeat in range(args.repeats):
        for writer in args.writers.split(","):
            row = run({"writer": writer, "gib": args.gib, "num_ps": args.num_ps, "steps": args.steps,
                       "every": args.every}, workdir)
            row = {**row, "repeat": repeat} if args.repeats > 1 else row
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {"summary": "w3_ps", "gib": args.gib, "num_ps": args.num_ps, "repeats": args.repeats}
    for writer in args.writers.split(","):  # over every run of the writer
        mine = [row for row in rows if row["writer"] == writer]
        blocked = [b for row in mine for b in row["blocked_s"]]
        commits = [c for row in mine for c in row["commit_s"]]
        summary[f"{writer}_blocked_mean_s"] = sum(blocked) / max(1, len(blocked))
        summary[f"{writer}_commit_mean_s"] = sum(commits) / max(1, len(commits))
    if "chief_commit_mean_s" in summary and "servers_commit_mean_s" in summary:
        summary["servers_commit_vs_chief"] = summary["servers_commit_mean_s"] / summary["chief_commit_mean_s"]
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

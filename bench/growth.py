"""An elastic group growing back while it trains: from a node joining to training on it.

    python bench/growth.py [--epochs 30] [--join-after 8] [--repeats 3]

W1 (Keras 3 through ``raytf.keras.fit`` with ``ReportCallback(preemption_check_every=10)``,
per-worker batch 128) with ``ScalingConfig(num_workers=(2, 3))`` on a ``ray.cluster_utils``
cluster whose two worker nodes each hold one worker: the group starts with 2. ``--join-after``
seconds into training a third node joins. Prints one JSON line: ``join_to_first_step_s``, from
the node joining to the grown group's first step (``join_to_resize_s``: to the driver asking
the group to checkpoint and grow, the failure of kind ``resized`` the result records;
``resize_to_first_step_s``: the checkpoint, the restart, the resume), the sizes the attempts ran at, and whether a rank of the grown group ran on the new
node (``--repeats``: that many runs, each on a cluster of its own, every line saying its
``repeat``). Ray Train V2 looks for capacity every 60 s and restarts from storage; the goal here is
10 s plus one checkpoint interval.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402


def train(config: dict) -> None:
    import ray
    import tensorflow as tf

    import raytf
    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    data = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y", shuffle=True)
    with raytf.strategy().scope():
        model = keras.Sequential(w1.model_layers(keras))
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    node = ray.get_runtime_context().get_node_id()

    class Steps(keras.callbacks.Callback):
        first = True

        def on_train_batch_end(self, batch, logs=None):
            if self.first:
                with open(os.path.join(config["out"], f"first-{ctx.attempt}-{ctx.world_rank}.json"), "w") as f:
                    json.dump({"time": time.time(), "world_size": ctx.world_size, "node": node}, f)
                self.first = False

    raytf.keras.fit(model, data, epochs=config["epochs"],
                    callbacks=[raytf.keras.ReportCallback(preemption_check_every=10), Steps()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Enough epochs that the group still trains when the node joins: W1 ran 6 in under 8 s here.
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--join-after", type=float, default=8.0)
    parser.add_argument("--repeats", type=int, default=1, help="this many runs, one after the other")
    args = parser.parse_args()
    for repeat in range(args.repeats):
        line = measure(args)
        print(json.dumps({**line, "repeat": repeat} if args.repeats > 1 else line), flush=True)


def measure(args: argparse.Namespace) -> dict:
    """One run on a cluster of its own: what the line of the module's docstring says."""
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    import raytf

    cloudpickle.register_pickle_by_value(w1)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [cluster.add_node(num_cpus=1, resources={"grow": 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    out = tempfile.mkdtemp()
    outcome: dict = {}

    def fit() -> None:
        outcome["result"] = raytf.Trainer(
            train, config={"out": out, "epochs": args.epochs}, datasets={"train": w1.ray_dataset()},
            scaling=raytf.ScalingConfig(num_workers=(2, 3), resources_per_worker={"grow": 1}, resize_timeout_s=3),
            run=raytf.RunConfig(name="growth", storage_path=os.path.join(out, "results"), verbose=0),
            tensorflow=raytf.TensorflowConfig(communication=w1.communication()),
        ).fit()

    thread = threading.Thread(target=fit)
    thread.start()
    while not os.path.exists(os.path.join(out, "first-0-0.json")):
        time.sleep(0.1)
    time.sleep(args.join_after)
    joined_at = time.time()
    joined = cluster.add_node(num_cpus=1, resources={"grow": 1})
    thread.join()
    result = outcome["result"]
    firsts = {}
    for name in os.listdir(out):
        if name.startswith("first-"):
            _, attempt, rank = name[:-5].split("-")
            with open(os.path.join(out, name)) as f:
                firsts[(int(attempt), int(rank))] = json.load(f)
    grown = max(a for a, _ in firsts)
    if grown == 0:  # a line of negative seconds would read as a measurement
        raise SystemExit(f"growth: training ended before the node joined ({args.join_after:g} s in); raise --epochs")
    # A growth is a resize of its own (raytf counts it apart from preemptions and failures).
    [resized] = [f for f in result.failures if f.kind == "resized"]
    line = {
        "sizes": [firsts[(a, 0)]["world_size"] for a in sorted({a for a, _ in firsts})],
        "join_to_first_step_s": round(firsts[(grown, 0)]["time"] - joined_at, 2),
        "join_to_resize_s": round(resized.time - joined_at, 2),
        "resize_to_first_step_s": round(firsts[(grown, 0)]["time"] - resized.time, 2),
        "grown_uses_joined_node": any(v["node"] == joined.node_id for (a, _), v in firsts.items() if a == grown),
        "join_after_s": args.join_after,
        "startup_of_grown_attempt": result.startup[-1] if result.startup else None,
    }
    ray.shutdown()
    for node in [*nodes, joined]:
        cluster.remove_node(node)
    cluster.shutdown()
    shutil.rmtree(out, ignore_errors=True)
    return line


if __name__ == "__main__":
    main()

"""The scale tier: past two workers. Eight MultiWorkerMirroredStrategy workers over four nodes
through ranks lost on two nodes at once and a node added; a parameter-server group of four workers
and two parameter servers over three nodes through a lost workers' node and a lost ps node. Every
row trains once per epoch (per pass, for parameter servers)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import raytf
from tests import workloads
from tests.integration.conftest import wait_for
from tests.integration.test_exactly_once import trained_counts
from tests.integration.test_recovery import in_background

pytestmark = pytest.mark.integration

ROWS, GLOBAL_BATCH, EPOCHS = 336, 48, 3  # 7 steps an epoch: 8 workers x 6 rows a step, or 6 x 8


def test_eight_workers_on_four_nodes_train_every_row_once_through_ranks_lost_on_two_nodes_and_a_node_added(
        cluster, tmp_path, no_leaks):
    """One run of ``num_workers=(4, 8)``, two workers on each of four nodes, a custom loop whose
    every checkpoint is a collective report (``ranks="all"``: each rank's file, the chief's weights),
    its global batch kept whatever the group's size.
    In epoch 1, in the same second, a rank is killed (SIGKILL) and another node is taken away with
    its two ranks: one failure, though the restart's first placement meets the lost node that Ray
    still counts alive until its health checks fail; the group restarts on the 6 workers the nodes
    left hold, from epoch 0's checkpoint merged from the 8 ranks' files. In mid-epoch 2 a node joins and the group grows
    back to 8 from a checkpoint merged from the 6 (an elastic group grows once its attempt has
    trained: here, reported epoch 1). Every row of every epoch trains the final model
    once. (Before exactly-once data, a resume trained rows twice and others never.)"""
    import os
    import signal

    import ray

    nodes = [cluster.add_node(num_cpus=2, resources={"scale": 2}) for _ in range(4)]
    data = ray.data.range(ROWS, override_num_blocks=8).map_batches(workloads.counted_rows, batch_size=None)
    trainer = raytf.Trainer(
        workloads.counted_custom_loop,
        config={"out_dir": str(tmp_path), "global_batch": GLOBAL_BATCH, "epochs": EPOCHS, "driver": 1, "per_rank_files": True,
                "mark": [{"epoch": 1, "batch": 2}, {"attempt": 1, "epoch": 2, "batch": 4}], "hold_until_preempted": True},
        datasets={"train": data},
        scaling=raytf.ScalingConfig(num_workers=(4, 8), resources_per_worker={"scale": 1}, resize_timeout_s=3),
        run=raytf.RunConfig(name="scale", storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=1)),
    )
    taken = joined = None
    try:
        join = in_background(trainer)
        running = wait_for(lambda: all((tmp_path / f"running-1-{r}.json").exists() for r in range(8)), 400,
                           "8 workers training epoch 1")
        running = [json.loads((tmp_path / f"running-1-{r}.json").read_text()) for r in range(8)]
        # Rank 1 killed, and in the same second the node of rank 6 taken away (rank 6 and its neighbour).
        taken = next(n for n in nodes if n.node_id == running[6]["node_id"])
        assert running[1]["node_id"] != taken.node_id
        os.kill(running[1]["pid"], signal.SIGKILL)
        cluster.remove_node(taken)
        nodes.remove(taken)
        wait_for((tmp_path / "running-1-0-a1.json").exists, 300, "the group of 6 training")
        joined = cluster.add_node(num_cpus=2, resources={"scale": 2})
        nodes.append(joined)
        result = join()
    finally:
        for node in nodes:
            cluster.remove_node(node)
    counts, attempts = trained_counts(tmp_path, EPOCHS, ROWS)
    assert [size for _, size, _ in attempts.values()] == [8, 6, 8], attempts
    # Two ranks on each node; the group of 6 on the three nodes left, the grown group on the one that joined too.
    placed = {}
    for rank in range(8):
        placed.setdefault(running[rank]["node_id"], []).append(rank)
    assert sorted(len(ranks) for ranks in placed.values()) == [2, 2, 2, 2], placed
    # Nodes added during a test run without the packages the test cluster hides (tests/hidden.py).
    assert all(r["test_only_loaded"] == [] for r in running), running
    assert taken.node_id not in attempts[(1, 1)][2] and len(attempts[(1, 1)][2]) == 3
    assert joined.node_id in attempts[(1, 2)][2]
    # Each restore read one checkpoint merged from every rank of the group that reported it.
    for attempt, size, writers in ((1, 6, 8), (2, 8, 6)):
        for rank in range(size):
            found = json.loads((tmp_path / f"restored-1-{attempt}-{rank}.json").read_text())["files"]
            assert [f["rank"] for f in found] == list(range(writers)), (attempt, rank, found)
            assert {(f["world_size"], f["attempt"]) for f in found} == {(writers, attempt - 1)}
    # The global batch kept: each worker's steps took 6 rows in the groups of 8, 8 in the group of 6.
    for (_, attempt), rows_a_step in zip(attempts, (6, 8, 6)):
        taken = {len(json.loads(line)["ids"]) for rank in range(GLOBAL_BATCH // rows_a_step)
                 for line in (tmp_path / f"steps-1-{attempt}-{rank}.jsonl").read_text().splitlines()[1:]}
        assert taken == {rows_a_step}, (attempt, taken)
    died, grown = result.failures
    assert died.kind == "died" and grown.kind == "resized" and "growing from 6 to 8 workers" in grown.message
    # Both restarts placed a new group (6 workers, then 8), and the ranks that outlived each attempt
    # trained the next in their own processes (FailureConfig.keep_survivors: CPU workers run outside
    # the placement group). Each restart's start-up says how many: up to 5 of the 6, then 6 of the 8
    # (a process that could not be recycled in time starts cold instead).
    assert len(result.startup) == 3 and "kept_processes" not in result.startup[0]
    assert 1 <= result.startup[1]["kept_processes"] <= 5 and 1 <= result.startup[2]["kept_processes"] <= 6
    assert result.history[-1]["epoch"] == EPOCHS - 1
    wrong = {(int(e), int(r)): int(counts[e, r]) for e, r in zip(*np.nonzero(counts != 1))}
    assert not wrong, f"(epoch, row): times trained, where not once: {dict(list(wrong.items())[:20])}"


def live_tasks(run: str) -> dict[str, str]:
    """Each live actor of run ``run``: its task ("worker-0", "ps-1", ...) -> its node's id."""
    from ray._private.state import actors

    return {a["Name"].split(":")[3]: a["Address"]["NodeID"] for a in actors().values()
            if a["State"] == "ALIVE" and (a["Name"] or "").startswith(f"raytf:{run}:")}


def test_four_ps_workers_and_two_parameter_servers_on_three_nodes_lose_a_workers_node_and_the_ps_node(
        cluster, tmp_path, no_leaks):
    """Parameter servers past two workers: a chief, 4 workers (two on each of two nodes,
    ``resources_per_worker``) and 2 parameter servers (on a third, ``resources_per_ps``), a custom
    loop over each worker's stream. In epoch 1 a workers' node is lost with its two workers, and an
    autoscaler's node takes its place: both workers are replaced (in place, or by a restart of the
    group where the coordinator cannot reach a replacement: test_parameter_server.py's moved
    worker). In epoch 2 the parameter servers' node is lost: the group restarts from the last
    checkpoint on the node added in its place. Every row of each worker's stream trains once per
    pass, up to the stated bound of one batch again per worker lost in a step."""
    from tests.integration.test_parameter_server import SMALL, assert_every_row_once_per_pass, read, train_data

    workers = [cluster.add_node(num_cpus=2, resources={"ps_scale_worker": 2}) for _ in range(2)]
    ps = cluster.add_node(num_cpus=1, resources={"ps_scale_ps": 2})  # full with the two: the chief goes elsewhere
    added = [*workers, ps]
    (tmp_path / "out").mkdir()
    config = {"epochs": 3, "steps": 100, "mark_epochs": [1, 2], "mark_any_attempt": True, "count_rows": 2048,
              "per_pass": 2048 // 4 // 32, "dataset_fn": True, "out_dir": str(tmp_path / "out")}
    trainer = raytf.ParameterServerTrainer(
        workloads.ps_custom_loop, config=config, datasets={"train": train_data()},
        scaling=raytf.ParameterServerScaling(num_workers=4, num_ps=2, resources_per_worker={"ps_scale_worker": 1},
                                             resources_per_ps={"ps_scale_ps": 1}, **SMALL),
        run=raytf.RunConfig(name="ps-scale", storage_path=str(tmp_path / "runs"), verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=6, hang_timeout_s=90)),
    )
    seen = {}
    try:
        join = in_background(trainer)
        wait_for((tmp_path / "out" / "mark-1.json").exists, 300, "epoch 1 to be scheduled")
        seen["first"] = live_tasks("ps-scale")
        lost = workers[0]
        seen["lost_workers"] = sorted(t for t, node in seen["first"].items() if node == lost.node_id)
        cluster.remove_node(lost)
        added.remove(lost)
        added.append(cluster.add_node(num_cpus=2, resources={"ps_scale_worker": 2}))  # the autoscaler's replacement
        wait_for((tmp_path / "out" / "mark-2.json").exists, 400, "epoch 2 to be scheduled")
        seen["second"] = live_tasks("ps-scale")
        cluster.remove_node(ps)
        added.remove(ps)
        added.append(cluster.add_node(num_cpus=1, resources={"ps_scale_ps": 2}))
        result = join()
    finally:
        for node in added:
            cluster.remove_node(node)
    # Two workers on each workers' node, both parameter servers on theirs.
    first = seen["first"]
    assert len(seen["lost_workers"]) == 2, first
    assert {first[f"ps-{i}"] for i in range(2)} == {ps.node_id}
    assert sorted(sum(node == w.node_id for node in first.values()) for w in workers) == [2, 2]
    assert {seen["second"][f"ps-{i}"] for i in range(2)} == {ps.node_id}
    failures = [(f.task, f.kind) for f in result.failures]
    for task in seen["lost_workers"]:
        assert (task.replace("-", " "), raytf.FailureKind.DIED) in failures, failures
    assert any(task.startswith("ps ") and kind == raytf.FailureKind.DIED for task, kind in failures), failures
    assert result.history[-1]["epoch"] == config["epochs"] - 1
    restarts = [[h for h in result.history if h["attempt"] == a] for a in range(1, result.attempts)]
    assert any(restarts)  # the lost ps restarted the group, from a checkpoint
    # The restart kept the workers' processes, their servers serving the new chief as the same
    # tasks, and started the chief and the parameter servers anew (FailureConfig.keep_survivors):
    # the two never lost, CPU workers outside the placement group, always. Each of the lost node's
    # replacements too, where its server was serving when the ps was lost (the test waits for
    # epoch 2, not for them: one may still be starting, and is started anew) and the restart kept
    # the old placement group, in whose bundles they run (Ray had placed the lost ps's bundles on
    # the new node by then); where it made a new one, they ended with the old.
    assert 2 <= result.startup[-1]["kept_processes"] <= 4, result.startup
    for resumed in filter(None, restarts):
        assert resumed[0]["resumed_at"] >= 1, resumed
    lost = {int(task.split("-")[1]): 1 for task in seen["lost_workers"]}
    # Workers step at their own pace (the replacements lose time): each finished at least one pass.
    assert_every_row_once_per_pass(read(tmp_path, "rows.json"), workers=4, per_pass=config["per_pass"], batch=32,
                                   passes=1, lost_commits=lost)

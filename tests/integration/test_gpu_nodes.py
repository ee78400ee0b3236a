"""Workers on GPU nodes, for real in Ray, on a machine without GPUs: the nodes declare GPUs
(as `ray start --num-gpus` can), Ray assigns them and sets CUDA_VISIBLE_DEVICES, and
TensorFlow, finding no CUDA driver, trains on the CPU."""

from __future__ import annotations

import json

import pytest

import raytf
from tests import workloads

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gpu_nodes(cluster):
    nodes = [cluster.add_node(num_cpus=2, num_gpus=4) for _ in range(2)]
    cluster.wait_for_nodes()
    yield {n.node_id for n in nodes}
    for node in nodes:
        cluster.remove_node(node)


def test_gpu_workers_get_gpu_nodes_their_own_gpus_and_standbys_that_take_the_gpus_of_their_bundles(
        gpu_nodes, tmp_path, no_leaks, monkeypatch):
    """3 workers of 2 GPUs on two nodes of 4: two ranks on one node, one on the other, and only on
    the GPU nodes, though the CPU nodes have CPUs free. Each sees the GPUs Ray assigned to it and no
    other. GPU workers get warm standbys by default (FailureConfig.warm_standby="auto"), started
    with the attempt's workers: rank 1 fails before any step or report, once they are up (were
    they started only once the attempt trained, it would wait for ever). A standby reserves no GPU
    (Ray assigns it none); the retry runs in the standbys, each seeing exactly the GPUs its
    bundle's worker had before (CUDA_VISIBLE_DEVICES). Standby 1's TensorFlow has listed its
    devices first (as train_fn's modules may when imported), so it cannot take GPUs: its bundle
    starts a cold worker instead, with a warning, and no attempt is lost to it. The retry trains:
    one TF_CONFIG task per worker, however many GPUs it holds (its GPUs are its own replicas),
    NCCL all-reduces (communication="auto" with GPUs), ranks contiguous on each node and local
    ranks counted within it."""
    from raytf._internal.driver import warm

    monkeypatch.setattr(warm, "_WARM_AFTER_S", 3600.0)  # no standby for a silent loop's sake
    workers = 3
    result = raytf.Trainer(
        workloads.exit_after_warm_up,
        config={"out_dir": str(tmp_path), "warm_standbys": workers, "standbys_at_start": True,
                "devices_in_standby": True},
        scaling=raytf.ScalingConfig(num_workers=workers, gpus_per_worker=2, cpus_per_worker=1),
        run=raytf.RunConfig(name="warm-gpu", storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=1)),
    ).fit()
    assert result.attempts == 2 and len(result.failures) == 1 and result.history[-1]["epoch"] == 3

    def info(attempt, rank):
        return json.loads((tmp_path / f"attempt{attempt}_rank{rank}.json").read_text())

    first = [info(0, r) for r in range(workers)]
    retry = [info(1, r) for r in range(workers)]
    assert {b["node_id"] for b in first} == gpu_nodes  # the GPU nodes only, both of them
    # GPU workers and their standbys spawn (TensorflowConfig.start_method="auto"): no fork server.
    assert all(info["forkserver"] is None for info in first + retry)
    for before in first:  # each sees the 2 GPUs Ray assigned to it and no other
        assert len(before["ray_gpu_ids"]) == 2 and before["cuda_visible_devices"] == ",".join(before["ray_gpu_ids"])
    by_node = {}
    for rank, before in enumerate(first):
        by_node.setdefault(before["node_id"], []).append(rank)
    assert sorted(len(ranks) for ranks in by_node.values()) == [1, 2]
    for ranks in by_node.values():
        assert len({g for r in ranks for g in first[r]["ray_gpu_ids"]}) == 2 * len(ranks)  # no GPU shared
        assert ranks == list(range(ranks[0], ranks[0] + len(ranks)))  # ranks contiguous on a node
    assert all(after["pid"] not in {b["pid"] for b in first} for after in retry)
    standbys = [a for a in retry if ":standby:" in a["actor"]]
    [cold] = [a for a in retry if ":standby:" not in a["actor"]]  # standby 1 could not take its GPUs
    assert len(standbys) == workers - 1 and all(a["ray_gpu_ids"] == [] for a in standbys)  # no GPU of their own
    assert len(cold["ray_gpu_ids"]) == 2 and cold["cuda_visible_devices"] == ",".join(cold["ray_gpu_ids"])
    # The same GPUs on the same nodes, two per rank.
    assert sorted((a["node_id"], a["cuda_visible_devices"]) for a in retry) == sorted(
        (b["node_id"], b["cuda_visible_devices"]) for b in first)
    # The retry trained (small_train): one TF_CONFIG task per worker, each worker's 2 GPUs its own replicas.
    trained = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(workers)]
    for rank, seen in enumerate(trained):
        assert len(seen["tf_config"]["cluster"]["worker"]) == workers
        assert seen["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert len(seen["cuda_visible_devices"].split(",")) == 2
        assert seen["implementation"] == "NCCL"  # communication="auto" with GPUs
        ranks = by_node[seen["node_id"]]
        assert (seen["local_rank"], seen["local_world_size"]) == (ranks.index(rank), len(ranks))

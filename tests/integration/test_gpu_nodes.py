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
    nodes = [cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
    cluster.wait_for_nodes()
    yield {n.node_id for n in nodes}
    for node in nodes:
        cluster.remove_node(node)


def test_gpu_workers_get_gpu_nodes_and_their_own_gpus(gpu_nodes, tmp_path, no_leaks):
    """3 workers of 1 GPU: two ranks on one node, one on the other (workers of 2 GPUs each: the warm
    standby test below, whose group holds every GPU of both nodes)."""
    workers, gpus = 3, 1
    result = raytf.Trainer(
        workloads.gpu_worker, config={"out_dir": str(tmp_path)},
        scaling=raytf.ScalingConfig(num_workers=workers, gpus_per_worker=gpus, cpus_per_worker=1),
        run=raytf.RunConfig(name=f"gpu-{gpus}", storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(warm_standby=False)),  # no restart to warm
    ).fit()
    seen = [json.loads((tmp_path / f"gpu{r}.json").read_text()) for r in range(workers)]
    assert result.metrics["epoch"] == 1 and all(s["trained"] for s in seen)
    # Only GPU nodes, though the CPU nodes have CPUs free.
    assert {s["node_id"] for s in seen} <= gpu_nodes
    for s in seen:
        # Each sees the GPUs Ray assigned to it and no other.
        assert len(s["ray_gpu_ids"]) == gpus
        assert s["cuda_visible_devices"] == ",".join(s["ray_gpu_ids"])
        assert s["implementation"] == "NCCL"  # communication="auto" with GPUs
        # One TF_CONFIG task per worker, however many GPUs it holds: its GPUs are its own replicas.
        assert len(s["tf_config"]["cluster"]["worker"]) == workers
        assert s["tf_config"]["task"] == {"type": "worker", "index": s["world_rank"]}
    by_node = {}
    for s in seen:
        by_node.setdefault(s["node_id"], []).append(s)
    for ranks in by_node.values():
        assert len({g for s in ranks for g in s["ray_gpu_ids"]}) == gpus * len(ranks)  # no GPU shared
        # Ranks are contiguous per node and local ranks count within the node.
        world = sorted(s["world_rank"] for s in ranks)
        assert world == list(range(world[0], world[0] + len(world)))
        assert sorted(s["local_rank"] for s in ranks) == list(range(len(ranks)))
        assert all(s["local_world_size"] == len(ranks) for s in ranks)
    assert len(by_node) == 2


def test_warm_standbys_of_gpu_workers_take_the_gpus_of_the_bundles_they_are_handed(gpu_nodes, tmp_path, no_leaks,
                                                                                   monkeypatch):
    """Two workers of 2 GPUs each, one per node. GPU workers get warm standbys by default
    (FailureConfig.warm_standby="auto"), started with the attempt's workers: rank 1 fails before
    any step or report, once they are up (were they started only once the attempt trained, it
    would wait for ever). A standby reserves no GPU (Ray assigns it none); the retry runs in it,
    seeing exactly the GPUs that its bundle's worker had before (CUDA_VISIBLE_DEVICES). Standby
    1's TensorFlow has listed its devices first (as train_fn's modules may when imported), so it
    cannot take GPUs: its bundle starts a cold worker instead, with a warning, and no attempt is
    lost to it. The retry trains: one TF_CONFIG task per worker, however many GPUs it holds."""
    from raytf._internal.driver import warm

    monkeypatch.setattr(warm, "_WARM_AFTER_S", 3600.0)  # no standby for a silent loop's sake
    result = raytf.Trainer(
        workloads.exit_after_warm_up,
        config={"out_dir": str(tmp_path), "warm_standbys": 2, "standbys_at_start": True, "devices_in_standby": True},
        scaling=raytf.ScalingConfig(num_workers=2, gpus_per_worker=2, cpus_per_worker=1),
        run=raytf.RunConfig(name="warm-gpu", storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=1)),
        tensorflow=raytf.TensorflowConfig(communication="ring"),
    ).fit()
    assert result.attempts == 2 and len(result.failures) == 1 and result.history[-1]["epoch"] == 3

    def info(attempt, rank):
        return json.loads((tmp_path / f"attempt{attempt}_rank{rank}.json").read_text())

    first = [info(0, r) for r in range(2)]
    retry = [info(1, r) for r in range(2)]
    for before in first:  # each sees the 2 GPUs Ray assigned to it and no other
        assert len(before["ray_gpu_ids"]) == 2 and before["cuda_visible_devices"] == ",".join(before["ray_gpu_ids"])
    assert len({b["node_id"] for b in first}) == 2
    assert all(after["pid"] not in {b["pid"] for b in first} for after in retry)
    [standby] = [a for a in retry if ":standby:" in a["actor"]]
    [cold] = [a for a in retry if ":standby:" not in a["actor"]]  # standby 1 could not take its GPUs
    assert standby["ray_gpu_ids"] == []  # a standby reserves no GPU of its own
    assert len(cold["ray_gpu_ids"]) == 2 and cold["cuda_visible_devices"] == ",".join(cold["ray_gpu_ids"])
    # The same GPUs on the same nodes, two per rank.
    assert sorted((a["node_id"], a["cuda_visible_devices"]) for a in retry) == sorted(
        (b["node_id"], b["cuda_visible_devices"]) for b in first)
    # The retry trained (small_train): 2 TF_CONFIG tasks, each worker's 2 GPUs its own replicas.
    trained = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, seen in enumerate(trained):
        assert len(seen["tf_config"]["cluster"]["worker"]) == 2
        assert seen["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert len(seen["cuda_visible_devices"].split(",")) == 2 and seen["local_world_size"] == 1

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


@pytest.mark.parametrize("workers, gpus", [(4, 1), (2, 2)])
def test_gpu_workers_get_gpu_nodes_and_their_own_gpus(gpu_nodes, tmp_path, no_leaks, workers, gpus):
    result = raytf.Trainer(
        workloads.gpu_worker, config={"out_dir": str(tmp_path)},
        scaling=raytf.ScalingConfig(num_workers=workers, gpus_per_worker=gpus, cpus_per_worker=1),
        run=raytf.RunConfig(name=f"gpu-{gpus}", storage_path=str(tmp_path / "results"), verbose=0),
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
    by_node = {}
    for s in seen:
        by_node.setdefault(s["node_id"], []).append(s)
    for node, ranks in by_node.items():
        assert len({g for s in ranks for g in s["ray_gpu_ids"]}) == gpus * len(ranks)  # no GPU shared
        # Ranks are contiguous per node and local ranks count within the node.
        world = sorted(s["world_rank"] for s in ranks)
        assert world == list(range(world[0], world[0] + len(world)))
        assert sorted(s["local_rank"] for s in ranks) == list(range(len(ranks)))
        assert all(s["local_world_size"] == len(ranks) for s in ranks)
    assert len(by_node) == 2

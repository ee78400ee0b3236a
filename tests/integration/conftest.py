"""One Ray cluster for the whole integration session: two raylets on this machine.

Starting Ray and TensorFlow is slow here, so every integration test shares
this cluster; tests that need placement across nodes use its two nodes.
"""

from __future__ import annotations

import os
import time

import pytest

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def cluster():
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from tests import workloads

    cloudpickle.register_pickle_by_value(workloads)
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"node_a": 2}},
    )
    c.add_node(num_cpus=2, resources={"node_b": 2})
    c.wait_for_nodes()
    ray.init(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()


def wait_for(condition, timeout_s: float = 30.0, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {message}")
        time.sleep(0.2)


def live_workers() -> list:
    from ray.util.state import list_actors

    return list_actors(filters=[("class_name", "=", "TrainWorker"), ("state", "!=", "DEAD")])


def live_placement_groups() -> list:
    import ray

    return [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


@pytest.fixture
def no_leaks(cluster):
    """Asserts after the test that no worker actor and no placement group outlived its run."""
    yield
    wait_for(lambda: not live_workers(), message="every TrainWorker actor to be dead")
    wait_for(lambda: not live_placement_groups(), message="every placement group to be removed")

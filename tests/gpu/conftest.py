"""A Ray of its own on this machine, with its real GPUs, for the GPU tier (tests/gpu)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gpus():
    """The GPUs this machine's Ray sees (at least one, or the test fails: the tier is for GPU machines)."""
    import ray
    from ray import cloudpickle

    from tests import workloads

    cloudpickle.register_pickle_by_value(workloads)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    count = int(ray.cluster_resources().get("GPU", 0))
    if count < 1:
        ray.shutdown()
        pytest.fail("the GPU tier needs a machine whose Ray sees a GPU; this one has none")
    yield count
    ray.shutdown()

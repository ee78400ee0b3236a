"""One Ray cluster for the whole integration session: two raylets on this machine.

Starting Ray and TensorFlow is slow here, so every integration test shares
this cluster; tests that need placement across nodes use its two nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import time

import pytest

from tests.hidden import hiding
from tests.ports import free_port

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# The Ray Train anchors of test_ray_train_compat are Ray Train V2, Ray's default from 2.51; on the
# oldest Ray raytf supports (2.50) it is opt-in. Set before the cluster starts: its workers inherit it.
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
# Ray's GCS asks each raylet whether it is alive every health_check_period_ms (3 s by default) and
# counts a node dead after 5 failed asks in a row: a crashed node (a killed raylet refuses at once)
# is then known about 15 s late, waited for by every test that takes a node away. Asked every
# second, it is known in about 5; a live node still has Ray's 10 s to answer each ask.
os.environ.setdefault("RAY_health_check_period_ms", "1000")
# Ray's log monitor, which sends the workers' output to the test's driver, lists its node's log
# directory (six globs) every 0.1 s while it follows fewer than this many files, and every 0.5 s
# past it. A pytest process's workers leave some 500 files there by the end of the suite, and a
# listing of them then took 1.9 ms of CPU: 2% of a core at ten a second (the two log monitors of a
# whole run used 36 CPU-seconds, 2026-11-29). Listed every 0.5 s from the start, a new worker's
# first lines reach the driver at most half a second later.
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
# Credentials for the loopback S3 server (s3_filesystem), where AWS's clients look for them, as on a
# machine set up for S3: a storage URI (s3_uri) then needs no secret. Set before the cluster
# starts, so its workers have them too; no metadata server to ask on this machine.
for _name, _value in (("AWS_ACCESS_KEY_ID", "raytf-test"), ("AWS_SECRET_ACCESS_KEY", "raytf-test"),
                      ("AWS_EC2_METADATA_DISABLED", "true")):
    os.environ.setdefault(_name, _value)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster

    from tests import ray_train_examples, workloads

    cloudpickle.register_pickle_by_value(workloads)
    cloudpickle.register_pickle_by_value(ray_train_examples)
    hidden = tmp_path_factory.mktemp("hidden")

    class HidingCluster(Cluster):
        """Every node, the head and those a test adds later (the scale tier's, the GPU nodes), runs
        its processes without the test-only packages (tests/hidden.py). A node's raylet, and every
        worker it starts, takes the environment of the moment it is added: a node added outside
        the hiding imported scikit-learn, SciPy and matplotlib with TensorFlow in each worker."""

        def add_node(self, wait: bool = True, **node_args):
            with _without_test_only_packages(hidden):
                return super().add_node(wait=wait, **node_args)

    agent = free_port()
    c = HidingCluster(
        initialize_head=True,
        # Ports of its own, so that clusters of parallel test processes (pytest -n) never meet.
        # No dashboard: raytf needs none, and its processes polled all session long.
        head_node_args={"num_cpus": 2, "resources": {"node_a": 2}, "include_dashboard": False,
                        "dashboard_agent_listen_port": agent},
    )
    # The driver (this process) joins before the second node exists, so its raylet is the head's:
    # with several raylets on one address Ray 2.50 may hand a driver any of them, and a test that
    # removes the second node then took the driver (and this pytest process) down with it.
    ray.init(address=c.address)
    c.add_node(num_cpus=2, resources={"node_b": 2})
    c.wait_for_nodes()
    assert ray.get_runtime_context().get_node_id() == c.head_node.node_id
    yield c
    ray.shutdown()
    c.shutdown()


@contextlib.contextmanager
def _without_test_only_packages(directory):
    """Ray processes started meanwhile cannot import the packages of tests/hidden.py (the
    scikit-learn digits job, which needs one, runs on an end-to-end head)."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = hiding(directory, dict(os.environ))["PYTHONPATH"]
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def wait_for(condition, timeout_s: float = 30.0, message: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {message}")
        time.sleep(0.2)


@dataclasses.dataclass(frozen=True)
class Actor:
    name: str
    class_name: str
    state: str
    pid: int


_OPERATORS = {"=": operator.eq, "!=": operator.ne}


def actors(*filters: tuple) -> list[Actor]:
    """The actors of this process's cluster, every one it ever had, as its GCS lists them (the test
    cluster runs no dashboard, so no state API), kept where each ``(field, "=" or "!=", value)`` holds."""
    from ray._private.state import actors as actor_table

    every = [Actor(a["Name"], a["ActorClassName"], a["State"], a["Pid"]) for a in actor_table().values()]
    return [a for a in every if all(_OPERATORS[op](getattr(a, field), value) for field, op, value in filters)]


def live_workers() -> list:
    return actors(("class_name", "=", "TrainWorker"), ("state", "!=", "DEAD"))


def live_placement_groups() -> list:
    import ray

    return [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


def assert_no_leaks() -> None:
    """No worker actor and no placement group outlived its run."""
    wait_for(lambda: not live_workers(), message="every TrainWorker actor to be dead")
    wait_for(lambda: not live_placement_groups(), message="every placement group to be removed")


@pytest.fixture
def no_leaks(cluster):
    """Asserts after the test that no worker actor and no placement group outlived its run."""
    yield
    assert_no_leaks()


@pytest.fixture(scope="session")
def s3_uri(s3_filesystem):
    """The S3 server's bucket as a storage URI, the endpoint in its query; credentials from the
    environment, as AWS's clients read them."""
    return f"s3://raytf-test/uri?endpoint_override={_S3_ENDPOINT[0]}&scheme=http&region=us-east-1"


_S3_ENDPOINT: list = []


@pytest.fixture(scope="session")
def s3_filesystem(tmp_path_factory):
    """A real S3-compatible server (moto's server mode) on loopback, and a bucket on it."""
    import socket
    import subprocess
    import sys

    import pyarrow.fs as pafs

    port = free_port()
    _S3_ENDPOINT[:] = [f"127.0.0.1:{port}"]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )

    def answers():
        assert server.poll() is None, "moto_server exited; see moto.log"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_for(answers, timeout_s=60, message="the S3 server to listen")
    fs = pafs.S3FileSystem(
        access_key="raytf-test", secret_key="raytf-test", region="us-east-1",
        endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True,
    )
    fs.create_dir("raytf-test")
    yield fs
    server.terminate()
    server.wait(timeout=30)
    log.close()

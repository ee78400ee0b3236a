"""Under Ray's real autoscaler, with its fake multi-node provider: a head with no GPUs, GPU node
types from zero (cluster/local-fake-gpu.yaml), a job asking for GPU workers.

The autoscaler adds real Ray nodes (raylets on this machine that declare GPUs); raytf's
placement group is what makes it add them. A GPU node is then taken away mid-run (its raylet
killed, as a reclaimed spot instance would vanish); the autoscaler replaces it and the run
resumes from its checkpoint. The head is the tier's (``head``, conftest.py), which
test_job_submit.py's jobs share: its CPUs hold their workers, and no GPU node is up until a job asks
for GPU workers.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.e2e.conftest import dashboard_get, processes_of
from tests.e2e.test_job_submit import job_status, printed, submit_no_wait, wait_for_job

pytestmark = pytest.mark.autoscaler


def take_away(node_id: str) -> None:
    """Kill every process of a node (its raylet, its workers, its agents), as a vanished VM would."""
    [raylet] = processes_of(f"--node_id={node_id}")
    with open(f"/proc/{raylet}/cmdline", "rb") as f:
        words = f.read().decode().split("\0")
    socket = next(w.split("=", 1)[1] for w in words if w.startswith("--raylet_socket_name="))
    for pid in set(processes_of(socket)) | {raylet}:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def nodes(address: str) -> list[dict]:
    """Every node of the cluster whose dashboard is at ``address`` (Ray's state API over HTTP)."""
    answer = dashboard_get(address, "/api/v0/nodes?detail=true&limit=10000")
    assert answer is not None, "the head's dashboard stopped answering"
    return answer["data"]["result"]["result"]


def test_gpu_workers_make_the_autoscaler_add_nodes_and_a_lost_node_is_replaced(head, tmp_path):
    address = head[0]
    assert not any(n["resources_total"].get("GPU") for n in nodes(address) if n["state"] == "ALIVE")  # no GPU yet
    results = tmp_path / "results"
    job_id = submit_no_wait(
        head[:2], tmp_path, "train_mlp.py", "--num-workers", "2", "--gpus-per-worker", "1",
        "--rows", "32768", "--epochs", "6", "--name", "autoscaled", "--storage-path", str(results),
    )
    deadline = time.monotonic() + 300

    def still_running() -> None:  # a job that failed at once (an import, a flag) says so now, not in 300 s
        if job_status(head[:2], job_id) != "running":
            raise AssertionError(wait_for_job(head[:2], job_id)[1][-4000:])

    while not (gpu_nodes := [n for n in nodes(address) if n["state"] == "ALIVE" and n["resources_total"].get("GPU")]):
        assert time.monotonic() < deadline, "the autoscaler added no GPU node in 300 s"
        still_running()
        time.sleep(1)
    index = results / "autoscaled" / "checkpoints" / "index.json"
    while not (index.exists() and json.loads(index.read_text())["checkpoints"]):
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        still_running()
        time.sleep(0.2)
    lost = gpu_nodes[0]["node_id"]
    take_away(lost)
    status, logs = wait_for_job(head[:2], job_id, timeout_s=600)
    assert status == "succeeded", logs[-4000:]
    # The README's job printed its result and where its run lives.
    assert printed(logs)["final_metrics"]["epoch"] == 5 and printed(logs)["path"] == str(results / "autoscaled")
    assert "starting 2 workers" in logs
    after = [n for n in nodes(address) if n["state"] == "ALIVE"]
    assert not any(n["node_id"] == lost for n in after)
    before = {g["node_id"] for g in gpu_nodes}
    assert any(n["resources_total"].get("GPU") and n["node_id"] not in before for n in after)  # replaced
    history = json.loads((results / "autoscaled" / "history.json").read_text())
    assert [h["epoch"] for h in history] == list(range(6))
    resumed = [h for h in history if h["attempt"] == 1]
    assert resumed, "the run did not restart after the node was lost"
    committed_before = max(h["epoch"] for h in history if h["attempt"] == 0)
    assert resumed[0]["epoch"] == committed_before + 1  # from its checkpoint, not from scratch
    assert "the autoscaler can add gpu_1x or gpu_2x nodes, so the group waits" in logs

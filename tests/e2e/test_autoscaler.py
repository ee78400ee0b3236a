"""Under Ray's real autoscaler, with its fake multi-node provider: a head with no GPUs, GPU node
types from zero (cluster/local-fake-gpu.yaml), a job asking for GPU workers.

The autoscaler adds real Ray nodes (raylets on this machine that declare GPUs); raytf's
placement group is what makes it add them. A GPU node is then taken away mid-run (its raylet
killed, as a reclaimed spot instance would vanish); the autoscaler replaces it and the run
resumes from its checkpoint. The head is a `ray start --head --block` child on free ports, and
every process of this cluster is found by its GCS address and stopped afterwards, so the test
never touches another Ray on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.ports import free_ports
import yaml

from tests.e2e.conftest import activated
from tests.hidden import hiding
from tests.e2e.test_job_submit import (
    HEAD_ENV, REPO, dashboard_get, head_temp_dir, job_status, printed, ray_cli, submit_no_wait,
    wait_for_job, wait_for_job_server,
)

pytestmark = pytest.mark.autoscaler


def processes_of(gcs_address: str) -> list[int]:
    pids = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if gcs_address.encode() in f.read():
                    pids.append(int(pid))
        except (OSError, ValueError):
            continue
    return pids


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


@pytest.fixture
def autoscaling_head(tmp_path, wheel_python):
    from ray._private.services import get_node_ip_address

    ip = get_node_ip_address()
    ports = dict(zip(("gcs", "dashboard", "client", "agent"), free_ports(4)))
    gcs = f"{ip}:{ports['gcs']}"
    with open(os.path.join(REPO, "cluster", "local-fake-gpu.yaml")) as f:
        config = yaml.safe_load(f)
    config["provider"]["gcs_address"] = gcs  # the fake nodes join this head, not one on 6379
    config_path = tmp_path / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "head.log", "w")
    temp_dir = head_temp_dir()  # nothing outside the suite finds this head (test_job_submit.py)
    # The autoscaler looks at the cluster every second (5 s by default) and the GCS asks its nodes
    # whether they are alive every second (3 s): the node added at the start and the one replaced
    # after the test takes one away come that much sooner (tests/integration/conftest.py).
    env = {**HEAD_ENV, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "token", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_health_check_period_ms": "1000"}
    # With RAY_AUTH_MODE=token the head needs a token to exist (a bare `ray start` makes one, as
    # the job-submit head does); on a fresh machine there is none yet.
    generated = ray_cli("get-auth-token", "--generate", env=env)
    assert generated.returncode == 0, generated.stderr[-2000:]
    head = subprocess.Popen(
        [wheel_python, "-m", "ray.scripts.scripts",  # raytf from its wheel (conftest.py): the quick start runs on it
         "start", "--head", "--block", f"--autoscaling-config={config_path}", "--num-cpus", "1",
         "--num-gpus", "0", "--port", str(ports["gcs"]), "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(ports["dashboard"]), "--ray-client-server-port", str(ports["client"]),
         "--dashboard-agent-listen-port", str(ports["agent"]), "--temp-dir", temp_dir],
        stdout=log, stderr=subprocess.STDOUT, env=activated(hiding(tmp_path / "hidden", env), wheel_python),
    )
    address = f"http://127.0.0.1:{ports['dashboard']}"
    wait_for_job_server(head, address)
    try:
        # The autoscaler's monitor publishes its first status (what `ray status` shows) seconds after
        # the head's job server answers, later on a loaded machine; a job submitted before then finds
        # no autoscaler on the cluster, and raytf cannot say which node types its group waits for.
        deadline = time.monotonic() + 120
        while not ((dashboard_get(address, "/api/cluster_status") or {}).get("data") or {}).get("clusterStatus"):
            assert head.poll() is None, "ray start --head exited early; see head.log"
            assert time.monotonic() < deadline, "the autoscaler published no status in 120 s"
            time.sleep(0.5)
        yield address, env, gcs
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=90)
        finally:
            for pid in processes_of(gcs):  # the fake nodes the autoscaler started
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            log.close()
            shutil.rmtree(temp_dir, ignore_errors=True)


def test_gpu_workers_make_the_autoscaler_add_nodes_and_a_lost_node_is_replaced(autoscaling_head, tmp_path):
    address, _, _ = autoscaling_head
    assert not any(n["resources_total"].get("GPU") for n in nodes(address) if n["state"] == "ALIVE")  # no GPU yet
    results = tmp_path / "results"
    # The job materializes its data on the head (1 CPU) before fit(). Ray Data asks the autoscaler
    # for more CPUs when a materialization keeps them busy for over 10 s (its rate-based cluster
    # autoscaler: `{'CPU': 1}: 2 from request_resources()` in the monitor's log), and on a loaded
    # machine the autoscaler then added a gpu_1x node before raytf's check ran, which rightly found
    # a live node and said nothing of waiting. The job's Ray Data makes no such request here, so the
    # first GPU node is the one raytf's placement group asks for.
    no_data_scaling = ["env", "RAY_DATA_MIN_GAP_BETWEEN_AUTOSCALING_REQUESTS=1000000000"]
    # No warm standbys (on by default for GPU workers: a process per worker from the start, and again
    # after the restart): the autoscaler's part is the nodes; standbys on GPU nodes are test_gpu_nodes.py's.
    job_id = submit_no_wait(
        autoscaling_head[:2], tmp_path, "train_mlp.py", "--num-workers", "2", "--gpus-per-worker", "1",
        "--rows", "16384", "--epochs", "6", "--name", "autoscaled", "--storage-path", str(results),
        "--warm-standby", "off", prefix=no_data_scaling,
    )
    deadline = time.monotonic() + 300

    def still_running() -> None:  # a job that failed at once (an import, a flag) says so now, not in 300 s
        if job_status(autoscaling_head[:2], job_id) != "running":
            raise AssertionError(wait_for_job(autoscaling_head[:2], job_id)[1][-4000:])

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
    status, logs = wait_for_job(autoscaling_head[:2], job_id, timeout_s=600)
    assert status == "succeeded", logs[-4000:]
    # The README's job printed its result and where its run lives.
    assert printed(logs)["final_metrics"]["epoch"] == 5 and printed(logs)["path"] == str(results / "autoscaled")
    assert "starting 2 workers" in logs
    after = [n for n in nodes(address) if n["state"] == "ALIVE"]
    assert not any(n["node_id"] == lost for n in after)
    before = {g["node_id"] for g in gpu_nodes}
    assert any(n["resources_total"].get("GPU") and n["node_id"] not in before for n in after)  # replaced
    # history.json has every report of rank 0; the committed ones name their checkpoint. Every
    # epoch was committed once. The node goes while training goes on: a report made as it went
    # may be in the history without a checkpoint (its upload went with the node), and the restart
    # trains that epoch again (seen in a fresh-clone run: epoch 2 reported in attempt 0, committed
    # in attempt 1).
    history = json.loads((results / "autoscaled" / "history.json").read_text())
    committed = [h for h in history if "checkpoint" in h]
    assert [h["epoch"] for h in committed] == list(range(6)), history
    # The restart after the loss is the last attempt that reported. (On a loaded machine an attempt
    # has failed before its first report, as its workers took too long to start: the history then
    # begins at attempt 1.)
    attempts = sorted({h["attempt"] for h in history})
    assert len(attempts) >= 2, "the run did not restart after the node was lost"
    resumed = [h for h in history if h["attempt"] == attempts[-1]]
    committed_before = max(h["epoch"] for h in committed if h["attempt"] < attempts[-1])
    assert resumed[0]["epoch"] == committed_before + 1  # from its checkpoint, not from scratch
    # A report without its checkpoint is one the loss cut off: past the last committed epoch.
    assert all(h["attempt"] < attempts[-1] and h["epoch"] > committed_before
               for h in history if "checkpoint" not in h), history
    assert "the autoscaler can add gpu_1x or gpu_2x nodes, so the group waits" in logs

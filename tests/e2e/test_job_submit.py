"""End to end: a head started with `ray start --head` on loopback, the jobs of jobs/ submitted with
`ray job submit`, their status and logs read back, the head stopped (the README's job, train_mlp.py,
is the one test_autoscaler.py submits to an autoscaling head).

The head runs with --block in a child process on free ports and a --temp-dir of its own, and is
stopped by terminating that process, so the test never touches another Ray on the machine (as a
bare `ray stop` would), and nothing outside the suite sees it: Ray records a head it starts in
<temp dir>/ray_current_cluster, where a user's bare `ray.init()` would find it in the default one.

A job is submitted one of the two ways a cluster runs one: with its folder uploaded
(`--working-dir`, as the guides submit them: the digits job, raytf launch, and the README's job in
test_autoscaler.py), or as a file the cluster's machines already hold (an image with the jobs in
it: the Keras and parameter-server jobs). The second starts its workers without a runtime
environment: Ray's prestarted worker processes take them, where each worker of an uploaded folder
is a new process that sets the environment up first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from tests.e2e.conftest import activated
from tests.hidden import TEST_ONLY, hiding
from tests.ports import free_ports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY = [sys.executable, "-m", "ray.scripts.scripts"]


# A head told to stop (SIGTERM) drains its node first, for up to 30 s on Ray 2.60; the tests'
# heads have nothing to hand over, so they stop at once.
HEAD_ENV = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            # Every process of the head's (a submitted job's driver among them) gives up on a GCS
            # that has not answered for this long (Ray's default, 60 s): on a loaded 2-CPU machine a
            # job's driver once did, while the head's GCS was starved, and the job failed.
            "RAY_gcs_rpc_server_coordinator_timeout_s": "300"}


def ray_cli(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*RAY, *args], env=env, capture_output=True, text=True, timeout=timeout)


def dashboard_get(address: str, path: str) -> dict | None:
    """GET ``path`` from the head's dashboard with the cluster's token (where `ray start` keeps it,
    as `ray job` does with RAY_AUTH_MODE=token); None while the dashboard does not answer.

    The tests poll through this rather than the `ray` CLI: each CLI call is a Python process that
    imports Ray, about a second of CPU, and a job polled every two seconds that way took half a
    core of this 2-core machine from the training it waits on."""
    try:
        token = os.environ.get("RAY_AUTH_TOKEN") or open(
            os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")).read().strip()
        request = urllib.request.Request(address + path, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)
    except (OSError, ValueError):  # no token yet, not listening yet, an HTTP error, a half answer
        return None


def wait_for_job_server(head: subprocess.Popen, address: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while dashboard_get(address, "/api/jobs/") is None:
        assert head.poll() is None, "ray start --head exited early; see head.log"
        assert time.monotonic() < deadline, f"the head's job server did not come up in {timeout_s:g} s"
        time.sleep(0.5)


def head_temp_dir() -> str:
    """A --temp-dir of the head's own, short (Ray's socket paths under it must stay under 108 bytes)."""
    return tempfile.mkdtemp(prefix="raytf-e2e-")


def names_the_head(port: int) -> bool:
    """Whether the machine's default record of its current Ray head names a head on ``port``."""
    current = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
    return os.path.exists(current) and open(current).read().strip().endswith(f":{port}")


@pytest.fixture(scope="module")
def head(tmp_path_factory, wheel_python):
    ports = dict(zip(("gcs", "dashboard", "client", "agent"), free_ports(4)))
    log = open(tmp_path_factory.mktemp("head") / "head.log", "w")
    temp_dir = head_temp_dir()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    # `ray start` turns token authentication on only where a token exists (a ray.init() that
    # started a local cluster made one); on a fresh machine none does yet: make it, as Ray says.
    generated = ray_cli("get-auth-token", "--generate", env=env)
    assert generated.returncode == 0, generated.stderr[-2000:]
    hidden = tmp_path_factory.mktemp("hidden")
    process = subprocess.Popen(
        [
            wheel_python, "-m", "ray.scripts.scripts",  # raytf from its wheel (conftest.py)
            "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
            "--port", str(ports["gcs"]), "--dashboard-host", "127.0.0.1",
            "--dashboard-port", str(ports["dashboard"]),
            "--ray-client-server-port", str(ports["client"]),
            # Room for two jobs of two 1-CPU workers at once: the tests submit pairs of jobs together.
            "--dashboard-agent-listen-port", str(ports["agent"]), "--num-cpus", "4", "--temp-dir", temp_dir,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its processes go without the test-only packages (tests/hidden.py), which Keras would import
        # with TensorFlow in every worker; the digits job's driver, which loads its data with
        # scikit-learn, is given them back (DIGITS_DRIVER).
        env=activated(hiding(hidden / "all", {**HEAD_ENV, "RAY_AUTH_MODE": "token"}), wheel_python),
    )
    address = f"http://127.0.0.1:{ports['dashboard']}"
    digits_path = hiding(hidden / "digits", dict(os.environ), tuple(n for n in TEST_ONLY if n not in ("sklearn", "scipy")))
    try:
        wait_for_job_server(process, address)
        yield address, env, ports["gcs"], ["env", f"PYTHONPATH={digits_path['PYTHONPATH']}"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=90)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit_no_wait(head, tmp_path, script: str, *args: str, uploaded: bool = True, prefix: tuple = ()) -> str:
    """Submit ``jobs/<script>`` with ``args``; returns the job id. ``uploaded``: jobs/ as the job's
    working dir (``--working-dir``), else the script by its path on the cluster's machine (this
    one). ``prefix``: words before ``python`` in the entrypoint (``env VAR=...``)."""
    address, env = head[:2]
    workdir = tmp_path / "job"
    if not workdir.exists():
        shutil.copytree(os.path.join(REPO, "jobs"), workdir)
    where = ["--working-dir", str(workdir)] if uploaded else []
    submitted = ray_cli(
        "job", "submit", "--address", address, *where, "--no-wait", "--",
        *prefix, "python", script if uploaded else str(workdir / script), *args, env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    return re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr).group(0)


def job_status(head, job_id: str) -> str:
    """"succeeded", "failed", "stopped", or "running" (for pending and running)."""
    job = dashboard_get(head[0], f"/api/jobs/{job_id}")
    assert job is not None, "the head's job server stopped answering"
    status = job["status"].lower()
    return status if status in ("succeeded", "failed", "stopped") else "running"


def wait_for_job(head, job_id: str, timeout_s: float = 300) -> tuple[str, str]:
    """Wait until the job ends; (its final status, its logs)."""
    address = head[0]
    deadline = time.monotonic() + timeout_s
    while (status := job_status(head, job_id)) == "running":
        assert time.monotonic() < deadline, f"job not done after {timeout_s:g} s"
        time.sleep(0.5)
    logs = dashboard_get(address, f"/api/jobs/{job_id}/logs")  # what `ray job logs` prints, read as it reads it
    assert logs is not None, "the head's job server stopped answering"
    return status, logs["logs"]


def printed(logs: str) -> dict:
    return json.loads(logs[logs.index("{\n") : logs.rindex("}") + 1])


def submit_together(head, tmp_path, jobs: dict[str, list[str]]) -> dict[str, tuple[str, dict]]:
    """Submit each ``name -> [script, *args]`` at once (each in a directory of its own under
    ``tmp_path``), as files the cluster's machines hold (no upload), then wait for all: name ->
    (its logs, what it printed). The head runs them side by side, as a cluster runs several users'
    jobs; each job's wait for its processes to start is the other's time to train."""
    ids = {}
    for name, (script, *args) in jobs.items():
        (tmp_path / name).mkdir()
        ids[name] = submit_no_wait(head, tmp_path / name, script, *args, uploaded=False)
    out = {}
    for name, job_id in ids.items():
        status, logs = wait_for_job(head, job_id)
        assert status == "succeeded", f"{name}: {logs[-3000:]}"
        out[name] = (logs, printed(logs))
    return out


def test_submitted_keras_jobs_train(head, tmp_path):
    """Keras 3 (with two micro-batches a step) and tf-keras, one worker each, submitted together
    (both Keras paths on two workers, killed and resumed: tests/integration/test_keras.py; a
    submitted job on two workers: test_autoscaler.py's)."""
    workers = {"keras3": 1, "tf_keras": 1}
    jobs = {name: [script, "--epochs", "2", "--rows", "4096", "--name", "keras", "--num-workers", str(workers[name]),
                   "--storage-path", str(tmp_path / name / "results"), *extra]
            for name, script, extra in (("keras3", "train_keras3.py", ["--micro-batches", "2"]),
                                        ("tf_keras", "train_tf_keras.py", []))}
    for name, (logs, printed_) in submit_together(head, tmp_path, jobs).items():
        metrics = printed_["final_metrics"]
        assert metrics["epoch"] == 1 and metrics["step"] == 2 * 4096 // 256, name
        assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(metrics), name
        # ReportCallback checkpointed every epoch; CheckpointConfig(num_to_keep=2) kept both.
        index = json.loads((tmp_path / name / "results" / "keras" / "checkpoints" / "index.json").read_text())
        assert [c["epoch"] for c in index["checkpoints"]] == [0, 1], name
        assert f"starting {workers[name]} worker{'s' if workers[name] > 1 else ''} x" in logs, name


def test_the_job_server_still_requires_ray_auth_token_and_no_bare_ray_init_finds_the_head(head):
    address, env, gcs_port = head[:3]
    assert not names_the_head(gcs_port)  # a user's bare ray.init() on this machine never joins it
    anonymous = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
    listed = ray_cli("job", "list", "--address", address, env=anonymous)
    assert listed.returncode != 0
    assert "authentication" in (listed.stdout + listed.stderr).lower()


def test_a_stopped_job_submitted_again_by_name_resumes_from_its_checkpoint(head, tmp_path):
    address, env = head[:2]
    results = tmp_path / "results"
    # One worker each time: what is shown is the job's resume by name (two-worker jobs: the tests above).
    common = ["--name", "digits", "--storage-path", str(results), "--num-workers", "1"]
    first = submit_no_wait(head, tmp_path, "train_digits.py", "--epochs", "500", *common, prefix=head[3])
    index = results / "digits" / "checkpoints" / "index.json"
    deadline = time.monotonic() + 240
    while not (index.exists() and json.loads(index.read_text())["checkpoints"]):
        assert job_status(head, first) == "running", "the job ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint after 240 s"
        time.sleep(0.5)
    stopped = ray_cli("job", "stop", "--address", address, first, env=env)
    assert stopped.returncode == 0, stopped.stderr
    status, _ = wait_for_job(head, first, timeout_s=120)
    assert status == "stopped"
    done = max(c["epoch"] for c in json.loads(index.read_text())["checkpoints"])
    assert done < 499  # stopped mid-run
    epochs = max(done + 4, 12)
    status, logs = wait_for_job(head, submit_no_wait(head, tmp_path, "train_digits.py", "--epochs", str(epochs), *common,
                                                     prefix=head[3]))
    assert status == "succeeded", logs[-3000:]
    history = json.loads((results / "digits" / "history.json").read_text())
    second = [h for h in history if h["driver_start"] == 1]
    assert second[0]["epoch"] == done + 1  # resumed, not started over
    assert [h["epoch"] for h in second] == list(range(done + 1, epochs))
    assert printed(logs)["final_metrics"]["val_accuracy"] >= 0.95  # the job's stated accuracy


def test_raytf_launch_runs_under_ray_job_submit(head, tmp_path, wheel_python):
    address, env = head[:2]
    script = ("import json, os, raytf; c = json.loads(os.environ['TF_CONFIG']); "
              "print('rank', c['task']['index'], 'of', len(c['cluster']['worker']), 'raytf from', raytf.__file__)")
    workdir = tmp_path / "job"
    workdir.mkdir()
    submitted = ray_cli(
        "job", "submit", "--address", address, "--working-dir", str(workdir), "--no-wait", "--",
        "python", "-m", "raytf.cli", "launch", "--num-workers", "2", "--storage-path", str(tmp_path / "runs"),
        "--", "python", "-c", script, env=env,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr).group(0)
    status, logs = wait_for_job(head, job_id)
    assert status == "succeeded", logs[-3000:]
    assert "rank 0 of 2" in logs and "rank 1 of 2" in logs
    # The job ran the raytf of the wheel the head's virtualenv installed (conftest.py), not this checkout's.
    venv = os.path.dirname(os.path.dirname(wheel_python))
    assert logs.count(f"raytf from {venv}/lib/") == 2, logs[-3000:]


def test_submitted_parameter_server_jobs_train(head, tmp_path):
    """The custom-loop and the Keras parameter-server jobs, submitted together, one worker each
    (besides the chief, the parameter servers, and the custom loop's evaluator)."""
    jobs = {script: [script, "--epochs", "2", "--rows", "4096", "--steps-per-epoch", "40", "--num-workers", "1",
                     "--name", "ps", "--storage-path", str(tmp_path / script / "results")]
            for script in ("train_ps_custom_loop.py", "train_ps_keras.py")}
    for script, (logs, printed_) in submit_together(head, tmp_path, jobs).items():
        metrics = printed_["final_metrics"]
        assert metrics["epoch"] == 1 and metrics["loss"] > 0, script
        history = json.loads((tmp_path / script / "results" / "ps" / "history.json").read_text())
        assert [h["epoch"] for h in history if "evaluated_checkpoint" not in h] == [0, 1], script
        if script == "train_ps_custom_loop.py":  # its evaluator scored the last checkpoint
            assert history[-1]["evaluated_checkpoint"] == [h for h in history if "checkpoint" in h][-1]["checkpoint"]
        else:  # the kernel split across the two parameter servers
            assert "the first kernel lives in 2 parts across the ps" in logs
        assert "1 chief x" in logs and "ps x" in logs, script

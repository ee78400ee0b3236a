"""End to end: the jobs of jobs/ submitted with `ray job submit` to the tier's head (``head``,
conftest.py: `ray start --head` on this machine's address, under the autoscaler), their status and
logs read back (the README's job, train_mlp.py, is the one test_autoscaler.py submits, with GPU
workers the autoscaler adds nodes for)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time

from tests.e2e.conftest import REPO, dashboard_get, ray_cli


def names_the_head(port: int) -> bool:
    """Whether the machine's default record of its current Ray head names a head on ``port``."""
    current = os.path.join(tempfile.gettempdir(), "ray", "ray_current_cluster")
    return os.path.exists(current) and open(current).read().strip().endswith(f":{port}")


def submit_no_wait(head, tmp_path, script: str, *args: str) -> str:
    """Submit ``jobs/<script>`` with ``args`` (jobs/ as the working dir); returns the job id."""
    address, env = head[:2]
    workdir = tmp_path / "job"
    if not workdir.exists():
        shutil.copytree(os.path.join(REPO, "jobs"), workdir)
    submitted = ray_cli(
        "job", "submit", "--address", address, "--working-dir", str(workdir), "--no-wait", "--",
        "python", script, *args, env=env,
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


def submit(head, tmp_path, script: str, *args: str) -> tuple[str, dict]:
    """Submit ``jobs/<script>`` with ``args``; wait for it; return its logs and printed result."""
    status, logs = wait_for_job(head, submit_no_wait(head, tmp_path, script, *args))
    assert status == "succeeded", logs[-3000:]
    return logs, printed(logs)


def submit_together(head, tmp_path, jobs: dict[str, list[str]]) -> dict[str, tuple[str, dict]]:
    """Submit each ``name -> [script, *args]`` at once (each in a directory of its own under
    ``tmp_path``), then wait for all: name -> (its logs, what it printed). The head runs them side by
    side, as a cluster runs several users' jobs; each job's wait for its processes to start is
    the other's time to train."""
    ids = {}
    for name, (script, *args) in jobs.items():
        (tmp_path / name).mkdir()
        ids[name] = submit_no_wait(head, tmp_path / name, script, *args)
    out = {}
    for name, job_id in ids.items():
        status, logs = wait_for_job(head, job_id)
        assert status == "succeeded", f"{name}: {logs[-3000:]}"
        out[name] = (logs, printed(logs))
    return out


def test_submitted_keras_jobs_train_on_two_workers(head, tmp_path):
    """Keras 3 (with two micro-batches a step) and tf-keras, submitted together."""
    jobs = {name: [script, "--epochs", "2", "--rows", "4096", "--name", "keras",
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
        assert "starting 2 workers" in logs, name


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
    common = ["--name", "digits", "--storage-path", str(results)]
    first = submit_no_wait(head, tmp_path, "train_digits.py", "--epochs", "500", *common)
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
    status, logs = wait_for_job(head, submit_no_wait(head, tmp_path, "train_digits.py", "--epochs", str(epochs), *common))
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
    # One parameter server for the custom loop, two for Keras (whose kernel is split across them).
    jobs = {script: [script, "--epochs", "2", "--rows", "4096", "--steps-per-epoch", "40", "--num-workers", "1",
                     "--num-ps", str(num_ps), "--name", "ps", "--storage-path", str(tmp_path / script / "results")]
            for script, num_ps in (("train_ps_custom_loop.py", 1), ("train_ps_keras.py", 2))}
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

"""``raytf launch``: an unmodified TF_CONFIG script on Ray actors, driven from the command line
as a user runs it (its own process, connecting to the cluster through RAY_ADDRESS)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.integration.conftest import wait_for

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TUTORIAL = os.path.join(REPO, "tests", "scripts", "tf_tutorial.py")


def raytf(cluster, *args, wait=True):
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "PYTHONPATH": REPO}
    command = [sys.executable, "-m", "raytf.cli", *args]
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_the_keras_tutorial_script_runs_on_two_actors_and_resumes_from_its_backup(cluster, tmp_path, no_leaks):
    run_dir = tmp_path / "runs" / "tutorial"
    launched = raytf(cluster, "launch", "--num-workers", "2", "--keras", "tf_keras", "--max-failures", "1",
                     "--storage-path", str(tmp_path / "runs"), "--name", "tutorial", "--",
                     sys.executable, TUTORIAL, "--epochs", "4", "--epoch-sleep", "1", wait=False)
    log = run_dir / "epochs.log"
    wait_for(lambda: log.exists() and "attempt 0 epoch 1" in log.read_text(), 300, "two epochs of attempt 0")
    os.kill(int((run_dir / "pid1").read_text()), signal.SIGKILL)  # rank 1's script dies mid-run
    output, _ = launched.communicate(timeout=600)
    assert launched.returncode == 0, output[-3000:]
    lines = log.read_text().splitlines()
    first = [int(line.split()[3]) for line in lines if line.startswith("attempt 0 ")]
    resumed = [int(line.split()[3]) for line in lines if line.startswith("attempt 1 ")]
    # BackupAndRestore brought attempt 1 back to the epoch after its last backup, not to epoch 0.
    assert first[:2] == [0, 1] and resumed and resumed[0] > 0 and resumed[-1] == 3
    assert "(raytf rank 1" in output  # the script's output came through, prefixed by rank
    runs = raytf(cluster, "runs", "--storage-path", str(tmp_path / "runs"))
    assert runs.returncode == 0 and "tutorial: 1 driver start(s)" in runs.stdout


def test_each_rank_gets_its_own_tf_config_and_the_runs_directories_and_its_exit_status_is_launchs(
        cluster, tmp_path, no_leaks):
    """Each rank's script writes what it was given, then exits 3: raytf launch exits 3 too."""
    script = ("import json, os, sys; c = json.loads(os.environ['TF_CONFIG']); "
              "open(os.path.join(os.environ['RAYTF_RUN_DIR'], 'rank%d.json' % c['task']['index']), 'w').write("
              "json.dumps({'tf_config': c, 'checkpoints': os.environ['RAYTF_CHECKPOINT_DIR'], "
              "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')})); sys.exit(3)")
    done = raytf(cluster, "launch", "--num-workers", "2", "--storage-path", str(tmp_path), "--name", "env", "--",
                 sys.executable, "-c", script)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "exited with status 3" in done.stderr
    seen = [json.loads((tmp_path / "env" / f"rank{r}.json").read_text()) for r in range(2)]
    workers = seen[0]["tf_config"]["cluster"]["worker"]
    assert len(set(workers)) == 2
    for rank, info in enumerate(seen):
        assert info["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        assert info["checkpoints"] == str(tmp_path / "env" / "script_checkpoints")
        assert info["cuda"] == ""  # CPU workers see no GPU


@pytest.mark.parametrize("args, message", [
    (["launch", "--num-workers", "0", "--", "python", "x.py"], "num_workers must be >= 1, got 0"),
    (["launch", "--num-workers", "2"], "give the command to run after --"),
    (["launch", "--num-workers", "2", "--env", "NOEQUALS", "--", "python", "x.py"], "write NAME=VALUE"),
    (["launch", "--num-workers", "2", "--placement", "SIDEWAYS", "--", "python", "x.py"], "invalid choice"),
])
def test_bad_arguments_are_clear_errors(cluster, args, message):
    done = raytf(cluster, *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_version(cluster):
    import raytf as package

    done = raytf(cluster, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"raytf {package.__version__}"


def test_stopping_raytf_launch_stops_every_rank(cluster, tmp_path, no_leaks):
    script = ("import json, os, time; c = json.loads(os.environ['TF_CONFIG']); "
              "open(os.path.join(os.environ['RAYTF_RUN_DIR'], 'pid%d' % c['task']['index']), 'w')"
              ".write(str(os.getpid())); time.sleep(600)")
    launched = raytf(cluster, "launch", "--num-workers", "2", "--storage-path", str(tmp_path), "--name", "stopped",
                     "--", sys.executable, "-c", script, wait=False)
    pids = [tmp_path / "stopped" / f"pid{r}" for r in range(2)]
    wait_for(lambda: all(p.exists() for p in pids), 120, "both scripts to start")
    launched.send_signal(signal.SIGTERM)  # what `ray job stop` does to a driver
    launched.communicate(timeout=120)

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(lambda: all(gone(int(p.read_text())) for p in pids), 60, "every rank's script to end")


PS_TUTORIAL = os.path.join(REPO, "tests", "scripts", "tf_ps_tutorial.py")


def test_the_parameter_server_tutorial_runs_as_chief_workers_ps_and_evaluator(cluster, tmp_path, no_leaks):
    out = tmp_path / "out"
    out.mkdir()
    done = raytf(cluster, "launch", "--num-workers", "1", "--cpus-per-worker", "0.5", "--ps", "1", "--chief",
                 "--evaluator", "--cpus-per-ps", "0.5", "--storage-path", str(tmp_path / "runs"), "--name", "ps",
                 "--", sys.executable, PS_TUTORIAL, "--out", str(out), "--steps", "200")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    chief = json.loads((out / "chief.json").read_text())
    assert chief["steps"] == chief["scheduled"] == 200  # every scheduled step ran once, on the workers
    assert chief["last_loss"] < chief["first_loss"]
    cluster_spec = chief["tf_config"]["cluster"]
    assert {k: len(v) for k, v in cluster_spec.items()} == {"chief": 1, "worker": 1, "ps": 1}
    assert chief["tf_config"]["task"] == {"type": "chief", "index": 0}
    assert json.loads((out / "evaluator.json").read_text())["evaluated"]  # the evaluator task ran the script too


def test_chief_or_evaluator_without_ps_is_a_clear_error(cluster):
    done = raytf(cluster, "launch", "--num-workers", "2", "--evaluator", "--", "python", "x.py")
    assert done.returncode == 2 and "add --ps N" in done.stderr, done.stderr

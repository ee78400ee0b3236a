"""The fork server (raytf_forkserver.py) with real processes and no Ray: the client is started as Ray
would start a worker's interpreter, with a script standing in for Ray's worker script, and the
server preloads NumPy instead of TensorFlow (RAYTF_FORKSERVER_PRELOAD). What the driver asks Ray
for (driver/forkserver.py) and what the configs accept."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import raytf
import raytf_forkserver
from raytf._internal import env as _env
from raytf._internal.driver import forkserver
from raytf._internal.protocol import RunSpec, TensorflowSettings
from raytf._internal.worker.tensorflow import start_environment
from raytf.errors import ConfigError

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What a worker sees of itself, written where its first argument says; then it ends with the
# status its second argument names ("pause": it waits for a signal).
SCRIPT = """
import json, os, signal, sys
import numpy
fds = {fd: os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")}
mask = os.umask(0); os.umask(mask)
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump({"argv": sys.argv[1:], "cwd": os.getcwd(), "mark": os.environ.get("MARK"), "pid": os.getpid(),
               "ppid": os.getppid(), "forkserver": os.environ.get("RAYTF_FORKSERVER"),
               "own_session": os.getsid(0) == os.getpid(), "numpy_loaded_before": "numpy" in sys.modules,
               "draw": float(numpy.random.random()), "fds": sorted(fds.values()), "umask": mask,
               "path0": sys.path[0], "main": __name__}, f)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("out of", os.getpid(), flush=True)
if sys.argv[2] == "pause":
    signal.pause()
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def place(tmp_path):
    """(the script, the environment a client runs in, its working directory); every server started
    meanwhile is ended after the test."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="rtf-"))  # mode 0700; short, for the sockets' paths
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "worker_script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, _env.FORKSERVER_DIR: str(folder), raytf_forkserver.PRELOAD: "numpy", "MARK": "m",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    env.pop(_env.FORKSERVER, None)
    yield script, env, work
    for pid in _servers_listening_at(str(folder)):
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(folder)


def _servers_listening_at(path: str) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if path.encode() in f.read():
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def client(script, env, work, out, status="0", **kwargs):
    return subprocess.Popen([sys.executable, "-m", "raytf_forkserver", str(script), str(out), status],
                            env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_for_file(path, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_workers_forked_from_one_server_take_their_clients_arguments_environment_streams_and_status(place, tmp_path):
    script, env, work = place
    seen = []
    for n, status in enumerate(("3", "0")):
        started = client(script, env, work, tmp_path / f"w{n}.json", status)
        out, err = started.communicate(timeout=120)
        assert started.returncode == int(status), err
        seen.append(json.loads((tmp_path / f"w{n}.json").read_text()))
        assert out == f"out of {seen[-1]['pid']}\n"  # its stdout was its client's
    first, second = seen
    # One server for both (same parent, environment, directory): the parent of each, NumPy loaded
    # before the script ran, each worker in a session of its own.
    assert first["forkserver"] == second["forkserver"] == str(first["ppid"]) == str(second["ppid"])
    assert first["pid"] != second["pid"] and first["numpy_loaded_before"] and first["own_session"]
    assert "--serve" in open(f"/proc/{first['ppid']}/cmdline").read()
    # As `python <script> <args>` would run: its arguments, directory, environment, umask, __main__.
    assert first["argv"] == [str(tmp_path / "w0.json"), "3"] and first["cwd"] == str(work)
    assert first["mark"] == "m" and first["main"] == "__main__" and first["path0"] == str(tmp_path)
    mask = os.umask(0)
    os.umask(mask)
    assert first["umask"] == second["umask"] == mask
    assert first["draw"] != second["draw"]  # NumPy's global generator drawn from anew in each
    # Nothing of the server's (its socket, the other clients' connections, pidfds) is left open.
    assert not [fd for fd in first["fds"] + second["fds"] if fd.startswith(("socket:", "anon_inode:[pidfd]"))]


def test_another_environment_gets_a_server_of_its_own(place, tmp_path):
    script, env, work = place
    ones = [client(script, {**env, "MARK": mark}, work, tmp_path / f"{mark}.json") for mark in ("a", "b")]
    for one in ones:
        assert one.wait(timeout=120) == 0
    a, b = (json.loads((tmp_path / f"{mark}.json").read_text()) for mark in ("a", "b"))
    assert (a["mark"], b["mark"]) == ("a", "b") and a["forkserver"] != b["forkserver"]


def test_an_upgrade_of_what_a_server_preloaded_gets_a_new_server(place, tmp_path):
    script, env, work = place
    (tmp_path / "pre").mkdir()
    module = tmp_path / "pre" / "preloaded_here.py"
    module.write_text("LOADED = True\n")
    env = {**env, raytf_forkserver.PRELOAD: "numpy,preloaded_here",
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "pre"), env["PYTHONPATH"]])}
    servers = []
    for n in range(3):
        if n == 2:  # an upgrade installs the module anew
            os.utime(module, ns=(time.time_ns(), module.stat().st_mtime_ns + 10**9))
        assert client(script, env, work, tmp_path / f"w{n}.json").wait(timeout=120) == 0
        servers.append(json.loads((tmp_path / f"w{n}.json").read_text())["forkserver"])
    assert servers[0] == servers[1] != servers[2] and None not in servers


def test_a_signal_to_the_client_reaches_its_worker_and_the_client_ends_as_the_worker_did(place, tmp_path):
    script, env, work = place
    waiting = client(script, env, work, tmp_path / "w.json", "pause")
    worker = wait_for_file(tmp_path / "w.json")
    waiting.send_signal(signal.SIGTERM)
    assert waiting.wait(timeout=60) == -signal.SIGTERM
    assert not alive(worker["pid"])


def test_a_worker_killed_ends_its_client_by_the_same_signal(place, tmp_path):
    script, env, work = place
    waiting = client(script, env, work, tmp_path / "w.json", "pause")
    worker = wait_for_file(tmp_path / "w.json")
    os.kill(worker["pid"], signal.SIGKILL)  # as a test, or Ray, kills a worker by its registered pid
    assert waiting.wait(timeout=60) == -signal.SIGKILL
    assert "Traceback" not in waiting.stderr.read()


def test_a_killed_client_takes_its_worker_with_it(place, tmp_path):
    script, env, work = place
    waiting = client(script, env, work, tmp_path / "w.json", "pause")
    worker = wait_for_file(tmp_path / "w.json")
    waiting.kill()  # as Ray kills a worker's process that never registered
    waiting.wait(timeout=60)
    deadline = time.monotonic() + 60
    while alive(worker["pid"]):
        assert time.monotonic() < deadline, "the worker outlived its client"
        time.sleep(0.05)


def test_a_server_ends_with_the_process_that_started_its_first_client(place, tmp_path):
    script, env, work = place
    # A stand-in for the raylet: it starts a client and waits to be killed.
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, signal; "
         f"subprocess.run([sys.executable, '-m', 'raytf_forkserver', {str(script)!r}, {str(tmp_path / 'w.json')!r}, '0']); "
         "signal.pause()"], env=env, cwd=work)
    server = int(wait_for_file(tmp_path / "w.json")["forkserver"])
    assert alive(server)
    parent.kill()
    parent.wait(timeout=60)
    deadline = time.monotonic() + 60
    while alive(server):
        assert time.monotonic() < deadline, "the server outlived its raylet"
        time.sleep(0.05)
    assert not list(pathlib.Path(env[_env.FORKSERVER_DIR]).glob("*.sock"))  # its socket went with it


def test_a_folder_others_may_open_starts_the_worker_cold(place, tmp_path):
    script, env, work = place
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o755)
    open_folder.chmod(0o755)
    started = client(script, {**env, _env.FORKSERVER_DIR: str(open_folder)}, work, tmp_path / "w.json", "4")
    _, err = started.communicate(timeout=120)
    assert started.returncode == 4
    assert "only this user may open" in err and "this worker starts cold" in err
    cold = json.loads((tmp_path / "w.json").read_text())
    assert cold["forkserver"] is None and cold["pid"] == started.pid  # the client became the worker
    assert not list(open_folder.glob("*.sock"))


def test_a_server_that_fails_to_start_is_told_and_remembered_and_its_workers_start_cold(place, tmp_path):
    script, env, work = place
    env = {**env, raytf_forkserver.PRELOAD: "raytf_no_such_module"}
    for n in range(2):
        started = client(script, env, work, tmp_path / f"w{n}.json", "0")
        _, err = started.communicate(timeout=120)
        assert started.returncode == 0 and "this worker starts cold" in err
        assert json.loads((tmp_path / f"w{n}.json").read_text())["forkserver"] is None
        # The first client saw it end; the second, the note the first left, naming the server's log.
        assert ("ended before it listened" if n == 0 else "failed to start before") in err
    [log] = pathlib.Path(env[_env.FORKSERVER_DIR]).glob("*.log")
    assert "raytf_no_such_module" in log.read_text()


def test_the_worker_and_the_server_read_the_variables_raytf_names():
    assert (raytf_forkserver.FORKED_FROM, raytf_forkserver.FOLDER) == (_env.FORKSERVER, _env.FORKSERVER_DIR)


def _run(**tensorflow):
    settings = TensorflowSettings(communication="ring", collective_timeout_s=None, intra_op_threads=2,
                                  inter_op_threads=2, use_gpu=False, **tensorflow)
    return RunSpec(run_name="r", run_path="/tmp/r", payload=b"", tensorflow=settings)


def test_the_driver_starts_cpu_workers_through_the_fork_server_with_the_runs_start_environment():
    run = _run(keras="tf_keras", log_level="info", env={"MY_SETTING": "1"})
    options = forkserver.start_options(run, {"working_dir": "/w", "env_vars": {"A": "1"}})
    assert options["runtime_env"]["py_executable"] == f"{sys.executable} -m raytf_forkserver"
    env = options["runtime_env"]["env_vars"]
    assert env == start_environment(run)  # under which the server imports TensorFlow
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["MY_SETTING"] == "1" and env["TF_CPP_MIN_LOG_LEVEL"] == "0"
    # Not what TensorFlow reads once its context starts, nor the node's memory: the worker sets
    # those itself, and runs of other thread counts share a server.
    assert not {"TF_CPU_BFC_MEM_LIMIT_IN_MB", "TF_NUM_INTRAOP_THREADS", "OMP_NUM_THREADS"} & set(env)
    assert forkserver.start_options(_run(start_method="spawn"), {}) == {}


def test_a_job_whose_runtime_environment_sets_the_interpreter_spawns_its_workers_or_says_why_it_cannot_fork():
    for job in ({"pip": ["x"]}, {"conda": "env"}, {"py_executable": "python"}, {"image_uri": "i"}):
        assert forkserver.start_options(_run(), job) == {}
        with pytest.raises(ConfigError, match=f"start_method='forkserver'.*{next(iter(job))}.*'spawn'"):
            forkserver.start_options(_run(start_method="forkserver"), job)


def test_the_start_method_is_checked_and_gpu_workers_spawn():
    assert raytf.TensorflowConfig().start_method == "auto"
    assert raytf.TensorflowConfig(start_method="SPAWN").start_method == "spawn"
    with pytest.raises(ConfigError, match="start_method must be one of auto, forkserver, spawn"):
        raytf.TensorflowConfig(start_method="fork")
    gpus = raytf.ScalingConfig(num_workers=2, gpus_per_worker=1)
    assert raytf.TensorflowConfig()._resolve_start_method(gpus) == "spawn"
    assert raytf.TensorflowConfig()._resolve_start_method(raytf.ScalingConfig(num_workers=2)) == "auto"
    with pytest.raises(ConfigError, match="start_method='forkserver' is for CPU workers.*'auto' or 'spawn'"):
        raytf.TensorflowConfig(start_method="forkserver")._resolve_start_method(gpus)

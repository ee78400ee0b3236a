"""The end-to-end tier's head runs raytf as a cluster runs it: installed from its wheel, not from
this checkout.

``wheel_python`` builds raytf's wheel and sdist (``python -m build``, from the checkout's files),
checks both with ``twine check`` (what PyPI checks on upload), and installs the wheel, without
its dependencies, into a virtualenv over this environment's packages (TensorFlow, Ray and the rest,
as a cluster image would have them). The head (``head``) starts from that virtualenv's Python, so
every job it runs (the README's quick start among them) imports raytf from the wheel.

``head``: one ``ray start --head --block`` child for the whole tier, on free ports and a --temp-dir
of its own, under Ray's autoscaler with its fake multi-node provider (cluster/local-fake-gpu.yaml:
GPU node types from zero). test_job_submit.py's jobs run on the head's own CPUs;
test_autoscaler.py's job asks for GPU workers, and the autoscaler adds GPU nodes for them. One head,
not one per file: each is seconds of CPU to start and more to keep (its dashboard, agents, log and
autoscaler monitors), on a machine whose two cores the suite keeps busy. It is stopped by
terminating that process, and every process of its cluster is found by its GCS address and ended,
so the tier never touches another Ray on the machine (as a bare `ray stop` would); nothing outside
the suite sees it: Ray records a head it starts in <temp dir>/ray_current_cluster, where a user's
bare `ray.init()` would find it in the default one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest
import yaml

from tests.ports import free_ports

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*command: str, cwd: str) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv = root / "source", root / "dist", root / "venv"
    # The files a clone has (tracked, or new and not ignored): no build/ or egg-info of the checkout's.
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=REPO).splitlines()
    for name in listed:
        if os.path.isfile(os.path.join(REPO, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), source / name)
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), ".", cwd=str(source))
    built = sorted(p.name for p in dist.iterdir())  # the wheel, then the sdist
    assert len(built) == 2 and built[0].endswith("-py3-none-any.whl") and built[1].endswith(".tar.gz"), built
    checked = run(sys.executable, "-m", "twine", "check", "--strict", *(str(dist / b) for b in built), cwd=str(root))
    assert checked.count("PASSED") == 2, checked
    # No pip of its own (ensurepip is seconds of CPU): this environment's pip installs into it.
    run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv), cwd=str(root))
    python = str(venv / "bin" / "python")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet",
        str(dist / built[0]), cwd=str(root))
    # From any directory but the checkout, that Python's raytf is the wheel's (site-packages comes
    # before the editable install's finder), and the wheel's console script runs.
    found = run(python, "-c", "import raytf; print(raytf.__file__)", cwd=str(root)).strip()
    assert found.startswith(str(venv)), found
    assert run(str(venv / "bin" / "raytf"), "--version", cwd=str(root)).startswith("raytf ")
    return python


def activated(env: dict, python: str) -> dict:
    """``env`` with the virtualenv of ``python`` first on PATH, as its ``activate`` does: a job's
    entrypoint (``python train.py``) and a launched script's ``python`` are then its Python."""
    return {**env, "PATH": os.pathsep.join([os.path.dirname(python), env.get("PATH", "")]),
            "VIRTUAL_ENV": os.path.dirname(os.path.dirname(python))}


RAY = [sys.executable, "-m", "ray.scripts.scripts"]


# A head told to stop (SIGTERM) drains its node first, for up to 30 s on Ray 2.60; the tests'
# heads have nothing to hand over, so they stop at once.
HEAD_ENV = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
            # Every process of the head's (a submitted job's driver among them) gives up on a GCS
            # that has not answered for this long (Ray's default, 60 s): on a loaded 2-CPU machine a
            # job's driver once did, while the head's GCS was starved, and the job failed.
            "RAY_gcs_rpc_server_reconnect_timeout_s": "300"}


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




@pytest.fixture(scope="session")
def head(tmp_path_factory, wheel_python):
    """(dashboard address, environment for the `ray` CLI, GCS port, GCS address) of the tier's head."""
    from ray._private.services import get_node_ip_address

    ip = get_node_ip_address()
    root = tmp_path_factory.mktemp("head")
    ports = dict(zip(("gcs", "dashboard", "client", "agent"), free_ports(4)))
    gcs = f"{ip}:{ports['gcs']}"
    with open(os.path.join(REPO, "cluster", "local-fake-gpu.yaml")) as f:
        config = yaml.safe_load(f)
    config["provider"]["gcs_address"] = gcs  # the fake nodes join this head, not one on 6379
    # Room on the head for two jobs of two 1-CPU workers at once (test_job_submit.py submits pairs
    # together), said to the autoscaler too, so that it adds no node for what the head holds.
    config["available_node_types"]["ray.head.default"]["resources"]["CPU"] = HEAD_CPUS
    config_path = root / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = open(root / "head.log", "w")
    temp_dir = head_temp_dir()
    # The autoscaler looks at the cluster every second (5 s by default) and the GCS asks its nodes
    # whether they are alive every second (3 s): a node the autoscaler adds, and one it replaces
    # after a test takes one away, come that much sooner (tests/integration/conftest.py).
    env = {**HEAD_ENV, "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "token", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_health_check_period_ms": "1000"}
    # `ray start` turns token authentication on only where a token exists (a ray.init() that
    # started a local cluster made one); on a fresh machine none does yet: make it, as Ray says.
    generated = ray_cli("get-auth-token", "--generate", env=env)
    assert generated.returncode == 0, generated.stderr[-2000:]
    process = subprocess.Popen(
        [wheel_python, "-m", "ray.scripts.scripts",  # raytf from its wheel: the quick start runs on it
         "start", "--head", "--block", f"--autoscaling-config={config_path}", "--node-ip-address", ip,
         "--num-cpus", str(HEAD_CPUS), "--num-gpus", "0", "--port", str(ports["gcs"]),
         "--dashboard-host", "127.0.0.1", "--dashboard-port", str(ports["dashboard"]),
         "--ray-client-server-port", str(ports["client"]), "--dashboard-agent-listen-port", str(ports["agent"]),
         "--temp-dir", temp_dir],
        stdout=log, stderr=subprocess.STDOUT, env=activated(env, wheel_python),
    )
    address = f"http://127.0.0.1:{ports['dashboard']}"
    try:
        wait_for_job_server(process, address)
        yield address, {**os.environ, "RAY_AUTH_MODE": "token"}, ports["gcs"], gcs
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        finally:
            for pid in processes_of(gcs):  # the fake nodes the autoscaler started
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            log.close()
            shutil.rmtree(temp_dir, ignore_errors=True)


HEAD_CPUS = 4

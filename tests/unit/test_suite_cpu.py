"""The suite's own machinery: tests/cpu.py's CPU-seconds of a process tree (the suite record), and the order
tests/conftest.py hands the test files to the two pytest processes in."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cpu import TreeCpu

# A child that starts a grandchild, which works a fixed amount and then waits to be told to end. The
# child leaves its children to the kernel to reap, as a raylet does its workers: the grandchild's
# CPU never reaches the child's own count of its children's time, and is kept only if it was seen.
FAMILY = """
import signal, subprocess, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "sum(range(20_000_000)); print('done', flush=True); input()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
print(grandchild.stdout.readline().strip(), flush=True)
grandchild.communicate("")
"""


def test_the_cpu_of_processes_started_below_counts_and_stays_counted_after_they_end():
    cpu = TreeCpu(interval_s=3600.0)  # looks only when read: what the test asserts cannot race it
    if not cpu.available:
        pytest.skip("no /proc: the suite record has no CPU-seconds on this system")
    cpu.start()
    before = cpu.total()
    family = subprocess.Popen([sys.executable, "-c", FAMILY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert family.stdout.readline().strip() == "done"  # the grandchild has worked, and still runs
        working = cpu.total()
        # Two Python starts and twenty million additions: far more than nothing on any machine.
        assert working - before > 0.1
    finally:
        family.communicate("")
    # Both ended: their CPU stays in the total, though no parent counted the grandchild's.
    assert cpu.total() >= working
    cpu.stop()


def test_each_process_is_told_apart_by_what_it_is_from_its_command_line():
    """tests/cpu.py's kinds, from command lines as Ray's processes have them on this machine: a
    worker's title (an actor's class, IDLE in the pool, a task's name), a daemon's program, a
    Python daemon's script."""
    from tests.cpu import kind_of

    python, ray = "/usr/bin/python3", "/venv/lib/python3.11/site-packages/ray"
    assert kind_of(["ray::TrainWorker", ""]) == kind_of(["ray::TrainWorker.poll"]) == "TrainWorker"
    assert kind_of(["ray::IDLE"]) == kind_of(["ray::MapBatches(counted_rows)"]) == "pooled Ray workers"
    assert kind_of([python, f"{ray}/_private/workers/default_worker.py", "--node-ip-address=1"]) == "pooled Ray workers"
    assert kind_of(["ray::_StatsActor"]) == "Ray Data actors" and kind_of(["ray::RayTrainWorker"]) == "Ray Train"
    assert kind_of(["ray::DashboardAgent"]) == kind_of([python, "-u", f"{ray}/dashboard/agent.py"]) == "dashboard agents"
    # A raylet's command line names the agents it starts: its program says what it is.
    assert kind_of([f"{ray}/core/src/ray/raylet/raylet", f"--dashboard_agent_command={python} {ray}/dashboard/agent.py"]
                   ) == "raylets"
    assert kind_of([f"{ray}/core/src/ray/gcs/gcs_server", "--log_dir=/tmp"]) == "GCS servers"
    assert kind_of([python, "-u", f"{ray}/_private/log_monitor.py", "--session-dir=/tmp"]) == "log monitors"
    assert kind_of(["ray-dashboard-ReportHead-0 (/venv/bin/python -c)"]) == "dashboards"
    assert kind_of([python, "train_mlp.py", "--num-workers", "2"]) == kind_of([]) == "other"
    # A fork server and its client (a worker's stand-in) by their module.
    assert kind_of([python, "-u", "-m", "raytf_forkserver", "--serve", "/tmp/s.sock", "1"]) == "fork servers"
    assert kind_of([python, "-m", "raytf_forkserver", f"{ray}/_private/workers/default_worker.py"]) == "fork servers"


def test_the_cpu_of_a_tree_is_split_by_kind_of_process():
    """``TreeCpu.by_kind``: each process's CPU under the kind its title gives (``exec -a`` gives a
    Python process the title a Ray worker takes). In the whole suite this pytest process may hold
    a Ray cluster too: what the two processes add is checked, not what else is there."""
    cpu = TreeCpu(interval_s=3600.0)
    if not cpu.available:
        pytest.skip("no /proc: the suite record has no CPU-seconds on this system")
    cpu.start()
    before = cpu.by_kind()
    work = "sum(range(20_000_000)); print('done', flush=True); input()"
    titled = [subprocess.Popen(["bash", "-c", f'exec -a {title} "{sys.executable}" -c "{work}"'], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for title in ("ray::TrainWorker", "ray::IDLE")]
    try:
        assert [p.stdout.readline().strip() for p in titled] == ["done", "done"]
        split = cpu.by_kind()
    finally:
        for p in titled:
            p.communicate("")
    cpu.stop()
    for kind in ("TrainWorker", "pooled Ray workers"):  # twenty million additions each: far more than nothing
        assert split[kind] - before.get(kind, 0.0) > 0.1, (kind, before, split)
    assert "pytest" in split
    assert sum(split.values()) == pytest.approx(cpu.total(), abs=0.5)


class _Test:
    """What tests/conftest.py reads of a collected test: its node id."""

    def __init__(self, group: str, name: str) -> None:
        self.nodeid, self.name = f"tests/{group}::{name}", name


def test_the_suite_hands_out_its_files_longest_first_by_the_newest_whole_run(tmp_path):
    """tests/conftest.py orders the test files for the two pytest processes: the longest first by
    the newest kept run of the whole suite (a failed run, or one tier's, does not count), a file the
    record does not know before all, each file's tests in the order collected."""
    import json

    from tests.conftest import _longest_groups_first

    (tmp_path / "records").mkdir()

    def run(status, args, seconds):
        return {"exit_status": status, "args": args,
                "tests_s": {f"tests/{group}::t@{group}": s for group, s in seconds.items()}}

    lines = [run(0, [], {"integration/a.py": 10.0, "integration/b.py": 30.0, "unit/u.py": 1.0}),
             run(1, [], {"integration/a.py": 90.0}), run(0, ["-m", "unit"], {"unit/u.py": 500.0})]
    (tmp_path / "records" / "suite.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    tests = [_Test("unit/u.py", "u1"), _Test("integration/a.py", "a1"), _Test("integration/b.py", "b1"),
             _Test("integration/a.py", "a2"), _Test("integration/new.py", "n1"), _Test("unit/u.py", "u2")]
    ordered = _longest_groups_first(tests, str(tmp_path))
    assert [t.name for t in ordered] == ["n1", "b1", "a1", "a2", "u1", "u2"]
    # A record's node ids with pytest-xdist's ``@group`` and without it name the same files.
    lines[0]["tests_s"] = {k.split("@")[0]: v for k, v in lines[0]["tests_s"].items()}
    (tmp_path / "records" / "suite.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [t.name for t in _longest_groups_first(tests, str(tmp_path))] == ["n1", "b1", "a1", "a2", "u1", "u2"]
    # With no record, the order collected.
    (tmp_path / "records" / "suite.jsonl").unlink()
    assert [t.name for t in _longest_groups_first(tests, str(tmp_path))] == ["u1", "u2", "a1", "a2", "b1", "n1"]


def test_a_pytest_process_takes_a_file_whole_and_every_end_to_end_file_together():
    """The suite's scheduler (tests/conftest.py, ``--dist loadfile`` in pyproject.toml) splits the
    tests by file, the end-to-end files one unit, from the node ids pytest gives, whatever pytest
    does with pytest-xdist's ``@group`` suffix (pytest 9.2 drops it: pytest-xdist#1386)."""
    import pytest

    from tests.conftest import group_of, pytest_xdist_make_scheduler

    class Config:
        def __init__(self, dist: str) -> None:
            self.dist = dist
            self.option = type("Option", (), {"loadscopereorder": False, "maxschedchunk": None})()

        def getvalue(self, name: str):
            return {"dist": self.dist, "tx": ["2*popen"]}[name]  # -n 2, as pyproject.toml's addopts

        def getoption(self, name: str, default=None):
            return getattr(self.option, name, default)

    assert pytest_xdist_make_scheduler(Config("load"), None) is None  # another --dist: pytest-xdist's own
    pytest.importorskip("xdist")
    scheduler = pytest_xdist_make_scheduler(Config("loadfile"), None)
    ids = ["tests/integration/test_a.py::test_one[x-1]", "tests/integration/test_a.py::T::test_two",
           "tests/integration/test_b.py::test_one", "tests/e2e/test_job_submit.py::test_one",
           "tests/e2e/test_autoscaler.py::test_one@e2e", "tests/unit/test_u.py::test_one"]
    assert [scheduler._split_scope(i) for i in ids] == [
        "integration/test_a.py", "integration/test_a.py", "integration/test_b.py", "e2e", "e2e", "unit/test_u.py"]
    assert [group_of(i) for i in ids] == [scheduler._split_scope(i) for i in ids]


def test_the_reference_measures_the_machine_with_a_workers_tensorflow(tmp_path):
    """What the suite record's ``reference`` is made of: both measurements, each some CPU; the
    import ran as a worker's does, the test-only packages hidden (tests/hidden.py)."""
    from tests.conftest import reference_cpu_s
    from tests.hidden import TEST_ONLY

    measured = reference_cpu_s(tmp_path)
    assert set(measured) == {"python_loop", "import_tensorflow"}
    assert measured["python_loop"] > 0.05 and measured["import_tensorflow"] > 0.1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(TEST_ONLY)


def test_a_record_names_the_machines_processor_and_reads_its_hosts_counters():
    """What a suite record keeps of the machine's host (tests/conftest.py): its processor's name, and
    the two counters it takes the difference of over a run, in their units, which never go down."""
    import sys
    import time

    from tests.conftest import _cpu_model, _host_counters

    if not sys.platform.startswith("linux"):
        assert _host_counters() == {} and _cpu_model() == ""
        return
    before = _host_counters()
    assert set(before) == {"steal_s", "refaulted_file_mib"} and min(before.values()) >= 0
    time.sleep(0.2)
    after = _host_counters()
    assert all(after[name] >= before[name] for name in before)
    assert _cpu_model()  # the kernel's "model name" line, whatever the processor


def test_the_busy_sampler_gives_a_share_of_the_cores_for_each_interval():
    import time

    from tests.conftest import BusySampler

    class Quick(BusySampler):
        INTERVAL_S = 0.5

    sampler = Quick()
    time.sleep(2.2)
    shares = sampler.stop()
    assert len(shares) >= 3  # one share per interval since its start
    # Of all the cores' time; /proc/stat counts in ticks of 10 ms, a tick or two either way an interval.
    assert all(0.0 <= s <= 1.1 for s in shares), shares
    assert sampler.stop() == shares  # stopped: no interval added after


class _Report:
    """What tests/conftest.py reads of a test's report."""

    def __init__(self, nodeid: str, when: str, outcome: str = "passed") -> None:
        self.nodeid, self.when, self.outcome = nodeid, when, outcome
        self.duration, self.stop, self.user_properties = 0.0, 0.0, []


def test_each_integration_files_worker_starts_are_counted_and_a_file_over_its_budget_fails_the_run(monkeypatch):
    """tests/conftest.py counts the TrainWorker processes of each integration file, from the actor
    table before its first test and after its last, and carries the count to the controller with
    that test's report; the controller names each file over its budget (tests/budget.py), and leaves
    out a file with a test rerun after a crash, whose count holds the crashed attempt's processes."""
    from tests import conftest

    for name, value in (("_FILE_NOW", [None, 0]), ("_FILE_STARTS", {}), ("_FILE_OF_TEST", {}), ("_RERUN_FILES", set()),
                        ("_STARTS_AT_START", {}), ("_STARTED_AT", {}), ("_TOOK", {}), ("_OUTCOMES", {}),
                        ("_RAN_AT", {}), ("_RUNS_TESTS", True)):
        monkeypatch.setattr(conftest, name, value)
    table = {"started": None}  # no cluster yet, then the TrainWorker actors it has ever had
    monkeypatch.setattr(conftest, "_train_workers_started", lambda: table["started"])

    class Item:
        def __init__(self, nodeid: str) -> None:
            self.nodeid = nodeid

    def run(nodeid: str, nextid: str | None, started: int, rerun: bool = False) -> None:
        conftest.pytest_runtest_logstart(nodeid, ("", 0, ""))
        table["started"] = started
        if rerun:
            conftest.pytest_runtest_logreport(_Report(nodeid, "call", "rerun"))
        teardown = conftest.pytest_runtest_teardown(Item(nodeid), Item(nextid) if nextid else None)
        next(teardown)
        teardown.close()
        conftest.pytest_runtest_logreport(_Report(nodeid, "teardown"))

    a1, a2 = "tests/integration/test_a.py::test_one", "tests/integration/test_a.py::test_two"
    b1, c1 = "tests/integration/test_b.py::test_one", "tests/integration/test_c.py::test_one"
    unit = "tests/unit/test_u.py::test_one"
    run(a1, a2, 2)  # the file's cluster starts in its first test
    run(a2, b1, 5)
    run(b1, unit, 9, rerun=True)
    run(unit, c1, 9)
    run(c1, None, 10)
    assert conftest._FILE_STARTS == {"integration/test_a.py": 5, "integration/test_b.py": 4,
                                     "integration/test_c.py": 1}
    assert conftest.files_over_budget({"integration/test_a.py": 5, "integration/test_b.py": 1,
                                       "integration/test_c.py": 1}) == []  # test_b's crashed attempt left out
    said = conftest.files_over_budget({"integration/test_a.py": 4, "integration/test_b.py": 1})
    assert said[0] == ("tests/integration/test_a.py started 5 TrainWorker processes, 1 more than its budget of 4 "
                       "(tests/budget.py)")
    assert said[1] == "tests/integration/test_c.py started 1 TrainWorker process and has no budget in tests/budget.py"
    assert "shared run" in said[2] and len(said) == 3


def test_each_integration_files_budget_holds_what_the_newest_whole_run_started():
    """tests/budget.py allows each file at least the TrainWorker processes it started in the newest
    kept run of the whole suite, and names every file that run counted: a budget cut below what the
    tests start fails here, in the unit tier, not after a whole run."""
    import collections
    import json
    import pathlib

    from tests.budget import WORKER_STARTS

    runs = [json.loads(line) for line in (pathlib.Path(__file__).parents[1] / "records" / "suite.jsonl").open()
            if line.strip()]
    newest = [r for r in runs if r["exit_status"] == 0 and not {"-m", "-k"} & set(r["args"]) and r.get("worker_starts")][-1]
    started = collections.Counter()
    for nodeid, count in newest["worker_starts"].items():
        started[nodeid.split("::")[0].removeprefix("tests/")] += count
    assert {f: n for f, n in started.items() if n > WORKER_STARTS.get(f, 0)} == {}, newest["commit"]


def test_raytf_and_the_tests_are_compiled_once_where_python_writes_no_bytecode_itself(tmp_path):
    """What the suite's processes import of the checkout, they read compiled (tests/conftest.py's
    compile_checkout), where PYTHONDONTWRITEBYTECODE would have each compile it from source again;
    where Python writes its bytecode itself, the suite leaves it to."""
    import importlib.util
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for name in ("raytf", "tests", "docs"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "module.py").write_text("VALUE = 1\n")
    compile_it = f"from tests.conftest import compile_checkout; compile_checkout({str(tmp_path)!r})"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = repo
    subprocess.run([sys.executable, "-c", compile_it], env=env, check=True, timeout=120)
    assert not any(tmp_path.rglob("*.pyc"))  # Python writes its own as it imports
    subprocess.run([sys.executable, "-B", "-c", compile_it], env=env, check=True, timeout=120)
    compiled = {p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob("*.pyc")}
    assert compiled == {"raytf", "tests"}
    assert (tmp_path / "raytf" / importlib.util.cache_from_source("module.py")).exists()


RERUN_DB_PROBE = """
import socket


def test_the_rerun_db_socket_sends_at_once(request):
    sock = request.config.failures_db.sock
    assert type(request.config.failures_db).__name__ == "ClientStatusDB"
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
"""


def test_each_pytest_process_asks_pytest_rerunfailures_without_waiting_on_nagle(tmp_path):
    """In a pytest-xdist process with --reruns (the suite's addopts), pytest-rerunfailures' socket to
    its controller sends each message at once (tests/conftest.py's pytest_configure): with Nagle's
    algorithm, each test waited 40 ms for an acknowledgement, idle. Checked in a pytest run of one
    process of pytest-xdist with the installed plugins, and on a socket this test connects."""
    import os
    import socket
    import subprocess
    import sys

    from tests import conftest

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "test_probe.py").write_text(RERUN_DB_PROBE)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-o", "addopts=",
         "-n", "1", "--reruns", "1", "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={**os.environ, "PYTHONPATH": repo})
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sock:
        config = type("Config", (), {"failures_db": type("Db", (), {"sock": sock})()})()
        assert not sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        conftest.pytest_configure(config)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        conftest.pytest_configure(type("Config", (), {})())  # no pytest-rerunfailures' database: nothing to do


def test_the_cpu_quota_is_read_from_the_cgroup_or_a_parent_under_either_cgroup_version(tmp_path):
    """tests/slowed.py's reader, which a suite record notes (``machine.cpu_quota``): the smallest
    CFS quota on the process's cgroup path, in CPUs, under cgroup v1's cpu controller or v2's
    cpu.max; None where none is set."""
    from tests.slowed import cpu_quota

    v1 = tmp_path / "v1"
    for directory, quota in (("cpu", "-1"), ("cpu/a", "-1"), ("cpu/a/b", "133000")):
        (v1 / directory).mkdir(parents=True)
        (v1 / directory / "cpu.cfs_quota_us").write_text(quota + "\n")
        (v1 / directory / "cpu.cfs_period_us").write_text("100000\n")
    proc = "4:memory:/x\n1:cpu:/a/b\n0::/\n"
    assert cpu_quota(proc, str(v1)) == 1.33
    assert cpu_quota("1:cpu:/a\n", str(v1)) is None
    (v1 / "cpu/a/cpu.cfs_quota_us").write_text("50000\n")  # a parent's smaller quota holds it too
    assert cpu_quota(proc, str(v1)) == 0.5
    assert cpu_quota("4:memory:/x\n", str(v1)) is None  # no cpu controller in its cgroups
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (v2 / "a" / "cpu.max").write_text("max 100000\n")
    (v2 / "a" / "b" / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota("0::/a/b\n", str(v2)) == 1.5
    assert cpu_quota("0::/a\n", str(v2)) is None


def test_slowed_runs_a_command_in_a_cgroup_of_its_own_with_the_quota_asked_and_passes_on_its_status(tmp_path, capsys):
    """``python -m tests.slowed CPUS -- COMMAND``: a cgroup with CPUS x the period as its quota, the
    command's process joined to it before the command runs, its exit status passed on; a bad
    command line is refused. (Here on a stand-in tree: making a real cgroup needs root.)"""
    import pytest

    from tests.slowed import cpu_quota, hold, main

    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    status = main(["0.75", "--", "sh", "-c", f"echo $$ > {tmp_path / 'pid'}; exit 3"], root=str(v1))
    assert status == 3
    [group] = [p for p in (v1 / "cpu").iterdir() if p.is_dir()]
    assert group.name.startswith("raytf-slowed-")
    assert (group / "cpu.cfs_quota_us").read_text() == "75000"
    assert (group / "cgroup.procs").read_text() == (tmp_path / "pid").read_text().strip()  # the command's own pid
    assert cpu_quota(f"1:cpu:/{group.name}\n", str(v1)) == 0.75
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    procs = hold(1.33, "held", str(v2))
    assert procs == str(v2 / "held" / "cgroup.procs") and (v2 / "held" / "cpu.max").read_text() == "133000 100000"
    assert (v2 / "cgroup.subtree_control").read_text() == "+cpu"
    assert cpu_quota("0::/held\n", str(v2)) == 1.33
    assert main(["1"], root=str(v2)) == 2 and "usage" in capsys.readouterr().err
    assert main(["all", "--", "true"], root=str(v2)) == 2 and "CPUS must be a number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="CPUS must be more than 0"):
        hold(0, "none", str(v2))


def test_a_fork_server_counts_under_the_raylet_its_command_line_names():
    """A fork server is an orphan (its client detached it): tests/cpu.py puts it, and the workers
    forked from it, under the raylet it serves, the last word of its command line."""
    import subprocess
    import sys

    from tests.cpu import _served_raylet

    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "raytf_forkserver",
                               "--serve", "/tmp/s.sock", "4242"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "4242"])
    try:
        assert _served_raylet(server.pid) == 4242 and _served_raylet(other.pid) is None
    finally:
        server.kill()
        other.kill()
        server.wait()
        other.wait()

"""Tiers by directory, so a marker never depends on a test file remembering its own.

``-m unit``: tests/unit and tests/cluster, no Ray cluster, seconds in all (the loop to run while
editing). ``-m docs``: tests/docs, the documentation site built in strict mode and checked.
``-m integration``: tests/integration, on the session's Ray cluster. ``-m e2e``: a
``ray start --head`` of their own (tests/e2e; the autoscaler's test also has ``autoscaler``).
``-m gpu``: tests/gpu, on a machine with NVIDIA GPUs only.

The suite runs in two processes (``-n 2`` in pyproject.toml): much of an integration test is
waiting (for a timeout it provokes, a process to start, a node to go), and the other process
fills it. Each process starts its own Ray cluster on ports of its own. ``-n 0`` runs in one.

A test whose run failed because a worker process died when nothing in the test killed it (a
crash inside TensorFlow or Ray: rare, but seen here on the oldest and the newest versions
alike) runs once more (``--reruns 1 --only-rerun``, pyproject.toml): raytf's
answer to such a crash is ``FailureConfig.max_failures``, which most tests leave at 0 to see every
failure. pytest's summary and the suite record (``rerun``) count each rerun; any other failure,
and a second crash, fails the suite.
"""

from __future__ import annotations

import os
import pathlib

import pytest

# No Ray usage statistics from the suite's clusters and heads: each would run an actor that collects
# them (a Python process of its own) and try to send them to a network this machine cannot reach.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# A raylet ends an idle worker process 1 s after its last task where it holds more than one per CPU
# (the trainers' actors count), so each test's Ray Data tasks started processes anew: each imports
# Ray, pyarrow and pandas, a second or two of CPU. Kept for 10 minutes, a pytest process's next
# dataset reuses them (measured: test_data.py and test_ray_train_compat.py used 5% less CPU).
os.environ.setdefault("RAY_idle_worker_killing_time_threshold_ms", "600000")


def group_of(nodeid: str) -> str:
    """The unit of work a pytest process takes whole: the test's file under tests/, or ``e2e`` for
    every end-to-end file, whose Ray heads must never start together (the first makes the
    machine's Ray token). A file runs whole in one process, so its module-scoped runs are made once."""
    relative = nodeid.split("::")[0].split("@")[0].removeprefix("tests/")
    return "e2e" if relative.startswith("e2e/") else relative


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which would give its loadfile
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (pyproject.toml), its files grouped by ``group_of``: the end-to-end
    files one unit. pytest-xdist's ``loadgroup`` would do it from ``xdist_group`` marks, but it
    passes a mark on by appending ``@group`` to the test's node id, which pytest 9.2's node ids no
    longer take (pytest-xdist#1386): it then splits every file over both processes, silently, and
    each process makes the file's shared runs again. A scheduler's scope is its own method here."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return FileScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after pytest-rerunfailures' own, which connects to its controller
def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist process asks pytest-rerunfailures' controller (a TCP socket on loopback)
    how often a test has run, at every test: a message it answers, after one it does not. With
    Nagle's algorithm on, the second waits for the first's acknowledgement, which the controller's
    kernel holds back for 40 ms: 40 ms of every test spent idle (tests/unit/test_layout.py's 468
    tests took 31 s in one pytest-xdist process against 12 without --reruns). Sent at once, the
    messages cost what the test costs."""
    import socket

    connection = getattr(getattr(config, "failures_db", None), "sock", None)
    if isinstance(connection, socket.socket) and connection.family in (socket.AF_INET, socket.AF_INET6):
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # a socket the plugin has closed already: nothing left to send on it
            pass


_TIERS = {"unit": "unit", "cluster": "unit", "docs": "docs", "integration": "integration", "e2e": "e2e", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        relative = os.path.relpath(str(item.fspath), root)
        tier = _TIERS.get(relative.split(os.sep)[0])
        if tier is not None and tier not in {m.name for m in item.iter_markers()}:
            item.add_marker(getattr(pytest.mark, tier))
    if hasattr(config, "workerinput"):  # a pytest-xdist process: the controller takes the groups in its order
        items[:] = _longest_groups_first(items, root)


def _longest_groups_first(items: list[pytest.Item], root: str) -> list[pytest.Item]:
    """The tests, their groups (``group_of``) in the order the processes should take them: the
    longest first, by the seconds of the newest kept run of the whole suite (a group it does not
    know, a new file, before all), each group's tests in the order collected. The groups start in
    this order (--no-loadscope-reorder), and a process is handed its next group while its current
    one still has two tests to run: a long group handed out late leaves the other process idle at
    the end (the kept run of commit 32216c9: test_trainer.py, handed out behind test_scale.py, ran alone)."""
    import json

    took: dict[str, float] = {}
    try:
        with open(os.path.join(root, "records", "suite.jsonl")) as f:
            runs = [json.loads(line) for line in f if line.strip()]
        # As docs/contributing.md picks it: passed, and neither -m nor -k (a tier's run knows one tier).
        whole = [r for r in runs if r["exit_status"] == 0 and not {"-m", "-k"} & set(r["args"])]
        for nodeid, seconds in (whole[-1]["tests_s"] if whole else {}).items():
            # Older records' node ids end with pytest-xdist's ``@group``; group_of drops it.
            took[group_of(nodeid)] = took.get(group_of(nodeid), 0.0) + seconds
    except (OSError, ValueError, KeyError):
        pass  # no record to go by: the order collected

    order = {g: i for i, g in enumerate(dict.fromkeys(group_of(item.nodeid) for item in items))}
    return sorted(items, key=lambda item: (-took.get(group_of(item.nodeid), float("inf")), order[group_of(item.nodeid)]))


# ``python -m pytest --suite-record tests/records/suite.jsonl``: one JSON line of what the run took
# (the whole run, and each test's setup, call and teardown, by the pytest process that ran it), the
# machine and the versions. docs/contributing.md lists the slowest tests of the newest record, read
# by the docs' build (docs/_hooks/reference.py), never typed by hand.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-record", default=None, help="append what this run took to this JSONL file")


_TOOK: dict[str, float] = {}
_OUTCOMES: dict[str, int] = {}
# CPU-seconds per test of the tiers that start processes, with --suite-record (tests/cpu.py).
_CPU_AT_START: dict[str, float] = {}
_CPU_OF: dict[str, float] = {}  # node id -> its CPU-seconds, as reported (in the controller, by the workers)
_PROCESS_TIERS = ("integration", "e2e")
_TREE_CPU = None
# With --suite-record, the TrainWorker processes each integration test started (standbys included):
# what most of the suite's CPU goes to, a few CPU-seconds each before train_fn runs.
_STARTS_AT_START: dict[str, int] = {}
_STARTS_OF_TEST: dict[str, int] = {}  # node id -> its worker starts, counted before its teardown
_STARTS_OF: dict[str, int] = {}  # node id -> its worker starts, as reported (in the controller)
# With --suite-record, when each test ran and in which pytest process: node id -> [process, seconds
# from the session's start to the test's start, to its end]. The order the two processes took the
# test files in is what the suite's wall time is made of, beside the tests' own seconds.
_RAN_AT: dict[str, list] = {}
_STARTED_AT: dict[str, float] = {}
_RUNS_TESTS = True  # False in pytest-xdist's controller, which logs the tests its processes run


def _train_workers_started() -> int | None:
    """The TrainWorker actors this process's Ray cluster has ever had (its GCS keeps the dead ones),
    or None where this process is connected to no cluster."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from tests.integration.conftest import actors

    return len(actors(("class_name", "=", "TrainWorker")))


# Every run: the TrainWorker processes each integration file's tests started, counted before its
# first test and after its last (two reads of the actor table a file), against its budget
# (tests/budget.py), which the controller checks at the end of the run.
_FILE_NOW: list = [None, 0]  # the integration file this process runs now, the count before its first test
_FILE_STARTS: dict[str, int] = {}  # file under tests/ -> its worker starts, as reported (in the controller)
_FILE_OF_TEST: dict[str, tuple[str, int]] = {}  # node id of a file's last test -> (the file, its starts)
_RERUN_FILES: set[str] = set()  # files with a test rerun after a crash: not checked (tests/budget.py)


def _integration_file(nodeid: str) -> str | None:
    """The test's file under tests/ (``integration/test_x.py``) where it is an integration test, else None."""
    group = group_of(nodeid)
    return group if group.startswith("integration/") else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Counts the test's worker starts before its teardown, which may end the session's cluster;
    the file's too, where it is the last of its file this process runs."""
    before = _STARTS_AT_START.pop(item.nodeid, None)
    now = _train_workers_started() if before is not None else None
    if now is not None:
        _STARTS_OF_TEST[item.nodeid] = now - before
    path = _integration_file(item.nodeid)
    if path is not None and path == _FILE_NOW[0] and (
            nextitem is None or _integration_file(nextitem.nodeid) != path):
        now = now if now is not None else _train_workers_started()
        _FILE_OF_TEST[item.nodeid] = (path, (now or 0) - _FILE_NOW[1])
        _FILE_NOW[0] = None
    yield


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    import time

    if _RUNS_TESTS:
        _STARTED_AT[nodeid] = time.time()
        path = _integration_file(nodeid)
        if path is not None and path != _FILE_NOW[0]:
            # No cluster yet: the one this file's first test may start has had no worker.
            _FILE_NOW[:] = [path, _train_workers_started() or 0]
    if _TREE_CPU is not None and _starts_processes(nodeid):
        _CPU_AT_START[nodeid] = _TREE_CPU.total()
        # No cluster yet: the one this test's setup may start has had no worker.
        _STARTS_AT_START[nodeid] = _train_workers_started() or 0


def _starts_processes(nodeid: str) -> bool:
    parts = nodeid.split("/")
    return len(parts) > 2 and parts[1] in _PROCESS_TIERS


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist sends the report to the controller
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TOOK[report.nodeid] = _TOOK.get(report.nodeid, 0.0) + report.duration
    if report.when == "teardown" and report.nodeid in _STARTED_AT:
        report.user_properties.append(("ran_at", [os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                                  _STARTED_AT.pop(report.nodeid), report.stop]))
    if report.when == "call" or report.outcome != "passed":
        _OUTCOMES[report.outcome] = _OUTCOMES.get(report.outcome, 0) + 1
    if report.when == "teardown" and report.nodeid in _CPU_AT_START:
        # Carried to the controller with the report (pytest-xdist), where the record is written.
        report.user_properties.append(("cpu_s", round(_TREE_CPU.total() - _CPU_AT_START.pop(report.nodeid), 2)))
        starts = _STARTS_OF_TEST.pop(report.nodeid, 0)
        if starts:
            report.user_properties.append(("worker_starts", starts))
    if report.when == "teardown" and report.nodeid in _FILE_OF_TEST:
        report.user_properties.append(("file_worker_starts", _FILE_OF_TEST.pop(report.nodeid)))
    if report.outcome == "rerun" and _integration_file(report.nodeid):
        _RERUN_FILES.add(_integration_file(report.nodeid))
    for name, value in report.user_properties:
        if name == "cpu_s":
            _CPU_OF[report.nodeid] = value
        elif name == "worker_starts":
            _STARTS_OF[report.nodeid] = value
        elif name == "ran_at":
            _RAN_AT[report.nodeid] = value
        elif name == "file_worker_starts":
            path, starts = value
            _FILE_STARTS[path] = _FILE_STARTS.get(path, 0) + starts


# The controller measures the machine itself before and after the tests, with --suite-record: the
# same tests took 1,584 to 1,967 CPU-seconds on one machine at different hours of the same code, and
# a record's ``reference`` tells the machine's hour apart from the code's change.
_REFERENCE = (
    "import gc, time\n"
    "gc.disable()\n"
    "start = time.process_time()\n"
    "total = 0\n"
    "for i in range(10**7):\n"
    "    total += i\n"
    "loop = time.process_time() - start\n"
    "import tensorflow\n"
    "print(round(loop, 2), round(time.process_time() - start - loop, 2))\n"
)


def reference_cpu_s(hidden_dir) -> dict[str, float]:
    """The CPU-seconds this machine takes now for a fixed pure-Python loop (10**7 additions) and
    for ``import tensorflow`` in a new process, the collector off and the test-only packages hidden,
    as a worker of the suite loads it (raytf/_internal/worker/loading.py, tests/hidden.py): most of
    the suite's CPU is that import, 200-odd times. {} where it could not run."""
    import subprocess
    import sys

    from tests.hidden import hiding

    try:
        done = subprocess.run([sys.executable, "-c", _REFERENCE], env=hiding(hidden_dir, dict(os.environ)),
                              capture_output=True, text=True, timeout=300)
        loop, tensorflow = (float(v) for v in done.stdout.split()[-2:])
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}
    return {"python_loop": loop, "import_tensorflow": tensorflow}


def compile_checkout(root: str) -> None:
    """Byte-compile raytf and the tests into their ``__pycache__`` (ignored by git) where this
    Python writes no bytecode itself (PYTHONDONTWRITEBYTECODE, which this project's machines set):
    each of the 400-odd processes the suite starts (workers, drivers, launched scripts) would
    otherwise compile the modules it imports of them from source, some 0.05 CPU-seconds each
    (measured: a worker's imports of raytf, 0.81 CPU-s against 0.76). Python reads the files
    whatever that setting says, and compiles a source newer than its file again, in memory."""
    import compileall
    import sys

    if sys.flags.dont_write_bytecode:
        for name in ("raytf", "tests"):
            compileall.compile_dir(os.path.join(root, name), quiet=1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its processes, which would share the cores
def pytest_sessionstart(session: pytest.Session) -> None:
    import tempfile
    import time

    if not hasattr(session.config, "workerinput"):  # once, before any process of the run imports raytf
        compile_checkout(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if session.config.getoption("--suite-record") and not hasattr(session.config, "workerinput"):
        session.config._raytf_hidden = tempfile.mkdtemp(prefix="raytf-reference-")  # noqa: SLF001
        session.config._raytf_reference = reference_cpu_s(pathlib.Path(session.config._raytf_hidden))  # noqa: SLF001
        session.config._raytf_busy = BusySampler()  # noqa: SLF001
    session.config._raytf_started = time.time()  # noqa: SLF001 - pytest's config holds a plugin's state
    session.config._raytf_machine_cpu = _machine_cpu_s()  # noqa: SLF001
    session.config._raytf_host = _host_counters()  # noqa: SLF001
    # Each process that runs tests watches its own (pytest-xdist's controller runs none).
    controller = not hasattr(session.config, "workerinput") and session.config.getoption("numprocesses", None)
    global _RUNS_TESTS
    _RUNS_TESTS = not controller
    if session.config.getoption("--suite-record") and not controller:
        global _TREE_CPU
        from tests.cpu import TreeCpu

        _TREE_CPU = TreeCpu()
        _TREE_CPU.start()


class BusySampler:
    """From its start, the share of the machine's cores that were busy in each INTERVAL_S
    (/proc/stat, as _machine_cpu_s), sampled by a thread of its own until stop()."""

    INTERVAL_S = 10.0

    def __init__(self) -> None:
        import threading

        self._shares: list[float] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="raytf-busy", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import time

        last, at = _machine_cpu_s(), time.monotonic()
        while not self._done.wait(self.INTERVAL_S):
            busy, now = _machine_cpu_s(), time.monotonic()
            self._shares.append(round((busy - last) / ((now - at) * (os.cpu_count() or 1)), 2))
            last, at = busy, now

    def stop(self) -> list[float]:
        self._done.set()
        self._thread.join(timeout=5)
        return list(self._shares)


def _cpu_ticks() -> list[int]:
    """/proc/stat's first line, the machine's cores together since it booted, in clock ticks: user,
    nice, system, idle, iowait, irq, softirq, steal; [] where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return []


def _machine_cpu_s() -> float:
    """CPU-seconds every core of the machine has been busy since it booted (user, nice, system, irq,
    softirq, steal; not idle or waiting for I/O); 0 where there is no /proc."""
    ticks = _cpu_ticks()
    if not ticks:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    return round((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), 1)


def _cpu_model() -> str:
    """The machine's processor as its kernel names it ("AMD EPYC", ...): the same machine kind's
    runs are tellable apart by the host they ran on. "" where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def _host_counters() -> dict[str, float]:
    """Two counters of the machine since it booted, which its host moves and the suite's work does
    not: ``steal_s``, the CPU-seconds its cores were ready to run and the hypervisor ran others
    (/proc/stat), and ``refaulted_file_mib``, the file pages read back from disk after the kernel
    had evicted them (/proc/vmstat's workingset_refault_file: on this project's machines DAMON
    pages out the file pages no process maps once they are a minute old, TensorFlow's among
    them). {} where there is no /proc."""
    try:
        steal = _cpu_ticks()[7]
        with open("/proc/vmstat") as f:
            refaults = next(int(line.split()[1]) for line in f if line.startswith("workingset_refault_file "))
    except (OSError, IndexError, ValueError, StopIteration):
        return {}
    return {"steal_s": steal / os.sysconf("SC_CLK_TCK"),
            "refaulted_file_mib": refaults * os.sysconf("SC_PAGE_SIZE") / 2**20}


def files_over_budget(budget: dict[str, int] | None = None) -> list[str]:
    """tests/budget.py's check of the files this run's processes reported, but those with a test
    rerun after a crash: what each file over its budget started, and what to do; [] where none is."""
    from tests.budget import WORKER_STARTS, over_budget

    return over_budget({f: n for f, n in _FILE_STARTS.items() if f not in _RERUN_FILES},
                       WORKER_STARTS if budget is None else budget)


# With --suite-record, each pytest process's CPU-seconds by kind of process (tests/cpu.py: TrainWorker,
# pooled Ray workers, raylets, agents, ...), sent to the controller when it ends: where the whole run's
# CPU went, which the tests' own CPU-seconds do not say (a cluster's daemons belong to no test).
_BY_KIND: list[dict[str, float]] = []


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook, in its controller
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001
    by_kind = getattr(node, "workeroutput", {}).get("cpu_by_kind")
    if by_kind:
        _BY_KIND.append(by_kind)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _TREE_CPU is not None:
        if hasattr(session.config, "workeroutput"):
            session.config.workeroutput["cpu_by_kind"] = _TREE_CPU.by_kind()
        else:  # -n 0: this process ran the tests and writes the record
            _BY_KIND.append(_TREE_CPU.by_kind())
        _TREE_CPU.stop()
    if hasattr(session.config, "workerinput"):  # the controller checks and writes, not each xdist worker
        return
    # Checked where every test passed: a failure says more first, and its retries start more workers.
    said = files_over_budget() if exitstatus == 0 else []
    if said:
        session.config._raytf_over_budget = said  # noqa: SLF001 - shown by pytest_terminal_summary below
        session.exitstatus = exitstatus = pytest.ExitCode.TESTS_FAILED
    path = session.config.getoption("--suite-record")
    if not path:
        return
    import json
    import platform
    import shutil
    import subprocess
    import time
    from importlib import metadata

    from tests.slowed import cpu_quota

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return ""

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__)).stdout.strip()
    record = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit,
        "wall_s": round(time.time() - session.config._raytf_started, 1),  # noqa: SLF001
        "exit_status": int(exitstatus), "outcomes": _OUTCOMES, "args": session.config.invocation_params.args,
        "machine": {"cpus": os.cpu_count(), "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf(
            "SC_PHYS_PAGES") / 2**30), "python": platform.python_version(), "system": platform.platform(),
                    "cpu_model": _cpu_model(),
                    # Fewer CPUs than it has, where a CFS quota holds the run to them (tests/slowed.py).
                    **({"cpu_quota": quota} if (quota := cpu_quota()) is not None else {})},
        "versions": {name: version(name)
                     for name in ("tensorflow", "keras", "tf-keras", "ray", "pyarrow", "numpy", "ml_dtypes", "pytest")},
        "tests_s": {nodeid: round(took, 2) for nodeid, took in sorted(_TOOK.items(), key=lambda kv: -kv[1])},
        # The integration and end-to-end tests' CPU-seconds, their processes' included (tests/cpu.py).
        "tests_cpu_s": dict(sorted(_CPU_OF.items(), key=lambda kv: -kv[1])),
        # The TrainWorker processes each integration test started (its session cluster's actor table).
        "worker_starts": dict(sorted(_STARTS_OF.items(), key=lambda kv: -kv[1])),
        "machine_cpu_s": round(_machine_cpu_s() - session.config._raytf_machine_cpu, 1),  # noqa: SLF001
        # What the host did to the machine meanwhile (_host_counters): its steal and its evicted file
        # pages read back, neither of which the code of a run changes.
        "host": {name: round(value - session.config._raytf_host[name], 1)  # noqa: SLF001
                 for name, value in _host_counters().items() if name in session.config._raytf_host},  # noqa: SLF001
        # The pytest processes' CPU-seconds, their Ray clusters' and subprocesses' included, by kind of
        # process (tests/cpu.py's kind_of), costliest first.
        "cpu_by_kind": _summed(_BY_KIND),
        "ran_at": {nodeid: [worker, round(start - session.config._raytf_started, 1),  # noqa: SLF001
                            round(stop - session.config._raytf_started, 1)]  # noqa: SLF001
                   for nodeid, (worker, start, stop) in _RAN_AT.items()},
    }
    # How busy the machine's cores were, every BusySampler.INTERVAL_S from the tests' start: where
    # a run left cores idle, and (with ran_at) what ran then.
    record["machine_busy"] = session.config._raytf_busy.stop()  # noqa: SLF001
    # Measured again after the tests (their seconds above end before it): the machine's speed at
    # either end of the run, in CPU-seconds of the same work.
    record["reference"] = {"before": session.config._raytf_reference,  # noqa: SLF001
                           "after": reference_cpu_s(pathlib.Path(session.config._raytf_hidden))}  # noqa: SLF001
    shutil.rmtree(session.config._raytf_hidden, ignore_errors=True)  # noqa: SLF001
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def _summed(by_kind: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for one in by_kind:
        for kind, cpu_s in one.items():
            total[kind] = total.get(kind, 0.0) + cpu_s
    return {kind: round(cpu_s, 1) for kind, cpu_s in sorted(total.items(), key=lambda kv: -kv[1])}


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    said = getattr(config, "_raytf_over_budget", None)
    if said:
        terminalreporter.write_sep("=", "worker processes over budget (tests/budget.py)", red=True)
        for line in said:
            terminalreporter.write_line(line)

"""CPU-seconds of this process and every process it started, theirs in turn included: the suite
record's measure of what a test costs the whole run (tests/conftest.py, ``--suite-record``).

The suite is bound by CPU (both cores busy through most of a run), so a test's seconds shrink or
grow with what the other pytest process runs meanwhile; its CPU, its Ray processes' included,
does not. A Ray node's raylet does not collect the CPU time of the workers it started when they end
(its children's times never reach its own), so :class:`TreeCpu` looks at the processes instead:
every second, and at each reading, it lists the processes under this one (Linux's /proc) and keeps
each one's latest CPU time. A process that ends between two looks loses what it used since the
last; one that outlives its parent is counted while it runs under this process and lost after.

It also tells the processes apart by what they are (``kind_of``: a TrainWorker, one of Ray's pooled
worker processes, a raylet, a dashboard agent, ...), from the title each one has when it is looked
at, so that a record says where a whole run's CPU went, not only which test spent it.
"""

from __future__ import annotations

import os
import threading

# What a process is, from its command line. Ray names its worker processes ``ray::<actor class>``
# (``ray::IDLE`` while one waits in the pool, ``ray::<task>`` while it runs a task): the first of
# TITLES the title starts with names the kind, and a title of no actor there is a pooled worker.
# Ray's daemons are told apart by their program, or a Python one by its script (PROGRAMS: the first
# the program's or the script's path ends with).
TITLES = (
    ("ray::TrainWorker", "TrainWorker"),  # raytf's workers, standbys included
    ("ray::RayTrainWorker", "Ray Train"),  # test_ray_train_compat's anchors
    ("ray::TrainController", "Ray Train"),
    ("ray::_StatsActor", "Ray Data actors"),
    ("ray::_AutoscalingCoordinatorActor", "Ray Data actors"),
    ("ray::SplitCoordinator", "Ray Data actors"),
    ("ray::JobSupervisor", "Ray jobs"),
    ("ray::DashboardAgent", "dashboard agents"),
    ("ray::RuntimeEnvAgent", "runtime env agents"),
    ("ray::", "pooled Ray workers"),
)
PROGRAMS = (
    ("/raylet/raylet", "raylets"),
    ("/gcs/gcs_server", "GCS servers"),
    ("/workers/default_worker.py", "pooled Ray workers"),  # before it takes its title
    ("/dashboard/agent.py", "dashboard agents"),
    ("/runtime_env/agent/main.py", "runtime env agents"),
    ("/log_monitor.py", "log monitors"),
    ("/dashboard/dashboard.py", "dashboards"),
    ("/autoscaler/_private/monitor.py", "autoscaler monitors"),
    # raytf's fork servers and their clients (python -m raytf_forkserver); a worker forked from a
    # server has the server's command line until Ray titles it, and counts as what it becomes.
    ("raytf_forkserver", "fork servers"),
)


def kind_of(argv: list[str]) -> str:
    """The kind of process a command line (its words) names; "other" for the rest (the jobs'
    drivers, the ``ray`` and ``raytf`` commands, the subprocesses tests start, the wheel's build)."""
    if not argv:
        return "other"
    for prefix, kind in TITLES:
        if argv[0].startswith(prefix):
            return kind
    if argv[0].startswith("ray-dashboard-"):  # the dashboard's modules, each a process titled so
        return "dashboards"
    script = next((word for word in argv[1:] if not word.startswith("-")), "") if "python" in argv[0] else ""
    for suffix, kind in PROGRAMS:
        if argv[0].endswith(suffix) or script.endswith(suffix):
            return kind
    return "other"


class TreeCpu:
    """``total()``: the CPU-seconds all processes under this one have used since it started watching,
    never decreasing. Linux only: ``available`` is False elsewhere, and ``total()`` then 0."""

    def __init__(self, interval_s: float = 1.0):
        self.available = os.path.isdir("/proc/self")
        self._ticks = os.sysconf("SC_CLK_TCK") if self.available else 100
        self._latest: dict[tuple[int, str], int] = {}  # (pid, start time) -> its CPU ticks, last seen
        self._kinds: dict[tuple[int, str], int] = {}  # (pid, start time) -> its kind's place in _ORDER
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.available:
            self._look()
            self._thread = threading.Thread(target=self._watch, name="suite-record-cpu", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def total(self) -> float:
        if not self.available:
            return 0.0
        self._look()
        with self._lock:
            return sum(self._latest.values()) / self._ticks

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._look()

    def _look(self) -> None:
        parent: dict[int, int] = {}
        seen: dict[int, tuple[str, int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:  # ended meanwhile
                continue
            fields = stat[stat.rindex(")") + 2:].split()  # after the command's name, which may hold spaces
            pid = int(name)
            parent[pid] = int(fields[1])
            if parent[pid] == 1:  # an orphan: a raytf fork server counts under the raylet it serves
                parent[pid] = _served_raylet(pid) or 1
            seen[pid] = (fields[19], int(fields[11]) + int(fields[12]))  # start time; utime + stime
        me, under = os.getpid(), set()
        for pid in seen:
            chain, p = [], pid
            while p not in under and p != me and p in parent and p > 1:
                chain.append(p)
                p = parent[p]
            if p == me or p in under:
                under.update(chain)
        under.add(me)
        with self._lock:
            for pid in under:
                started, ticks = seen[pid]
                key = (pid, started)
                if ticks > self._latest.get(key, -1) or key not in self._kinds:
                    self._latest[key] = max(ticks, self._latest.get(key, 0))
                    self._kinds[key] = min(self._kinds.get(key, _OTHER), self._kind_now(pid, me))

    def by_kind(self) -> dict[str, float]:
        """``total()`` split by kind of process (``kind_of``; "pytest" for this process), costliest first."""
        if not self.available:
            return {}
        self._look()
        spent: dict[str, float] = {}
        with self._lock:
            for key, ticks in self._latest.items():
                kind = _ORDER[self._kinds.get(key, _OTHER)]
                spent[kind] = spent.get(kind, 0.0) + ticks / self._ticks
        return {kind: round(cpu_s, 1) for kind, cpu_s in sorted(spent.items(), key=lambda kv: -kv[1])}

    @staticmethod
    def _kind_now(pid: int, me: int) -> int:
        """The kind's place in ``_ORDER``. Of the kinds a process was seen as, it keeps the one that
        comes first there (a pooled worker that became a TrainWorker is a TrainWorker)."""
        if pid == me:
            return _ORDER.index("pytest")
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            return _OTHER
        return _ORDER.index(kind_of([word for word in argv if word]))


def _served_raylet(pid: int) -> int | None:
    """The raylet a fork server serves (``raytf_forkserver --serve <socket> <raylet pid>``), which
    its client detached it from: the server, and every worker forked from it, are that raylet's."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "raytf_forkserver" in argv and "--serve" in argv and len(argv) >= 2:
        words = [word for word in argv if word]
        return int(words[-1]) if words[-1].isdigit() else None
    return None


# Every kind in the order a process's kind is decided by, when it was seen as several.
_ORDER = [*dict.fromkeys(kind for _, kind in (*TITLES, *PROGRAMS)), "pytest", "other"]
_OTHER = len(_ORDER) - 1

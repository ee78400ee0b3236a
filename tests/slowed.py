"""The suite on a machine slower than this one: a command, and every process it starts (the Ray
clusters of the tests included), held to fewer CPUs than the machine has by a CFS quota of Linux's
cgroups.

    python -m tests.slowed 1.33 -- python -m pytest -p no:cacheprovider --suite-record /tmp/slowed.jsonl

Machines of this project's kind run the suite record's reference loop in 0.47 to 0.92 CPU-seconds
(tests/records/suite.jsonl): the same kind, nearly two to one apart. Held to 1.33 of its two CPUs,
a fast one does the suite's work as one a third slower would, both cores still running side by
side, so a test that passes only where the machine is fast fails here as it would on a slow one:
the check of the rule that no test waits on the machine's speed (docs/contributing.md). Such a
run's record notes its quota (``machine.cpu_quota``, tests/conftest.py) and is kept apart from the
whole runs on a machine's full cores, in tests/records/suite_slowed.jsonl.

It makes a cgroup (root only), under cgroup v2 (``cpu.max``) where the cpu controller is there,
else under v1's cpu controller (``cpu.cfs_quota_us``), and removes it when the command ends
(or says where it is, where a process the command started still runs in it).
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = "/sys/fs/cgroup"
PERIOD_US = 100_000  # CFS's default period: the quota is CPUs x this, per period


def _v2_base(root: str) -> str | None:
    """Where cgroup v2 is mounted with the cpu controller (the whole tree, or a hybrid's unified
    part), else None."""
    for base in (root, os.path.join(root, "unified")):
        try:
            with open(os.path.join(base, "cgroup.controllers")) as f:
                if "cpu" in f.read().split():
                    return base
        except OSError:
            continue
    return None


def _v1_base(root: str) -> str | None:
    """Where cgroup v1's cpu controller is mounted, alone or with cpuacct, else None."""
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = os.path.join(root, name)
        if os.path.exists(os.path.join(base, "cpu.cfs_quota_us")):
            return base
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_quota(proc_cgroup: str | None = None, root: str = ROOT) -> float | None:
    """The CPUs this process may use under CFS quotas (its cgroup's, or a parent's where smaller),
    rounded to hundredths; None where no quota holds it (or there is no cgroup to read).
    ``proc_cgroup``: the text of /proc/self/cgroup (read where not given)."""
    if proc_cgroup is None:
        proc_cgroup = _read("/proc/self/cgroup") or ""
    quotas = []
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            base, v2 = _v2_base(root), True
        elif "cpu" in controllers.split(","):
            base, v2 = _v1_base(root), False
        else:
            continue
        if base is None:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the cgroup, then each parent up to the root
            directory = os.path.join(base, *parts[:depth])
            if v2:
                limit = (_read(os.path.join(directory, "cpu.max")) or "max").split()
                if limit[0] != "max" and len(limit) == 2:
                    quotas.append(int(limit[0]) / int(limit[1]))
            else:
                quota, period = (_read(os.path.join(directory, f"cpu.cfs_{n}_us")) for n in ("quota", "period"))
                if quota and period and int(quota) > 0:
                    quotas.append(int(quota) / int(period))
    return round(min(quotas), 2) if quotas else None


def hold(cpus: float, name: str, root: str = ROOT) -> str:
    """Make the cgroup ``name`` with a quota of ``cpus`` CPUs; the path of its ``cgroup.procs``,
    where a process writes its pid to join it."""
    if cpus <= 0:
        raise ValueError(f"CPUS must be more than 0, not {cpus:g}")
    quota = round(cpus * PERIOD_US)
    base = _v2_base(root)
    if base is not None:
        try:  # the cpu controller for the root's children (where the root already gives it, a no-op)
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+cpu")
        except OSError:
            pass
        directory = os.path.join(base, name)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "cpu.max"), "w") as f:
            f.write(f"{quota} {PERIOD_US}")
        return os.path.join(directory, "cgroup.procs")
    base = _v1_base(root)
    if base is None:
        raise RuntimeError(f"no cgroup cpu controller under {root}: this needs Linux's cgroups (v1 or v2)")
    directory = os.path.join(base, name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "cpu.cfs_period_us"), "w") as f:
        f.write(str(PERIOD_US))
    with open(os.path.join(directory, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(quota))
    return os.path.join(directory, "cgroup.procs")


def main(argv: list[str], root: str = ROOT) -> int:
    """``CPUS -- COMMAND...``: run COMMAND held to CPUS; its exit status."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m tests.slowed CPUS -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        cpus = float(argv[0])
    except ValueError:
        print(f"CPUS must be a number of CPUs (1.33, say), not {argv[0]!r}", file=sys.stderr)
        return 2
    procs = hold(cpus, f"raytf-slowed-{os.getpid()}", root)

    def join() -> None:  # in the child, before the command: it and all it starts are held
        with open(procs, "w") as f:
            f.write(str(os.getpid()))

    status = subprocess.run(argv[2:], preexec_fn=join).returncode
    try:
        os.rmdir(os.path.dirname(procs))
    except OSError:  # a process it started outlives it (a Ray daemon ending): the kernel keeps the group
        print(f"{os.path.dirname(procs)} still holds processes; remove it once they end", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""CPU-seconds of this process and every process it started, theirs in turn included: the suite
record's measure of what a test costs the whole run (tests/conftest.py, ``--suite-record``).

The suite is bound by CPU (both cores busy through most of a run), so a test's seconds shrink or
grow with what the other pytest process runs meanwhile; its CPU, its Ray processes' included,
does not. A Ray node's raylet does not collect the CPU time of the workers it started when they end
(its children's times never reach its own), so :class:`TreeCpu` looks at the processes instead:
every second, and at each reading, it lists the processes under this one (Linux's /proc) and keeps
each one's latest CPU time. A process that ends between two looks loses what it used since the
last; one that outlives its parent is counted while it runs under this process and lost after.
"""

from __future__ import annotations

import os
import threading


class TreeCpu:
    """``total()``: the CPU-seconds all processes under this one have used since it started watching,
    never decreasing. Linux only: ``available`` is False elsewhere, and ``total()`` then 0."""

    def __init__(self, interval_s: float = 1.0):
        self.available = os.path.isdir("/proc/self")
        self._ticks = os.sysconf("SC_CLK_TCK") if self.available else 100
        self._latest: dict[tuple[int, str], int] = {}  # (pid, start time) -> its CPU ticks, last seen
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
                if ticks > self._latest.get(key, -1):
                    self._latest[key] = ticks

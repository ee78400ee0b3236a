"""tests/cpu.py: the suite record's CPU-seconds of a process tree (tests/conftest.py)."""

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

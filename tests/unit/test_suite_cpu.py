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


class _Item:
    """As much of a pytest item as the suite's ordering reads: its xdist_group marker."""

    def __init__(self, group: str, name: str):
        self.group, self.name = group, name

    def iter_markers(self, name: str):
        return [pytest.mark.xdist_group(self.group).mark] if name == "xdist_group" else []


def test_the_test_files_run_longest_first_by_the_newest_whole_run_a_new_file_before_all(tmp_path):
    import json

    from tests.conftest import _longest_groups_first

    record = tmp_path / "suite.jsonl"
    runs = [
        {"exit_status": 0, "args": [], "tests_s": {"a::t1@a": 5.0, "a::t2@a": 1.0, "b::t@b": 50.0}},
        {"exit_status": 0, "args": [], "tests_s": {"a::t1@a": 60.0, "a::t2@a": 1.0, "b::t@b": 50.0, "d::t@d": 0.1}},
        {"exit_status": 1, "args": [], "tests_s": {"d::t@d": 900.0}},  # failed: not read
        {"exit_status": 0, "args": ["-m", "unit"], "tests_s": {"d::t@d": 900.0}},  # part of the suite: not read
    ]
    record.write_text("".join(json.dumps(r) + "\n" for r in runs))
    items = [_Item(g, n) for g, n in (("d", "t"), ("a", "t1"), ("a", "t2"), ("b", "t"), ("c", "t1"), ("c", "t2"))]
    _longest_groups_first(items, str(record))
    # c is new (first, its tests in their order), then a (61 s), b (50 s), d (0.1 s).
    assert [(i.group, i.name) for i in items] == [("c", "t1"), ("c", "t2"), ("a", "t1"), ("a", "t2"), ("b", "t"),
                                                 ("d", "t")]
    untouched = [_Item("x", "t"), _Item("y", "t")]
    _longest_groups_first(untouched, str(tmp_path / "no-record.jsonl"))  # no record: the order collected
    assert [i.group for i in untouched] == ["x", "y"]

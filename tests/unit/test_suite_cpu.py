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


class _Test:
    """What tests/conftest.py reads of a collected test: its pytest-xdist group."""

    def __init__(self, group: str, name: str) -> None:
        self.group, self.name = group, name

    def iter_markers(self, name: str):
        assert name == "xdist_group"
        return iter([pytest.mark.xdist_group(self.group).mark])


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
    # With no record, the order collected.
    (tmp_path / "records" / "suite.jsonl").unlink()
    assert [t.name for t in _longest_groups_first(tests, str(tmp_path))] == ["u1", "u2", "a1", "a2", "b1", "n1"]


def test_the_reference_measures_the_machine_with_a_workers_tensorflow(tmp_path):
    """What the suite record's ``reference`` is made of: both measurements, each some CPU; the
    import ran as a worker's does, the test-only packages hidden (tests/hidden.py)."""
    from tests.conftest import reference_cpu_s
    from tests.hidden import TEST_ONLY

    measured = reference_cpu_s(tmp_path)
    assert set(measured) == {"python_loop", "import_tensorflow"}
    assert measured["python_loop"] > 0.05 and measured["import_tensorflow"] > 0.1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(TEST_ONLY)


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

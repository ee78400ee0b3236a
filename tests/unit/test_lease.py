"""The run lease on a local directory with a fake clock: no Ray, no TensorFlow."""

import json
import os
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from raytf import RunInUseError
from raytf._internal.lease import LEASE_DIR, RunLease, holds

FS = pafs.LocalFileSystem()


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


def lease(tmp_path, clock, ttl_s=60.0, name="run"):
    return RunLease(FS, str(tmp_path / name), name, ttl_s=ttl_s, clock=clock, monotonic=clock)


def claims(tmp_path, name="run"):
    return sorted(os.listdir(tmp_path / name / LEASE_DIR))


def test_a_second_driver_is_refused_and_told_who_holds_the_run(tmp_path):
    clock = Clock()
    first = lease(tmp_path, clock)
    first.acquire()
    second = lease(tmp_path, clock)
    with pytest.raises(RunInUseError) as refused:
        second.acquire()
    message = str(refused.value)
    assert "run 'run' is in use by another driver" in message
    assert f"pid {os.getpid()}" in message and "host " in message and "started " in message
    assert claims(tmp_path) == [f"{first.token}.json"]  # the refused driver left nothing behind
    first.release()
    assert claims(tmp_path) == []
    second.acquire()  # free again
    second.release()


def test_an_expired_claim_is_taken_over(tmp_path):
    clock = Clock()
    dead = lease(tmp_path, clock, ttl_s=30)
    dead.acquire()
    dead._stop.set()  # the driver is gone: no more renewals
    clock.now += 29
    with pytest.raises(RunInUseError):
        lease(tmp_path, clock).acquire()
    clock.now += 2  # 31 s since the last renewal
    successor = lease(tmp_path, clock)
    successor.acquire()
    assert claims(tmp_path) == [f"{successor.token}.json"]
    successor.release()


def test_a_claim_of_a_dead_process_on_this_machine_is_taken_over_at_once(tmp_path):
    clock = Clock()
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = lease(tmp_path, clock)
    dead.acquire()
    dead._stop.set()
    path = tmp_path / "run" / LEASE_DIR / f"{dead.token}.json"
    claim = json.loads(path.read_text())
    claim["pid"] = int(child.stdout)  # a process that has exited
    path.write_text(json.dumps(claim))
    successor = lease(tmp_path, clock)
    successor.acquire()  # no wait for the TTL
    successor.release()


def test_a_driver_that_stopped_renewing_has_lost_the_run(tmp_path):
    clock = Clock()
    holder = lease(tmp_path, clock, ttl_s=40)
    holder.acquire()
    holder._stop.set()
    holder.check()  # fresh
    assert holds(FS, str(tmp_path / "run"), holder.token, now=clock.now)
    clock.now += 41  # suspended past its TTL: another driver may hold the run now
    assert not holds(FS, str(tmp_path / "run"), holder.token, now=clock.now)
    with pytest.raises(RunInUseError, match="did not renew its lease .* for over 40 s"):
        holder.check()
    with pytest.raises(RunInUseError):
        holder.ensure_held()


def test_a_driver_whose_claim_was_removed_has_lost_the_run(tmp_path):
    clock = Clock()
    holder = lease(tmp_path, clock, ttl_s=40)
    holder.acquire()
    holder._stop.set()
    os.remove(tmp_path / "run" / LEASE_DIR / f"{holder.token}.json")
    clock.now += 25  # more than half a TTL: check() renews, and finds the claim gone
    with pytest.raises(RunInUseError, match="removed by another driver"):
        holder.check()


def test_renewal_keeps_the_claim_alive(tmp_path):
    clock = Clock()
    holder = lease(tmp_path, clock, ttl_s=40)
    holder.acquire()
    holder._stop.set()
    for _ in range(5):
        clock.now += 15
        holder.renew()
    with pytest.raises(RunInUseError):
        lease(tmp_path, clock).acquire()  # 75 s after it began, still held
    assert holds(FS, str(tmp_path / "run"), holder.token, now=clock.now)


def test_runs_of_other_names_are_independent(tmp_path):
    clock = Clock()
    a, b = lease(tmp_path, clock, name="a"), lease(tmp_path, clock, name="b")
    a.acquire()
    b.acquire()
    a.release()
    b.release()


def test_a_claim_that_storage_kept_after_this_process_released_it_does_not_refuse_its_next_driver(tmp_path, monkeypatch):
    """Storage gone read-only (or full) mid-run refuses the claim's delete at release; the same
    process running the run again is not refused by its own stale claim (another is, as before)."""
    first = RunLease(FS, str(tmp_path), "r", ttl_s=60)
    first.acquire()
    monkeypatch.setattr(RunLease, "_delete_claim", lambda self: None)  # the delete refused
    first.release()
    monkeypatch.undo()
    claims = os.listdir(tmp_path / LEASE_DIR)
    assert len(claims) == 1  # the stale claim is still there, naming this process
    second = RunLease(FS, str(tmp_path), "r", ttl_s=60)
    second.acquire()  # not refused by it, and it was removed on the way
    assert os.listdir(tmp_path / LEASE_DIR) != claims and len(os.listdir(tmp_path / LEASE_DIR)) == 1
    with pytest.raises(RunInUseError):  # a claim this process holds still refuses
        RunLease(FS, str(tmp_path), "r", ttl_s=60).acquire()
    second.release()

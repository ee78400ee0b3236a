"""Naming the rank that stopped taking part: the pure rules and the stack classification."""

import sys
import threading
import time

from raytf import WorkerFailure
from raytf._internal.worker.activity import ActivityTracker, classify
from raytf._internal.driver.hang import blame_collective, find_hangs
from raytf._internal.protocol import Activity

IPS = {0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"}


def test_a_rank_that_returned_while_another_waits_is_named_once_both_last_the_timeout():
    waiting = Activity("tensorflow", 301.0, "train.py:10 in step")
    assert find_hangs({0: waiting, 1: Activity("finished", 301.0)}, 300.0, IPS)[0].kind == "returned_early"
    assert find_hangs({0: Activity("tensorflow", 299.0), 1: Activity("finished", 400.0)}, 300.0, IPS) == []
    [hang] = find_hangs({0: waiting, 1: Activity("finished", 5.0), 2: Activity("tensorflow", 1.0)}, 300.0, IPS)
    assert (hang.rank, hang.node_ip) == (1, "10.0.0.2")
    assert "rank 0 still waits" in hang.message and "hang_timeout_s=300" in hang.message


def test_a_rank_idle_in_its_own_code_is_named_with_where_it_is():
    found = find_hangs({
        0: Activity("tensorflow", 400.0), 1: Activity("python", 350.0, "train.py:42 in load"),
        2: Activity("tensorflow", 400.0),
    }, 300.0, IPS)
    assert [(f.rank, f.kind) for f in found] == [(1, "stalled")]
    assert "train.py:42 in load" in found[0].message and "ranks 0, 2 wait" in found[0].message


def test_no_hang_while_nobody_waits_in_tensorflow_or_nobody_is_out_of_it():
    assert find_hangs({0: Activity("python", 900.0), 1: Activity("finished", 900.0)}, 300.0, IPS) == []
    assert find_hangs({0: Activity("tensorflow", 900.0), 1: Activity("tensorflow", 900.0)}, 300.0, IPS) == []
    # raytf's own work (an upload, a commit being awaited) is taking part.
    assert find_hangs({0: Activity("tensorflow", 900.0), 1: Activity("raytf", 900.0)}, 300.0, IPS) == []
    assert find_hangs({0: Activity("tensorflow", 900.0), 1: Activity("finished", 900.0)}, None, IPS) == []


def test_a_collective_timeout_names_the_idle_peer_not_the_rank_that_timed_out():
    timed_out = WorkerFailure(rank=0, kind="collective", error_type="DeadlineExceededError",
                              message="timed out", traceback="", time=1.0)
    [cause] = blame_collective(timed_out, {0: Activity("tensorflow", 10.0), 1: Activity("python", 9.0, "t.py:3 in f")}, IPS)
    assert (cause.rank, cause.kind) == (1, "stalled") and "DeadlineExceededError" in cause.message
    # A peer busy for a moment in its own code is not blamed.
    assert blame_collective(timed_out, {0: Activity("tensorflow", 10.0), 1: Activity("python", 0.5)}, IPS) == []


def _frame_of(target):
    """The innermost frame of a thread running ``target`` (which blocks on an event)."""
    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=target, args=(ready, done), daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.05)
    frame = sys._current_frames()[thread.ident]
    return frame, done, thread


def test_the_stack_says_whether_a_thread_is_in_its_own_code_or_in_a_library_it_called():
    def sleeps_in_own_code(ready, done):
        ready.set()
        done.wait(5)  # threading.py: a library; the frame that called it is the user's

    frame, done, thread = _frame_of(sleeps_in_own_code)
    kind, where = classify(frame)
    done.set(), thread.join()
    assert kind == "python" and where.endswith("in sleeps_in_own_code") and "test_hang.py:" in where


def test_a_torn_read_of_another_threads_stack_ends_the_walk_and_never_fails_the_poll(monkeypatch):
    """A poll samples the training thread's stack while that thread may run: on CPython 3.11 a
    link of the chain then at times names a function, not a frame (a worker's every poll raised
    AttributeError for 30 s, and its rank was taken for unresponsive). The walk ends there, and a
    sample that cannot be read at all keeps the kind it had."""
    from raytf._internal.worker import activity

    def not_a_frame():
        pass

    assert classify(not_a_frame) == ("raytf", "")  # what a torn f_back handed the walk

    def sleeps_in_own_code(ready, done):
        ready.set()
        done.wait(5)

    frame, done, thread = _frame_of(sleeps_in_own_code)
    now = [0.0]
    tracker = ActivityTracker(clock=lambda: now[0])
    first = tracker.sample(thread.ident)
    assert first.kind == "python"

    def torn(frame):
        raise SystemError("a frame's memory was reused")

    monkeypatch.setattr(activity, "classify", torn)
    now[0] = 4.0
    assert tracker.sample(thread.ident) == Activity("python", 4.0, "")  # the kind it had, still aging
    done.set(), thread.join()


def test_a_tracker_measures_how_long_a_kind_has_lasted():
    now = [0.0]
    tracker = ActivityTracker(clock=lambda: now[0])
    assert tracker.finished().seconds == 0.0
    now[0] = 7.0
    assert tracker.finished() == Activity("finished", 7.0, "")
    now[0] = 8.0
    assert tracker.sample(None).seconds == 0.0  # a new kind starts its own clock


def test_a_train_fn_installed_as_a_package_is_the_users_code(tmp_path, monkeypatch):
    import importlib

    from raytf._internal.worker import activity

    package = tmp_path / "lib" / "python3" / "site-packages" / "raytf_test_userpkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "training.py").write_text(
        "def train_fn(ready, done):\n"
        "    ready.set()\n"
        "    done.wait(5)  # idles in its own code: the stall raytf must name\n"
    )
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setattr(activity, "_user_roots", ())
    train_fn = importlib.import_module("raytf_test_userpkg.training").train_fn
    activity.note_user_code(train_fn)  # what a payload does when it loads train_fn
    frame, done, thread = _frame_of(train_fn)
    kind, where = classify(frame)
    done.set(), thread.join()
    assert kind == "python" and "site-packages/raytf_test_userpkg/training.py:3 in train_fn" in where


def test_the_watch_finds_a_hang_by_aging_what_each_rank_last_said():
    """GroupWatch.round: rank 0 said it waits in TensorFlow, rank 1 that it runs its own code, both
    at t=0 and never again; nothing at 299 s, rank 1 named at 301 s (hang_timeout_s=300)."""
    from raytf._internal.driver.watch import GroupWatch
    from raytf._internal.protocol import Phase, WorkerStatus

    now = [0.0]
    watch = GroupWatch({0: "10.0.0.1", 1: "10.0.0.2"}, start_timeout_s=60, worker_timeout_s=30,
                       hang_timeout_s=300.0, clock=lambda: now[0])
    watch.released = True
    watch.heard(0, WorkerStatus(rank=0, phase=Phase.TRAINING, activity=Activity("tensorflow", 0.0)))
    watch.heard(1, WorkerStatus(rank=1, phase=Phase.TRAINING, activity=Activity("python", 0.0, "t.py:3 in f")))
    now[0] = 299.0
    assert watch.round(None).failures == ()
    now[0] = 301.0
    [hang] = watch.round(None).failures
    assert (hang.rank, hang.kind) == (1, "stalled") and "t.py:3 in f" in hang.message

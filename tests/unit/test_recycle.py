"""Keeping a worker's process for the next attempt (worker/recycle.py): when its train_fn is
stopped and when the process is given up instead. TensorFlow's side (collectives aborted, a new
eager context) is the hooks' behaviour check and the one-kill run of tests/integration/test_recovery.py."""

import sys
import threading
import types

from raytf._internal.worker import recycle
from raytf._internal.worker.payloads import SubprocessPayload, TrainFnPayload


def _train_fn_payload(uploading=False):
    payload = TrainFnPayload()
    payload.session = types.SimpleNamespace(uploading=lambda: uploading)
    return payload


def test_a_train_fn_is_stopped_by_aborting_its_collectives_and_one_that_does_not_end_is_given_up(monkeypatch):
    aborted, release = [], threading.Event()
    # Aborting is asked of TensorFlow where it is loaded (the hook itself is stood in for here).
    monkeypatch.setitem(sys.modules, "tensorflow", sys.modules.get("tensorflow") or types.ModuleType("tensorflow"))

    def through(name, reach, *args):
        aborted.append(name)
        release.set()  # the collective it waited in raises: train_fn ends
        return None

    monkeypatch.setattr(recycle, "_through", through)
    waiting = threading.Thread(target=release.wait)
    waiting.start()
    assert recycle.stop(_train_fn_payload(), waiting, timeout_s=5.0) is None
    assert aborted == ["tensorflow.abort_collectives"] and not waiting.is_alive()

    # A loop that never calls into TensorFlow again does not end: the process is not kept.
    stuck = threading.Event()
    looping = threading.Thread(target=stuck.wait, daemon=True)
    looping.start()
    monkeypatch.setattr(recycle, "_through", lambda name, reach, *args: None)
    assert recycle.stop(_train_fn_payload(), looping, timeout_s=0.2) == (
        "its train_fn did not end within 0.2 s of the attempt's end")
    stuck.set()

    # A hook that no longer works: its error is the reason, and nothing is waited for.
    monkeypatch.setattr(recycle, "_through", lambda name, reach, *args: f"HookError: {name}")
    blocked = threading.Thread(target=threading.Event().wait, daemon=True)
    blocked.start()
    assert recycle.stop(_train_fn_payload(), blocked, timeout_s=60.0) == "HookError: tensorflow.abort_collectives"


def test_only_a_train_fn_worker_with_no_checkpoint_uploading_is_kept():
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    assert recycle.stop(None, None, 1.0) is None  # placed, never started
    assert recycle.stop(_train_fn_payload(), ended, 1.0) is None
    assert recycle.stop(_train_fn_payload(uploading=True), ended, 1.0) == (
        "an asynchronous checkpoint of the attempt is still uploading")
    assert recycle.stop(SubprocessPayload(), ended, 1.0) == "not a train_fn worker under MultiWorkerMirroredStrategy"

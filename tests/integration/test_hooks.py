"""Every hook into TensorFlow's, Keras's, tf-keras's and Ray's private code, used for real against
the installed versions, in a process of its own (as ``python -m raytf._internal.hooks`` and
``nox -s next`` run it); Ray's against the session's cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from raytf._internal import hooks
from tests.hidden import hiding

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_hook_behaves_as_raytf_uses_it_with_the_installed_libraries(cluster, tmp_path):
    import signal

    checking = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-m", "raytf._internal.hooks", "--json", "--address", cluster.address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env=hiding(tmp_path / "hidden", {**os.environ, "PYTHONPATH": REPO}),
    )
    try:
        out, err = checking.communicate(timeout=300)
    except subprocess.TimeoutExpired:  # where each of its threads waited (faulthandler), then the failure
        checking.send_signal(signal.SIGABRT)
        out, err = checking.communicate(timeout=30)
        raise AssertionError(f"python -m raytf._internal.hooks ran past 300 s:\n{err[-8000:]}") from None
    done = subprocess.CompletedProcess(checking.args, checking.returncode, out, err)
    reports = {r["hook"]: r for r in map(json.loads, (line for line in done.stdout.splitlines() if line.startswith("{")))}
    assert set(reports) == {h.name for h in hooks.all_hooks()}, done.stderr[-3000:]
    broken = {name: r for name, r in reports.items() if r["probe"] != "ok" or r["behaviour"] not in ("ok", "none")}
    assert not broken and done.returncode == 0, json.dumps(broken, indent=1)
    for hook in hooks.all_hooks():  # each hook with a behaviour check ran it, Ray's included
        assert reports[hook.name]["behaviour"] == ("ok" if hook.behaves else "none"), hook.name
    # Those only a cluster of workers can show, each shown by a test that trains through it.
    assert {h.name for h in hooks.all_hooks() if h.behaves is None} == {
        "keras.model_fit",  # test_keras: Keras 3's own model.fit on two workers, killed and resumed
        "tf_keras.fit_data_handler",  # test_exactly_once: tf-keras's fit resumed mid-epoch
        "tf_keras.multi_step_train_function",  # test_parameter_server: tf-keras model.fit, a lost worker
    }

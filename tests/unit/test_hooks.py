"""Each reach into TensorFlow's, Keras's and tf-keras's private code works with the installed
versions, and one that does not fails loudly, naming what, the versions and the option to turn off."""

import os
import subprocess
import sys

import pytest

import raytf
from raytf._internal import hooks
from tests.hidden import hiding


@pytest.mark.parametrize("hook", hooks.all_hooks(), ids=lambda h: h.name)
def test_every_hook_works_with_the_installed_libraries(hook):
    hook.check()


def test_the_probes_do_not_start_tensorflow_before_the_strategy_configures_its_collectives(tmp_path):
    # MultiWorkerMirroredStrategy must configure collective ops before TensorFlow's eager context
    # initializes; a probe that ran an op at worker start would break every run.
    code = ("from raytf._internal import hooks\n"
            "[h.check() for h in hooks.all_hooks()]\n"
            "from tensorflow.python.eager import context\n"
            "assert not context.context()._initialized, 'a probe initialized the eager context'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=hiding(tmp_path / "hidden", dict(os.environ)))
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_keras_optimizer_without_the_hook_fails_the_feature_naming_versions_and_the_option(monkeypatch):
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    from raytf._internal.worker import compression

    monkeypatch.delattr(TFOptimizer, "_all_reduce_sum_gradients")
    import keras  # noqa: F401 - loaded, so patch_optimizers patches it

    with pytest.raises(raytf.HookError) as info:
        compression.patch_optimizers()
    message = str(info.value)
    assert "TFOptimizer._all_reduce_sum_gradients" in message and f"keras {keras.__version__}" in message
    from raytf._version import NEWEST, OLDEST

    assert f"raytf is tested with TensorFlow {OLDEST['tensorflow']} to {NEWEST['tensorflow']}" in message
    assert "turn off TensorflowConfig.gradient_compression and raytf.keras.local_sgd" in message


def test_a_keras_whose_metrics_do_not_sum_over_workers_is_refused(monkeypatch):
    from keras.src.metrics.metric import Metric

    def add_variable(self, shape, initializer, dtype=None, aggregation="sum", name=None):
        """Keras before 3.10: a plain variable per worker."""

    monkeypatch.setattr(Metric, "add_variable", add_variable)
    with pytest.raises(raytf.HookError, match="synchronize metric variables on read"):
        hooks.require("keras.model_fit")


def test_a_tf_keras_without_the_hook_fails_the_same_way(monkeypatch):
    from tf_keras.src.optimizers.legacy import optimizer_v2

    from raytf._internal.worker import compression

    monkeypatch.delattr(optimizer_v2.OptimizerV2, "_aggregate_gradients")
    import tf_keras  # noqa: F401

    with pytest.raises(raytf.HookError, match="OptimizerV2 has no _aggregate_gradients"):
        compression.patch_optimizers()


def test_a_worker_checks_the_hooks_its_settings_stand_on():
    base = dict(keras3=False, tf_keras=False, compression=False, gpu=False, parameter_server=False)
    assert hooks.needed(**base) == [
        "tensorflow.collective_new", "tensorflow.dataset_graph", "tensorflow.dataset_options"]
    assert "keras.optimizer_all_reduce" in hooks.needed(**{**base, "keras3": True, "compression": True})
    assert "tf_keras.optimizer_aggregate" in hooks.needed(**{**base, "tf_keras": True, "compression": True})
    assert "tensorflow.physical_devices" in hooks.needed(**{**base, "gpu": True})
    ps = hooks.needed(**{**base, "parameter_server": True, "tf_keras": True})
    assert {"tensorflow.coordinator_server_def", "tf_keras.callback_batch_hooks"} <= set(ps)
    names = {h.name for h in hooks.all_hooks()}
    assert set(hooks.needed(**{k: True for k in base})) <= names


def test_a_tensorflow_without_host_copies_fails_asynchronous_state_checkpoints_naming_the_option(monkeypatch):
    import tensorflow as tf
    from tensorflow.python.checkpoint import async_checkpoint_helper

    from raytf._internal.checkpoint import state

    monkeypatch.setattr(state, "_checked", False)
    monkeypatch.delattr(async_checkpoint_helper, "_get_all_trackables")
    with pytest.raises(raytf.HookError) as info:
        state.host_copy({"v": tf.Variable(1.0)})
    assert "_get_all_trackables" in str(info.value) and 'CheckpointConfig(upload="sync")' in str(info.value)


def test_drain_watching_on_a_ray_without_its_private_api_warns_once_naming_what_the_run_loses(monkeypatch, caplog):
    """Ray has no public API for drains: where its private one is gone, the driver reads "nothing
    draining" and says so once (not at every poll), naming the hook, Ray's version and the cost."""
    import logging

    import ray
    from ray._private.state import GlobalState

    from raytf._internal.driver import cluster
    from raytf._internal.hooks import _hook

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a connected driver, as far as raytf asks
    monkeypatch.delattr(GlobalState, "get_draining_nodes")
    monkeypatch.setattr(cluster, "_checked", set())
    monkeypatch.setattr(_hook, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert [cluster.draining_nodes() for _ in range(3)] == [{}, {}, {}]
    told = [r.getMessage() for r in caplog.records if "[hook ray.draining_nodes]" in r.getMessage()]
    assert len(told) == 1, told
    assert "GlobalState.get_draining_nodes" in told[0] and f"ray {ray.__version__}" in told[0]
    assert "counted against FailureConfig.max_failures" in told[0] and "goes on without it" in told[0]


def test_a_changed_private_api_found_only_when_called_warns_the_same_way(monkeypatch, caplog):
    """A probe that passes but a call that fails the way a changed API does (the method there, its
    answer not): the same single warning, and the reader goes on with "unknown"."""
    import logging

    import ray
    from ray._private.state import GlobalState

    from raytf._internal.driver import cluster
    from raytf._internal.hooks import _hook

    def changed(self):
        raise AttributeError("'GcsClient' object has no attribute 'get_draining_nodes'")

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(GlobalState, "get_draining_nodes", changed)
    monkeypatch.setattr(cluster, "_checked", set())
    monkeypatch.setattr(_hook, "_warned", set())
    with caplog.at_level(logging.WARNING):
        assert cluster.draining_nodes() == {} and cluster.draining_nodes() == {}
    assert len([r for r in caplog.records if "[hook ray.draining_nodes]" in r.getMessage()]) == 1


def test_every_hook_and_patch_is_listed_in_the_docs(monkeypatch):
    import importlib
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    assert "<!-- raytf:hooks -->" in (root / "docs" / "reference" / "hooks.md").read_text()
    monkeypatch.syspath_prepend(str(root / "docs" / "_hooks"))
    tables = importlib.import_module("reference").hooks_markdown(str(root))  # what the build writes there
    for hook in hooks.all_hooks():
        assert f"| `{hook.name}` | {' '.join(hook.reaches.split())}" in tables
    for patch in hooks.PATCHES:
        assert f"| `{patch.name}` |" in tables


def test_the_hook_checker_reports_a_hook_that_is_there_but_does_not_behave():
    """``python -m raytf._internal.hooks`` (and ``nox -s next``) tells a hook whose probe passes
    but whose behaviour changed apart from one that is gone, each by name and cause."""
    from raytf._internal.hooks import __main__ as checker

    def drifted():
        raise AssertionError("the records from byte 35 read []")

    fine = hooks.Hook("x.fine", "tensorflow", "x", "a feature", "an option", lambda: None, behaves=lambda: None)
    changed = hooks.Hook("x.changed", "tensorflow", "x", "a feature", "an option", lambda: None, behaves=drifted)
    gone = hooks.Hook("x.gone", "tensorflow", "x", "a feature", "an option", lambda: 1 / 0)
    reports = [checker.check(h) for h in (fine, changed, gone)]
    assert [(r["probe"] == "ok", r["behaviour"]) for r in reports][0] == (True, "ok")
    assert reports[1]["probe"] == "ok" and "the records from byte 35 read []" in reports[1]["behaviour"]
    assert "[hook x.changed]" in reports[1]["behaviour"] and "turn off an option" in reports[1]["behaviour"]
    assert "ZeroDivisionError" in reports[2]["probe"] and reports[2]["behaviour"] == "none"


def test_a_behaviour_check_shared_by_hooks_runs_once_a_process_and_keeps_its_failure():
    """The checks that start clusters of processes (eager.py's regroup, distribute.py's coordinator)
    serve two hooks each: the second hook gets the first's outcome, a failure (a timeout) too,
    rather than waiting for it a second time."""
    import pytest

    from raytf._internal.hooks._hook import once_a_process

    runs = []
    passing = once_a_process(lambda: runs.append("ok"))
    passing()
    passing()
    assert runs == ["ok"]

    def times_out():
        runs.append("timed out")
        raise TimeoutError("the cluster did not form in 240 s")

    failing = once_a_process(times_out)
    for _ in range(2):
        with pytest.raises(TimeoutError, match="240 s"):
            failing()
    assert runs == ["ok", "timed out"]


def test_a_check_script_that_hangs_is_stopped_with_its_stacks_and_tried_once_more(tmp_path):
    import pytest

    from raytf._internal.hooks._hook import run_check_script

    assert run_check_script("print('ok')").strip() == "ok"
    # A script that prints "ok" only on its second run (a stall of its own making, once).
    marker = tmp_path / "ran"
    flaky = f"import os, time\nif not os.path.exists({str(marker)!r}):\n    open({str(marker)!r}, 'w').close()\n    time.sleep(60)\nprint('ok')"
    assert run_check_script(flaky, timeout_s=2).strip() == "ok"
    with pytest.raises(AssertionError) as info:
        run_check_script("import time\ntime.sleep(60)", timeout_s=1)
    said = str(info.value)
    # Both runs stopped, each with where its thread waited (faulthandler's dump on SIGABRT).
    assert said.count("(stopped after 1 s)") == 2 and said.count("time.sleep") + said.count("line 2") >= 2, said


def test_what_the_hook_checker_runs_in_threads_imports_nothing():
    """``python -m raytf._internal.hooks`` runs the checks that start clusters of processes in
    threads while its main thread checks the other hooks. A first import in such a thread deadlocked
    against the main thread's load of TensorFlow 2.16, which imports distutils under Python's global
    import lock (run_check_script's docstring; the oldest versions' CI run showed both stacks). Each
    function those threads run has no import statement: what they need is imported beforehand."""
    import dis

    from raytf._internal.hooks._hook import run_check_script

    def imported(function):
        found, codes = [], [function.__code__]
        while codes:
            code = codes.pop()
            found += [i.argval for i in dis.get_instructions(code) if i.opname in ("IMPORT_NAME", "IMPORT_FROM")]
            codes += [c for c in code.co_consts if hasattr(c, "co_code")]
        return found

    threaded = {h.behaves for h in hooks.all_hooks() if h.in_processes}
    assert len(threaded) == 2  # eager.py's regroup, distribute.py's coordinator
    for shared in threaded:  # once_a_process's wrapper, and the check it wraps
        [check] = [cell.cell_contents for cell in shared.__closure__ if callable(cell.cell_contents)]
        assert "run_check_script" in check.__code__.co_names
        assert imported(shared) == [] and imported(check) == [], check.__qualname__
    assert imported(run_check_script) == []

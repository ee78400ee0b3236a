"""Each reach into TensorFlow's, Keras's and tf-keras's private code works with the installed
versions, and one that does not fails loudly, naming what, the versions and the option to turn off."""

import subprocess
import sys

import pytest

import raytf
from raytf._internal import hooks


@pytest.mark.parametrize("hook", hooks.all_hooks(), ids=lambda h: h.name)
def test_every_hook_works_with_the_installed_libraries(hook):
    hook.check()


def test_the_probes_do_not_start_tensorflow_before_the_strategy_configures_its_collectives():
    # MultiWorkerMirroredStrategy must configure collective ops before TensorFlow's eager context
    # initializes; a probe that ran an op at worker start would break every run.
    code = ("from raytf._internal import hooks\n"
            "[h.check() for h in hooks.all_hooks()]\n"
            "from tensorflow.python.eager import context\n"
            "assert not context.context()._initialized, 'a probe initialized the eager context'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
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
    assert hooks.needed(**base) == ["tensorflow.collective_new", "tensorflow.dataset_graph"]
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

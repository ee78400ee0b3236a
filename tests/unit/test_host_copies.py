"""An asynchronous report's host copy of the state (checkpoint/state.py), in a TensorFlow of its
own: one with two logical CPUs, so that a copy made while another device is the default shows
where it lands, and whose allocator has not yet held memory of the sizes the test copies."""

import json
import os
import subprocess
import sys

import pytest

from tests.hidden import hiding

pytestmark = pytest.mark.unit

SCRIPT = r"""
import json, os
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from raytf._internal.checkpoint import state

out = {}
keras = tf.keras  # Keras 3
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
model.fit(tf.ones([4, 64]), tf.ones([4, 1]), verbose=0)
with tf.device("/CPU:1"):  # the report's thread with another default device (a GPU worker's GPU)
    copy = state.host_copy({"model": model, "optimizer": model.optimizer})
copies = list(copy._copies.values())
out["devices"] = sorted({tf.DeviceSpec.from_string(c.device).device_index for c in copies})
out["distinct_copies"] = len({id(c) for c in copies})
out["variables"] = len(model.variables) + len(model.optimizer.variables)
out["nbytes"] = copy.nbytes
out["state_bytes"] = sum(v.numpy().nbytes for v in model.variables + list(model.optimizer.variables))
with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():  # Keras variables wrapping distributed ones
    mirrored = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32)])
    mirrored.compile(optimizer=keras.optimizers.Adam(), loss="mse")
mirrored.fit(tf.ones([4, 64]), tf.ones([4, 32]), verbose=0)
copies = state.host_copy({"model": mirrored, "optimizer": mirrored.optimizer})._copies.values()
out["mirrored_distinct_copies"] = len({id(c) for c in copies})
out["mirrored_variables"] = len(mirrored.variables) + len(mirrored.optimizer.variables)

MIB = 1 << 20
def table(mib):  # a sparse update puts it in copy-on-read mode: report copies it
    v = tf.Variable(tf.zeros([mib * MIB // 256, 64]))
    v.scatter_add(tf.IndexedSlices(tf.ones([1, 64]), tf.constant([0], tf.int64)))
    return v

warm = table(80)
out["off_by_default"] = state.prewarm({"table": warm}) is None
os.environ["RAYTF_PREWARM_HOST_COPIES"] = "1"
out["small_state_warmed"] = state.prewarm({"model": model}) is not None
work = state.prewarm({"table": warm})
work.result()  # TensorFlow's Fill wrote the memory: no error, nothing logged
out["warmed"] = work is not None
out["again"] = state.prewarm({"table": warm}) is not None
copy = state.host_copy({"table": warm})
out["copy_equal"] = bool(tf.reduce_all(tf.equal(list(copy._copies.values())[0], warm)).numpy())
print(json.dumps(out))
"""


@pytest.mark.parametrize("onednn", ["1", "0"])
def test_copies_are_on_this_processs_cpu_once_per_keras_variable_and_prewarm_is_opt_in(onednn, tmp_path):
    """Keras 3's own copy of its variable is a second variable on the default device (a GPU
    worker's GPU: the state twice, there); raytf copies the TensorFlow variable it wraps, on the
    CPU. ``prewarm`` is off unless asked for (what it gives depends on the machine's allocator, so
    no page count is asserted), and when asked, TensorFlow's own op fills the memory, once per set
    of sizes, with oneDNN on and off."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_USE_LEGACY_KERAS", "RAYTF_PREWARM_HOST_COPIES")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["TF_ENABLE_ONEDNN_OPTS"] = onednn
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=180,
                          env=hiding(tmp_path / "hidden", env))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == [0], out  # this process's CPU, not the default device of the caller
    assert out["distinct_copies"] == out["variables"], out  # one copy per variable, not two per Keras variable
    assert out["mirrored_distinct_copies"] == out["mirrored_variables"], out  # under a strategy too
    assert out["state_bytes"] <= out["nbytes"] <= out["state_bytes"] + 64, out  # counted once (shared memory's check)
    assert out["off_by_default"] and out["warmed"] and out["copy_equal"], out
    assert not out["small_state_warmed"] and not out["again"], out  # under PREWARM_MIN_BYTES; sizes warmed before


REUSE = r"""
import json, resource
import tensorflow as tf
from raytf._internal.checkpoint import state

v = tf.Variable(tf.zeros([(96 << 20) // 256, 64]))  # 96 MiB, in copy-on-read mode after a sparse update
faults = []
for step in range(3):
    v.scatter_add(tf.IndexedSlices(tf.ones([1, 64]), tf.constant([step], tf.int64)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    copy = state.host_copy({"table": v})
    faults.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 4096 / (96 << 20))
    copy.release()
    del copy
print(json.dumps(faults))
"""


def test_a_workers_host_allocator_keeps_the_memory_of_one_checkpoints_copy_for_the_next(tmp_path):
    """Workers run TensorFlow with the BFC host allocator (worker/tensorflow.py: host_allocator),
    whatever oneDNN does: the copy of a large table an asynchronous report makes reuses the memory
    of the copy before, instead of mapping every page anew at every checkpoint (TensorFlow's own
    allocator with oneDNN off returns such blocks to the system). The user's worker_env wins."""
    from raytf._internal.protocol import RunSpec, TensorflowSettings
    from raytf._internal.worker.tensorflow import host_allocator, run_environment

    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_CPU_")}
    env.update(host_allocator(), TF_CPP_MIN_LOG_LEVEL="3", TF_ENABLE_ONEDNN_OPTS="0")
    done = subprocess.run([sys.executable, "-c", REUSE], capture_output=True, text=True, timeout=180,
                          env=hiding(tmp_path / "hidden", env))
    assert done.returncode == 0, done.stderr[-3000:]
    faults = json.loads(done.stdout.strip().splitlines()[-1])
    assert max(faults[1:]) < 0.05, faults  # the second and third copies mapped no new memory

    def settings(**worker_env):
        return RunSpec(run_name="r", run_path="/r", payload=b"", tensorflow=TensorflowSettings(
            communication="auto", collective_timeout_s=None, intra_op_threads=1, inter_op_threads=1, use_gpu=False,
            env=worker_env))
    assert run_environment(settings())["TF_CPU_ALLOCATOR_USE_BFC"] == "true"
    assert int(run_environment(settings())["TF_CPU_BFC_MEM_LIMIT_IN_MB"]) > 1024  # the node's memory, not 64 GiB
    assert run_environment(settings(TF_CPU_ALLOCATOR_USE_BFC="false"))["TF_CPU_ALLOCATOR_USE_BFC"] == "false"


def test_a_keras_variable_without_its_tensorflow_variable_is_copied_by_keras_and_the_run_told_once(caplog):
    """The optional hook keras.variable_value gone (a Keras that keeps its value elsewhere): the
    host copy falls back to Keras's own, and the run is warned once of the second copy it costs."""
    import logging

    import keras

    from raytf._internal.hooks import _hook
    from raytf._internal.hooks.tensorflow import checkpoint as checkpoint_hooks

    variables = [keras.Variable([1.0]), keras.Variable([2.0])]
    assert checkpoint_hooks._keras_wrapped_variable(variables[0]) is vars(variables[0])["_value"]
    for variable in variables:
        vars(variable)["_value"] = None
    _hook._warned.discard("keras.variable_value")
    with caplog.at_level(logging.WARNING):
        assert [checkpoint_hooks._keras_wrapped_variable(v) for v in variables] == [None, None]
    told = [r.getMessage() for r in caplog.records if "[hook keras.variable_value]" in r.getMessage()]
    assert len(told) == 1 and "a second copy of the state" in told[0], told

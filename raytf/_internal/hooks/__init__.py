"""Every place raytf reaches into TensorFlow's, Keras's or tf-keras's private code, one module per
library, each hook with a probe.

A private attribute can move in any release. Where raytf's features stand on one, a worker checks
it when it starts (``require``), or when the feature is asked for, and a missing one fails the run
with a :class:`~raytf.errors.HookError` that names what is missing, the versions installed, the
versions raytf is tested with, and the option that turns the feature off; never a feature that
quietly stops working after an upgrade.

The hooks, by library: ``tensorflow.py`` (strategy construction, the parameter-server
coordinator's cluster, the eager context's device list, tf.data's dataset graph, host copies of
saved state), ``keras.py`` (Keras 3's optimizer all-reduce, its ``Model.fit``), ``tf_keras.py``
(tf-keras's optimizer aggregation, its callbacks' batch hooks, the epoch length its fit learns).
"""

from __future__ import annotations

from raytf._internal.hooks import keras, tensorflow, tf_keras
from raytf._internal.hooks._hook import TESTED, Hook, version  # noqa: F401 - the package's names


def all_hooks() -> list[Hook]:
    return [*tensorflow.HOOKS, *keras.HOOKS, *tf_keras.HOOKS]


def needed(*, keras3: bool, tf_keras: bool, compression: bool, gpu: bool, parameter_server: bool) -> list[str]:
    """The hooks a worker of a run with these settings stands on."""
    names = ["tensorflow.collective_new", "tensorflow.dataset_graph"]
    if keras3:
        names.append("keras.model_fit")
    if compression:
        names += ["keras.optimizer_all_reduce"] if keras3 else []
        names += ["tf_keras.optimizer_aggregate"] if tf_keras else []
    if gpu:
        names.append("tensorflow.physical_devices")
    if parameter_server:
        names += ["tensorflow.parameter_server_new", "tensorflow.coordinator_server_def",
                  "tensorflow.function_autograph", "tensorflow.resource_writes"]
        names += ["tf_keras.callback_batch_hooks"] if tf_keras else []
    return names


def require(*names: str) -> None:
    """Check the hooks named; the first that cannot work raises HookError."""
    found = {hook.name: hook for hook in all_hooks()}
    for name in names:
        found[name].check()

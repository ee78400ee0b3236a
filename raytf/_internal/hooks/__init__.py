"""Every place raytf reaches into TensorFlow's, Keras's, tf-keras's or Ray's private code, one
module per library, each hook with a probe; and every process-wide change raytf makes to a
library's code in a worker (``PATCHES``).

A private attribute can move in any release. Where raytf's features stand on one, a worker checks
it when it starts (``require``), or when the feature is asked for, and a missing one fails the run
with a :class:`~raytf.errors.HookError` that names the hook, what is missing, the versions
installed, the versions raytf is tested with, and the option that turns the feature off; never a
feature that quietly stops working after an upgrade. An optional hook (a signal Ray has no public
API for, a faster read) warns once, naming what the run goes without.

Each hook has two checks: ``probe``, cheap and running no TensorFlow op (a worker runs it before its
strategy configures TensorFlow's collectives), and ``behaves``, which uses the hook for real and
runs in a process of its own: ``python -m raytf._internal.hooks`` checks every hook against the
installed libraries and prints what broke (``nox -s next`` runs it on pre-releases). No module of
raytf outside this package reaches a private name of these libraries (tests/unit/test_layout.py).

The hooks, by library: ``tensorflow.py`` (strategy construction, the parameter-server
coordinator's cluster, the eager context's device list, tf.data's dataset graph and options,
TFRecord reads at an offset, host copies of saved state, graph ops of a parameter-server step),
``keras.py`` (Keras 3's optimizer all-reduce, its ``Model.fit``), ``tf_keras.py`` (tf-keras's
optimizer aggregation, its callbacks' batch hooks, the epoch length its fit learns), ``ray.py``
(node drains, the autoscaler's status and node types, the log prefix, Ray Train's DataConfig).
"""

from __future__ import annotations

from raytf._internal.hooks import keras, ray, tensorflow, tf_keras
from raytf._internal.hooks._hook import TESTED, Hook, Patch, version  # noqa: F401 - the package's names


def all_hooks() -> list[Hook]:
    return [*tensorflow.HOOKS, *keras.HOOKS, *tf_keras.HOOKS, *ray.HOOKS]


def named(name: str) -> Hook:
    for hook in all_hooks():
        if hook.name == name:
            return hook
    raise KeyError(name)


# Every change raytf makes to a library's code that every user of it in the process sees. Each is
# made once, in a raytf worker (never in the driver), and keeps the library's own behaviour for
# whatever raytf does not run.
PATCHES = [
    Patch(
        "strategy_new",
        "CollectiveAllReduceStrategy.__new__ (tf.distribute.MultiWorkerMirroredStrategy)",
        "every MultiWorkerMirroredStrategy worker, at start",
        "constructing the strategy inside train_fn returns raytf's strategy, already connected to its peers",
    ),
    Patch(
        "ps_strategy_new",
        "ParameterServerStrategyV2.__new__ (tf.distribute.experimental.ParameterServerStrategy)",
        "a ParameterServerTrainer's chief, at start",
        "constructing the strategy inside train_fn returns raytf's, connected to the run's tasks",
    ),
    Patch(
        "keras_fit",
        "keras.Model.fit and keras.Model.evaluate (Keras 3)",
        "a MultiWorkerMirroredStrategy worker that uses Keras 3",
        "a model under raytf's strategy trains and evaluates with raytf.keras.fit/evaluate (metrics summed over "
        "workers, exactly-once data); any other model keeps Keras's own",
    ),
    Patch(
        "keras_all_reduce",
        "TFOptimizer._all_reduce_sum_gradients (Keras 3)",
        "TensorflowConfig.gradient_compression or raytf.keras.local_sgd is used",
        "gradients are summed through raytf's all-reduce (compressed, or left local between averages); "
        "outside a raytf strategy Keras's own runs",
    ),
    Patch(
        "tf_keras_aggregate",
        "Optimizer.aggregate_gradients and OptimizerV2._aggregate_gradients (tf-keras)",
        "TensorflowConfig.gradient_compression or raytf.keras.local_sgd is used",
        "as above, for tf-keras; a user's own gradient_aggregator and DTensor optimizers keep theirs",
    ),
    Patch(
        "counted_iterators",
        "the class of a distributed dataset raytf's shard feeds (a subclass of TensorFlow's)",
        "a custom loop iterates a raytf shard through strategy.distribute_datasets_from_function",
        "each batch taken is counted, for exactly-once data; the dataset is otherwise TensorFlow's",
    ),
]


def needed(*, keras3: bool, tf_keras: bool, compression: bool, gpu: bool, parameter_server: bool) -> list[str]:
    """The hooks a worker of a run with these settings stands on."""
    names = ["tensorflow.collective_new", "tensorflow.dataset_graph", "tensorflow.dataset_options"]
    if keras3:
        names.append("keras.model_fit")
    if compression:
        names += ["keras.optimizer_all_reduce"] if keras3 else []
        names += ["tf_keras.optimizer_aggregate"] if tf_keras else []
    if gpu:
        names.append("tensorflow.physical_devices")
    if parameter_server:
        names += [
            "tensorflow.parameter_server_new",
            "tensorflow.coordinator_server_def",
            "tensorflow.function_autograph",
            "tensorflow.resource_writes",
            "tensorflow.graph_ops",
            "tensorflow.distributed_original",
        ]
        names += ["tf_keras.callback_batch_hooks"] if tf_keras else []
    return names


def require(*names: str) -> None:
    """Check the hooks named; the first that cannot work raises HookError."""
    for name in names:
        named(name).check()

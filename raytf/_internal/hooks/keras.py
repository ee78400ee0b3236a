"""raytf's reaches into Keras 3's private code (see the package docstring)."""

from __future__ import annotations

import importlib.util
from typing import Any

from raytf._internal.hooks._hook import Hook


def installed() -> bool:
    return importlib.util.find_spec("keras") is not None


def tf_optimizer_class() -> Any:  # Keras 3's TFOptimizer, patched below
    """Keras 3's TensorFlow optimizer, whose ``_all_reduce_sum_gradients`` raytf routes through its
    own all-reduce (gradient compression, local SGD's unaggregated steps: worker/compression.py)."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    if not callable(getattr(TFOptimizer, "_all_reduce_sum_gradients", None)):
        raise AttributeError("TFOptimizer has no _all_reduce_sum_gradients")
    return TFOptimizer


def route_all_reduce(route: Any) -> None:
    """Make Keras 3's TensorFlow optimizers sum gradients over replicas with
    ``route(optimizer, grads_and_vars, original)`` (``original`` is Keras's own; idempotent)."""
    optimizer_class = tf_optimizer_class()
    if getattr(optimizer_class._all_reduce_sum_gradients, "_raytf", False):  # noqa: SLF001
        return
    original = optimizer_class._all_reduce_sum_gradients  # noqa: SLF001

    def _all_reduce_sum_gradients(self: Any, grads_and_vars: Any) -> Any:
        return route(self, grads_and_vars, original)

    _all_reduce_sum_gradients._raytf = True  # type: ignore[attr-defined]
    optimizer_class._all_reduce_sum_gradients = _all_reduce_sum_gradients  # noqa: SLF001


def _behaves_all_reduce() -> None:
    import keras
    import tensorflow as tf

    routed = []

    def route(optimizer: Any, grads_and_vars: Any, original: Any) -> Any:
        pairs = list(grads_and_vars)
        routed.append(len(pairs))
        return original(optimizer, pairs)

    route_all_reduce(route)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        variable, optimizer = keras.Variable(1.0), keras.optimizers.SGD(0.5)
    tf.function(lambda: strategy.run(lambda: optimizer.apply_gradients([(tf.constant(1.0), variable)])))()
    assert routed == [1] and float(variable.numpy()) == 0.5, (routed, float(variable.numpy()))


def _probe_fit() -> None:
    import inspect

    import keras
    from keras.src.metrics.metric import Metric

    for method in ("fit", "evaluate"):
        assert callable(getattr(keras.Model, method, None)), f"keras.Model.{method}"
    # raytf's fit reads each metric once an epoch, outside strategy.run, where a variable synchronized
    # on read sums every worker's state. Keras makes metric variables so from 3.10; before, every
    # worker would log its own data's metrics, and callbacks on them would disagree.
    assert '"on_read"' in inspect.getsource(Metric.add_variable), (
        "keras.src.metrics.metric.Metric.add_variable does not synchronize metric variables on read"
    )


def variable_value(variable: Any) -> Any:
    """The TensorFlow variable a Keras 3 variable keeps its value in."""
    return variable._value  # noqa: SLF001


def _probe_variable_value() -> None:
    from keras.src.backend.tensorflow import core

    assert "_value" in core.Variable._initialize.__code__.co_names, "keras Variable._initialize sets _value"  # noqa: SLF001


def _behaves_variable_value() -> None:
    import keras
    import tensorflow as tf

    variable = keras.Variable([1.0, 2.0])
    assert isinstance(variable_value(variable), tf.Variable), type(variable_value(variable))
    assert variable_value(variable).numpy().tolist() == [1.0, 2.0]


HOOKS = [
    Hook(
        "keras.optimizer_all_reduce",
        "keras",
        "keras.src.backend.tensorflow.optimizer.TFOptimizer._all_reduce_sum_gradients",
        "gradient compression and raytf.keras.local_sgd under Keras 3",
        "TensorflowConfig.gradient_compression and raytf.keras.local_sgd",
        tf_optimizer_class,
        behaves=_behaves_all_reduce,
    ),
    Hook(
        "keras.model_fit",
        "keras",
        "keras.Model.fit and keras.Model.evaluate (replaced in the worker), and "
        "metric variables synchronized on read (Metric.add_variable)",
        "Keras 3's model.fit under MultiWorkerMirroredStrategy",
        "TensorflowConfig(keras='tf_keras')",
        _probe_fit,
    ),
    Hook(
        "keras.variable_value",
        "keras",
        "keras.Variable._value (the TensorFlow variable it keeps)",
        "one host copy of a Keras 3 variable for an asynchronous checkpoint (its TensorFlow variable's)",
        "without it Keras's own copy is taken, a second copy of the state made on the default device "
        "(a GPU worker's GPU)",
        _probe_variable_value,
        behaves=_behaves_variable_value,
        optional=True,
    ),
]

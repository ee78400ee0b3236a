"""raytf's reaches into Keras 3's private code (see the package docstring)."""

from __future__ import annotations

import importlib.util

from raytf._internal.hooks._hook import Hook


def installed() -> bool:
    return importlib.util.find_spec("keras") is not None


def tf_optimizer_class() -> type:
    """Keras 3's TensorFlow optimizer, whose ``_all_reduce_sum_gradients`` raytf routes through its
    own all-reduce (gradient compression, local SGD's unaggregated steps: worker/compression.py)."""
    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    if not callable(getattr(TFOptimizer, "_all_reduce_sum_gradients", None)):
        raise AttributeError("TFOptimizer has no _all_reduce_sum_gradients")
    return TFOptimizer


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
        "keras.src.metrics.metric.Metric.add_variable does not synchronize metric variables on read")


HOOKS = [
    Hook("keras.optimizer_all_reduce", "keras", "keras.src.backend.tensorflow.optimizer.TFOptimizer"
         "._all_reduce_sum_gradients", "gradient compression and raytf.keras.local_sgd under Keras 3",
         "TensorflowConfig.gradient_compression and raytf.keras.local_sgd", tf_optimizer_class),
    Hook("keras.model_fit", "keras", "keras.Model.fit and keras.Model.evaluate (replaced in the worker), and "
         "metric variables synchronized on read (Metric.add_variable)",
         "Keras 3's model.fit under MultiWorkerMirroredStrategy", "TensorflowConfig(keras='tf_keras')", _probe_fit),
]

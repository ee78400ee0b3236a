"""raytf's reaches into tf-keras's private code (see the package docstring)."""

from __future__ import annotations

import importlib.util
import types
from typing import Any, Optional

from raytf._internal.hooks._hook import Hook


def installed() -> bool:
    return importlib.util.find_spec("tf_keras") is not None


def optimizer_modules() -> tuple[Any, Any, Any]:
    """(optimizer, legacy optimizer_v2, optimizer utils) of tf-keras: raytf routes their gradient
    aggregation (``Optimizer.aggregate_gradients``, ``OptimizerV2._aggregate_gradients``) through
    its own all-reduce, and keeps a user's own ``gradient_aggregator`` (worker/compression.py)."""
    from tf_keras.src.optimizers import optimizer as v2
    from tf_keras.src.optimizers import utils
    from tf_keras.src.optimizers.legacy import optimizer_v2 as legacy

    for owner, name in (
        (v2.Optimizer, "aggregate_gradients"),
        (legacy.OptimizerV2, "_aggregate_gradients"),
        (utils, "all_reduce_sum_gradients"),
    ):
        if not callable(getattr(owner, name, None)):
            raise AttributeError(f"{getattr(owner, '__name__', owner)} has no {name}")
    return v2, legacy, utils


def route_aggregation(route: Any, route_legacy: Any) -> None:
    """Make tf-keras's optimizers aggregate gradients over replicas with ``route(optimizer,
    grads_and_vars, original)``, its legacy ones with ``route_legacy`` (``original`` is
    tf-keras's own; idempotent)."""
    v2, legacy, _ = optimizer_modules()
    if not getattr(v2.Optimizer.aggregate_gradients, "_raytf", False):
        original = v2.Optimizer.aggregate_gradients

        def aggregate_gradients(self: Any, grads_and_vars: Any) -> Any:
            return route(self, grads_and_vars, original)

        aggregate_gradients._raytf = True  # type: ignore[attr-defined]
        v2.Optimizer.aggregate_gradients = aggregate_gradients
    if not getattr(legacy.OptimizerV2._aggregate_gradients, "_raytf", False):  # noqa: SLF001
        original_legacy = legacy.OptimizerV2._aggregate_gradients  # noqa: SLF001

        def _aggregate_gradients(self: Any, grads_and_vars: Any) -> Any:
            return route_legacy(self, grads_and_vars, original_legacy)

        _aggregate_gradients._raytf = True  # type: ignore[attr-defined]
        legacy.OptimizerV2._aggregate_gradients = _aggregate_gradients  # noqa: SLF001


def uses_dtensor(optimizer: Any) -> bool:
    """Whether a tf-keras optimizer runs on DTensor (a mesh), which aggregates its own way."""
    return bool(optimizer._mesh or optimizer._run_with_dtensor)  # noqa: SLF001


def default_aggregator() -> Any:
    """tf-keras's own ``gradient_aggregator`` of legacy optimizers (one a user did not replace)."""
    return optimizer_modules()[2].all_reduce_sum_gradients


def is_compiled(model: Any) -> bool:
    """Whether a tf-keras model was compiled (Keras 3's ``model.compiled`` is public)."""
    return bool(getattr(model, "_is_compiled", False))


def forget_epoch_length() -> bool:
    """Make the tf-keras ``Model.fit`` running in this thread count the steps of its next epoch
    again, as it did its first, instead of taking the first epoch's as every epoch's (its
    ``DataHandler``, the ``data_handler`` local of ``fit``, learns ``_inferred_steps`` from an
    epoch of a dataset of unknown length). A fit resumed in mid-epoch trains the rest of that epoch
    first: shorter than the epochs after it. False where no fit's handler is found."""
    import sys

    from tf_keras.src.engine import data_adapter

    frame: Optional[types.FrameType] = sys._getframe(1)  # noqa: SLF001
    while frame is not None:
        handler = frame.f_locals.get("data_handler")
        if isinstance(handler, data_adapter.DataHandler):
            handler._inferred_steps = None  # noqa: SLF001
            return True
        frame = frame.f_back
    return False


def _probe_data_handler() -> None:
    import inspect

    from tf_keras.src.engine import data_adapter, training

    assert "data_handler" in inspect.unwrap(training.Model.fit).__code__.co_varnames, "Model.fit's data_handler"
    assert "_inferred_steps" in inspect.unwrap(data_adapter.DataHandler.catch_stop_iteration).__code__.co_names, (
        "DataHandler._inferred_steps"
    )


def multi_step_train_function(python_function: Any) -> Any:
    """``(step_function, model)`` when ``python_function`` is the body of the train function
    tf-keras's ``Model.make_train_function`` makes for a cluster coordinator with
    ``steps_per_execution`` above 1 (``train_function(iterator, steps_per_execution)``, a
    ``tf.range`` loop over ``step_function(self, iterator)``), else None. raytf's
    parameter-server step runs that loop itself, committing each step's batch in it
    (data/ps_positions.py)."""
    code = getattr(python_function, "__code__", None)
    if code is None or code.co_name != "train_function" or code.co_argcount != 2:
        return None
    if not getattr(python_function, "__module__", "").startswith("tf_keras."):
        return None
    cells = dict(zip(code.co_freevars, python_function.__closure__ or ()))
    if "step_function" not in cells or "self" not in cells:
        return None
    return cells["step_function"].cell_contents, cells["self"].cell_contents


def _probe_multi_step() -> None:
    from tf_keras.src.engine import training

    names = training.Model.make_train_function.__code__.co_consts
    bodies = [c for c in names if getattr(c, "co_name", None) == "train_function" and c.co_argcount == 2]
    assert bodies and {"step_function", "self"} <= set(bodies[0].co_freevars), (
        "Model.make_train_function's train_function(iterator, steps_per_execution)"
    )


def _probe_optimizer_dtensor() -> None:
    from tf_keras.src.optimizers import optimizer as v2

    names = v2._BaseOptimizer.__init__.__code__.co_names + v2.Optimizer.__init__.__code__.co_names  # noqa: SLF001
    for name in ("_mesh", "_run_with_dtensor"):
        assert name in names, f"tf_keras Optimizer.{name}"


def _behaves_optimizer_aggregate() -> None:
    import tf_keras

    assert not uses_dtensor(tf_keras.optimizers.SGD()), "a plain SGD reads as DTensor's"
    assert tf_keras.optimizers.legacy.SGD().gradient_aggregator is default_aggregator(), (
        "a legacy SGD's gradient_aggregator is not tf-keras's own"
    )


def _probe_compiled() -> None:
    import inspect

    from tf_keras.src.engine import training

    assert "_is_compiled" in inspect.unwrap(training.Model.compile).__code__.co_names, "Model.compile sets _is_compiled"


def _behaves_compiled() -> None:
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(2,))])
    assert not is_compiled(model), "an uncompiled model reads as compiled"
    model.compile(optimizer="sgd", loss="mse")
    assert is_compiled(model), "a compiled model reads as not compiled"


def _probe_batch_hooks() -> None:
    import tf_keras

    assert callable(getattr(tf_keras.callbacks.Callback, "_implements_train_batch_hooks", None))


def _behaves_batch_hooks() -> None:
    import tf_keras

    class PerBatch(tf_keras.callbacks.Callback):
        def on_train_batch_end(self, batch: Any, logs: Any = None) -> None:
            pass

    assert PerBatch()._implements_train_batch_hooks(), "a callback with on_train_batch_end reads as without"  # noqa: SLF001
    assert not tf_keras.callbacks.Callback()._implements_train_batch_hooks(), "the base callback reads as per-batch"  # noqa: SLF001


def _probe_optimizer_aggregate() -> None:
    optimizer_modules()
    _probe_optimizer_dtensor()


HOOKS = [
    Hook(
        "tf_keras.optimizer_aggregate",
        "tf_keras",
        "tf_keras.src.optimizers: Optimizer.aggregate_gradients, OptimizerV2._aggregate_gradients",
        "gradient compression and raytf.keras.local_sgd under tf-keras",
        "TensorflowConfig.gradient_compression and raytf.keras.local_sgd",
        _probe_optimizer_aggregate,
        behaves=_behaves_optimizer_aggregate,
    ),
    Hook(
        "tf_keras.compiled",
        "tf_keras",
        "tf_keras Model._is_compiled",
        "raytf.keras.fit's check that a tf-keras model was compiled first",
        "nothing: use Keras 3, whose model.compiled is public",
        _probe_compiled,
        behaves=_behaves_compiled,
    ),
    Hook(
        "tf_keras.fit_data_handler",
        "tf_keras",
        "Model.fit's data_handler local, DataHandler._inferred_steps",
        "an exact mid-epoch resume of tf-keras's own model.fit (its first epoch the rest of the interrupted one)",
        "DataConfig(exactly_once=False)",
        _probe_data_handler,
    ),
    Hook(
        "tf_keras.multi_step_train_function",
        "tf_keras",
        "Model.make_train_function's train_function(iterator, steps_per_execution) and its step_function",
        "every row once per pass under parameter servers with steps_per_execution above 1 (a batch counted "
        "as its step is made)",
        "nothing: without it raytf counts a whole execution at once, and a worker lost in the middle of one "
        "trains its finished batches again",
        _probe_multi_step,
    ),
    Hook(
        "tf_keras.callback_batch_hooks",
        "tf_keras",
        "tf_keras.callbacks.Callback._implements_train_batch_hooks",
        "raytf.keras.ReportCallback under a ParameterServerTrainer (epoch-end preemption checks)",
        "ParameterServerTrainer with tf-keras (use raytf.Trainer, or Keras 3)",
        _probe_batch_hooks,
        behaves=_behaves_batch_hooks,
    ),
]

"""TensorFlow's graph internals raytf stands on in a parameter-server step: which resources an op
writes, whether a function converts with AutoGraph, and moving or ordering ops after they are made.

See the package docstring of ``raytf._internal.hooks``.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.hooks._hook import Hook


def function_autograph(fn: Any) -> bool:
    """Whether the ``tf.function`` ``fn`` converts its code with AutoGraph, which raytf's counted
    parameter-server step does for it (data/ps_positions.py)."""
    return bool(fn._autograph)  # noqa: SLF001


def resource_writes(op: Any) -> list:
    """The resources graph op ``op`` may write, as TensorFlow's automatic control dependencies see
    them (a loop, a conditional or a function call writes what its functions write), which
    raytf's parameter-server step holds until the step's inputs arrived (data/ps_positions.py)."""
    from tensorflow.python.framework import auto_control_deps_utils

    return list(auto_control_deps_utils.get_read_write_resource_inputs(op)[1])


def place_beside(op: Any, update: Any) -> None:
    """Run graph op ``op`` where ``update`` runs (on its parameter server), not on the device the
    step's scope gave it: its device cleared and its colocation set to ``update``'s."""
    from tensorflow.core.framework import attr_value_pb2

    op._set_device("")  # noqa: SLF001
    op._set_attr(
        "_class",
        attr_value_pb2.AttrValue(  # noqa: SLF001
            list=attr_value_pb2.AttrValue.ListValue(s=update.colocation_groups())
        ),
    )


def run_after(op: Any, first: Any) -> None:
    """Make graph op ``op``, already made, wait for op ``first``."""
    op._add_control_input(first)  # noqa: SLF001


def _probe_ops() -> None:
    from tensorflow.python.framework import ops

    for method in ("_set_device", "_set_attr", "_add_control_input", "colocation_groups"):
        assert callable(getattr(ops.Operation, method, None)), f"Operation.{method}"


def _behaves_ops() -> None:
    import tensorflow as tf

    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            variable = tf.Variable(1.0)
        with tf.device("/job:worker/task:0"):
            value = tf.raw_ops.Mul(x=tf.constant(2.0), y=tf.constant(3.0))
            update = variable.assign_add(value).op
            first = tf.raw_ops.NoOp()
        place_beside(value.op, update)
        run_after(update, first)
        assert value.op.device == "" and value.op.colocation_groups() == update.colocation_groups(), (
            value.op.device,
            value.op.colocation_groups(),
        )
        assert first in update.control_inputs, "the control input was not added"


def _probe_resource_writes() -> None:
    from tensorflow.python.framework import auto_control_deps_utils

    assert callable(getattr(auto_control_deps_utils, "get_read_write_resource_inputs", None)), (
        "auto_control_deps_utils.get_read_write_resource_inputs"
    )


def _probe_function_autograph() -> None:
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    assert "_autograph" in polymorphic_function.Function.__init__.__code__.co_names, "Function._autograph"
    assert isinstance(getattr(polymorphic_function.Function, "python_function", None), property), (
        "Function.python_function"
    )


def _behaves_function_autograph() -> None:
    import tensorflow as tf

    assert function_autograph(tf.function(lambda: 1)), "a tf.function's _autograph reads False"
    assert not function_autograph(tf.function(lambda: 1, autograph=False)), "autograph=False reads True"


def _behaves_resource_writes() -> None:
    import tensorflow as tf

    with tf.Graph().as_default():
        variable = tf.Variable(1.0)
        update = variable.assign_add(1.0).op
        read = tf.identity(variable.read_value()).op
        assert [t.ref() for t in resource_writes(update)] == [variable.handle.ref()], resource_writes(update)
        assert resource_writes(read) == []


HOOKS = [
    Hook(
        "tensorflow.function_autograph",
        "tensorflow",
        "tf.function's Function._autograph",
        "exactly-once data for parameter servers (raytf counts the batches each step takes)",
        "nothing: this one is required by ParameterServerTrainer's data",
        _probe_function_autograph,
        behaves=_behaves_function_autograph,
    ),
    Hook(
        "tensorflow.resource_writes",
        "tensorflow",
        "auto_control_deps_utils.get_read_write_resource_inputs",
        "exactly-once data for parameter servers (a step's updates are held until all of its inputs arrived)",
        "nothing: this one is required by ParameterServerTrainer's data",
        _probe_resource_writes,
        behaves=_behaves_resource_writes,
    ),
    Hook(
        "tensorflow.graph_ops",
        "tensorflow",
        "Operation._set_device, ._set_attr('_class'), ._add_control_input",
        "exactly-once data for parameter servers (a step's updates held until all of their inputs arrived, "
        "and the ops that feed them run beside them)",
        "DataConfig(exactly_once=False)",
        _probe_ops,
        behaves=_behaves_ops,
    ),
]

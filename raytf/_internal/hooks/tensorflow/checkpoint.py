"""TensorFlow's asynchronous checkpoint internals raytf stands on: host copies of saved state,
written from those copies.

See the package docstring of ``raytf._internal.hooks``.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.hooks._hook import Hook


def saveables(checkpoint: Any) -> list:
    """Every object whose state ``checkpoint`` (a ``tf.train.Checkpoint``) saves, found as
    TensorFlow's own asynchronous checkpoint finds them (its helper's ``_get_all_trackables``,
    and the optimizers' slot variables, which are not their descendants: asked for, as the
    helper does)."""
    from tensorflow.python.checkpoint import async_checkpoint_helper as helper
    from tensorflow.python.util import object_identity

    saveable, every = helper._get_all_trackables(  # noqa: SLF001
        root=checkpoint, exclude_set=object_identity.ObjectIdentitySet([checkpoint])
    )
    for owner in every:
        if "get_slot_names" not in dir(owner):
            continue
        for slot_name in owner.get_slot_names():
            for variable in every:
                try:
                    slot = owner.get_slot(variable, slot_name)
                except (AttributeError, KeyError, TypeError, ValueError):
                    continue
                if slot is not None:
                    saveable.append(slot)
    return saveable


def host_copies(checkpoint: Any, device: str) -> Any:
    """A host copy of the state of every object ``checkpoint`` (a ``tf.train.Checkpoint``) saves
    (:func:`saveables`), copied as TensorFlow's own asynchronous checkpoint does
    (``_copy_trackable_to_cpu``), under ``device`` (this process's CPU): {object: its copy}. A
    host variable's copy shares its buffer until training next writes it (TensorFlow's copy on
    write), or is copied at once where sparse updates put the variable in copy-on-read mode.
    Raises NotImplementedError, naming the object, where one cannot copy itself.

    A Keras 3 variable's copy is its TensorFlow variable's (the one it wraps, whose tensors it
    saves): Keras's own ``_copy_trackable_to_cpu`` makes a second variable from that copy, a
    second copy of the state, and on the default device, a GPU worker's GPU."""
    import tensorflow as tf
    from tensorflow.python.util import object_identity

    copies = object_identity.ObjectIdentityDictionary()
    with tf.device(device):
        for obj in saveables(checkpoint):
            if obj in copies:
                continue
            wrapped = _keras_wrapped_variable(obj)
            try:
                if wrapped is not None:
                    wrapped._copy_trackable_to_cpu(object_map=copies)  # noqa: SLF001
                    copies[obj] = copies[wrapped]
                else:
                    obj._copy_trackable_to_cpu(object_map=copies)  # noqa: SLF001
            except NotImplementedError as error:
                raise NotImplementedError(f"{type(obj).__name__} cannot copy its state to the host: {error}") from None
    return copies


def _keras_wrapped_variable(obj: Any) -> Any:
    """The TensorFlow variable a Keras 3 variable wraps (under a strategy, its distributed
    variable), or None: anything else, or a Keras whose variable no longer keeps one in
    ``_value`` (then Keras's own copy is used, and the run is warned once what that costs)."""
    import tensorflow as tf

    if not type(obj).__module__.startswith("keras."):
        return None
    value = vars(obj).get("_value")
    if isinstance(value, tf.Variable):
        return value
    import keras

    if isinstance(obj, keras.Variable):
        from raytf._internal.hooks._hook import warn_once
        from raytf._internal.hooks.keras import HOOKS as KERAS_HOOKS

        hook = next(h for h in KERAS_HOOKS if h.name == "keras.variable_value")
        warn_once(hook, hook.error(AttributeError(f"{type(obj).__name__}._value is {type(value).__name__}")))
    return None


def write_copies(checkpoint: Any, copies: Any, prefix: str, options: Any) -> None:
    """Write ``checkpoint`` (a ``tf.train.Checkpoint``) with every object in ``copies`` saved from
    its host copy (the saver's ``_object_map``, which TensorFlow's asynchronous checkpoint sets)."""
    checkpoint._saver._object_map = copies  # noqa: SLF001
    checkpoint.write(prefix, options=options)


def _probe_host_copies() -> None:
    import tensorflow as tf
    from tensorflow.python.checkpoint import async_checkpoint_helper as helper
    from tensorflow.python.checkpoint import checkpoint as checkpoint_module
    from tensorflow.python.ops import resource_variable_ops

    assert callable(getattr(helper, "_get_all_trackables", None)), "async_checkpoint_helper._get_all_trackables"
    assert "_copy_trackable_to_cpu" in vars(resource_variable_ops.BaseResourceVariable), (
        "BaseResourceVariable._copy_trackable_to_cpu"
    )
    assert "_object_map" in checkpoint_module.TrackableSaver.__init__.__code__.co_names, "TrackableSaver._object_map"
    assert "_saver" in tf.train.Checkpoint.__init__.__code__.co_names, "tf.train.Checkpoint._saver"


def _behaves_host_copies() -> None:
    import os
    import tempfile

    import tensorflow as tf

    variable = tf.Variable([1.0, 2.0])
    checkpoint = tf.train.Checkpoint(v=variable)
    copies = host_copies(checkpoint, "/cpu:0")
    variable.assign([3.0, 4.0])  # after the copy: the copy keeps what it copied
    with tempfile.TemporaryDirectory() as directory:
        write_copies(checkpoint, copies, os.path.join(directory, "c"), tf.train.CheckpointOptions())
        restored = tf.Variable([0.0, 0.0])
        tf.train.Checkpoint(v=restored).read(os.path.join(directory, "c")).expect_partial()
    assert restored.numpy().tolist() == [1.0, 2.0], restored.numpy()


HOOKS = [
    Hook(
        "tensorflow.host_copies",
        "tensorflow",
        "Trackable._copy_trackable_to_cpu, TrackableSaver._object_map (TensorFlow's asynchronous checkpoint)",
        "asynchronous checkpoints of Checkpoint.from_state (report returns once the state is copied in host memory)",
        'CheckpointConfig(upload="sync")',
        _probe_host_copies,
        behaves=_behaves_host_copies,
    )
]

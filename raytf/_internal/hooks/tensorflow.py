"""raytf's reaches into TensorFlow's private code (see the package docstring)."""

from __future__ import annotations

from typing import Any

from raytf._internal.hooks._hook import Hook


def collective_strategy_class() -> type:
    """MultiWorkerMirroredStrategy's implementation, whose ``__new__`` raytf sets so that a
    ``train_fn``'s own strategy is raytf's, connected one (worker/strategy.py)."""
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    return collective.CollectiveAllReduceStrategy


def parameter_server_strategy_class() -> type:
    """ParameterServerStrategy's implementation (``__new__`` set as above, worker/ps.py)."""
    from tensorflow.python.distribute import parameter_server_strategy_v2 as pss

    return pss.ParameterServerStrategyV2


def coordinator_server_def(coordinator: Any) -> Any:
    """The ServerDef a ClusterCoordinator reconnects with, where raytf writes a replaced task's
    new address (worker/ps.py ``retarget``)."""
    return coordinator._cluster.failure_handler._server_def  # noqa: SLF001


def coordinator_recovering(coordinator: Any) -> bool:
    """Whether the coordinator's failure handler has begun reconnecting to the cluster (a step
    failed on a lost worker): from then on it redials the addresses it read, whatever raytf writes."""
    return coordinator._cluster.failure_handler._cluster_due_for_update_or_finish.is_set()  # noqa: SLF001


def devices_listed() -> bool:
    """Whether this process's TensorFlow has listed its physical devices (after which
    CUDA_VISIBLE_DEVICES no longer applies: warm standbys of GPU workers)."""
    from tensorflow.python.eager import context

    return context.context()._physical_devices is not None  # noqa: SLF001


def dataset_inputs(dataset: Any) -> list:
    """The datasets a ``tf.data.Dataset`` was made from (``.map``'s input, ...)."""
    return list(dataset._inputs())  # noqa: SLF001


def dataset_functions(dataset: Any) -> list:
    """The traced functions of a ``tf.data`` transformation (a map's, an interleave's)."""
    return [f.function for f in dataset._functions()]  # noqa: SLF001


def saveables(checkpoint: Any) -> list:
    """Every object whose state ``checkpoint`` (a ``tf.train.Checkpoint``) saves, found as
    TensorFlow's own asynchronous checkpoint finds them (its helper's ``_get_all_trackables``,
    and the optimizers' slot variables, which are not their descendants: asked for, as the
    helper does)."""
    from tensorflow.python.checkpoint import async_checkpoint_helper as helper
    from tensorflow.python.util import object_identity

    saveable, every = helper._get_all_trackables(  # noqa: SLF001
        root=checkpoint, exclude_set=object_identity.ObjectIdentitySet([checkpoint]))
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
    variable), or None (anything else, or a Keras whose variable no longer keeps one in
    ``_value``: then Keras's own copy is used)."""
    import tensorflow as tf

    if not type(obj).__module__.startswith("keras."):
        return None
    value = vars(obj).get("_value")
    return value if isinstance(value, tf.Variable) else None


def write_copies(checkpoint: Any, copies: Any, prefix: str, options: Any) -> None:
    """Write ``checkpoint`` (a ``tf.train.Checkpoint``) with every object in ``copies`` saved from
    its host copy (the saver's ``_object_map``, which TensorFlow's asynchronous checkpoint sets)."""
    checkpoint._saver._object_map = copies  # noqa: SLF001
    checkpoint.write(prefix, options=options)


_COUNTED: list = []


def count_batches_taken(distributed: Any, took: Any, iterated: Any) -> Any:
    """Make every iterator of ``distributed`` (what ``distribute_datasets_from_function``
    returns) call ``took(1)`` for each batch it hands out outside a ``tf.function``: its
    ``get_next`` (``next``, a Python ``for`` loop) and ``get_next_as_optional`` with a value;
    and ``iterated()`` each time a loop makes one (a Keras fit loop's epoch). The classes are
    TensorFlow's, subclassed; an iterator traced into a function is rebuilt from its spec as
    TensorFlow's own and counts nothing."""
    if not _COUNTED:
        from tensorflow.python.distribute import input_lib
        from tensorflow.python.eager import context

        class CountedIterator(input_lib.DistributedIterator):
            _raytf_took: Any = None

            def get_next(self, name: Any = None) -> Any:
                value = super().get_next(name)
                if context.executing_eagerly():
                    self._raytf_took(1)
                return value

            def get_next_as_optional(self) -> Any:
                optional = super().get_next_as_optional()
                if context.executing_eagerly() and bool(optional.has_value()):
                    self._raytf_took(1)
                return optional

        class CountedDatasets(input_lib.DistributedDatasetsFromFunction):
            _raytf_took: Any = None
            _raytf_iterated: Any = None

            def __iter__(self) -> Any:
                iterator = super().__iter__()
                if context.executing_eagerly() and type(iterator) is input_lib.DistributedIterator:
                    iterator.__class__ = CountedIterator
                    iterator._raytf_took = self._raytf_took  # noqa: SLF001
                    self._raytf_iterated()
                return iterator

        _COUNTED.extend((input_lib.DistributedDatasetsFromFunction, CountedDatasets))
    base, counted = _COUNTED
    if type(distributed) is base:
        distributed.__class__ = counted
        distributed._raytf_took, distributed._raytf_iterated = took, iterated  # noqa: SLF001
    return distributed


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


def _probe_resource_writes() -> None:
    from tensorflow.python.framework import auto_control_deps_utils

    assert callable(getattr(auto_control_deps_utils, "get_read_write_resource_inputs", None)), \
        "auto_control_deps_utils.get_read_write_resource_inputs"


def _probe_function_autograph() -> None:
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    assert "_autograph" in polymorphic_function.Function.__init__.__code__.co_names, "Function._autograph"
    assert isinstance(getattr(polymorphic_function.Function, "python_function", None), property), \
        "Function.python_function"


def _probe_counted_iterators() -> None:
    from tensorflow.python.distribute import input_lib

    for name in ("DistributedIterator", "DistributedDatasetsFromFunction"):
        assert isinstance(getattr(input_lib, name, None), type), f"input_lib.{name}"
    for method in ("get_next", "get_next_as_optional"):
        assert callable(getattr(input_lib.DistributedIterator, method, None)), f"DistributedIterator.{method}"
    assert "DistributedIterator" in input_lib.DistributedDatasetsFromFunction.__iter__.__code__.co_names, \
        "DistributedDatasetsFromFunction.__iter__ makes a DistributedIterator"


def _probe_host_copies() -> None:
    import tensorflow as tf
    from tensorflow.python.checkpoint import async_checkpoint_helper as helper
    from tensorflow.python.checkpoint import checkpoint as checkpoint_module
    from tensorflow.python.ops import resource_variable_ops

    assert callable(getattr(helper, "_get_all_trackables", None)), "async_checkpoint_helper._get_all_trackables"
    assert "_copy_trackable_to_cpu" in vars(resource_variable_ops.BaseResourceVariable), \
        "BaseResourceVariable._copy_trackable_to_cpu"
    assert "_object_map" in checkpoint_module.TrackableSaver.__init__.__code__.co_names, "TrackableSaver._object_map"
    assert "_saver" in tf.train.Checkpoint.__init__.__code__.co_names, "tf.train.Checkpoint._saver"


def _probe_dataset_graph() -> None:
    # Read off the classes, running nothing: a probe must not initialize TensorFlow's eager
    # context before the strategy configures its collectives.
    import tensorflow as tf
    from tensorflow.python.data.ops import structured_function

    for method in ("_inputs", "_functions"):
        assert callable(getattr(tf.data.Dataset, method, None)), f"tf.data.Dataset.{method}"
    assert isinstance(getattr(structured_function.StructuredFunctionWrapper, "function", None), property), \
        "StructuredFunctionWrapper.function"


def _probe_server_def() -> None:
    # Without a cluster to connect to, the attributes are read off the code that sets them.
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    assert "failure_handler" in cc.Cluster.__init__.__code__.co_names, "Cluster sets no failure_handler"
    handler = cc.WorkerPreemptionHandler.__init__.__code__.co_names
    assert "_server_def" in handler, "no handler _server_def"
    assert "_cluster_due_for_update_or_finish" in handler, "no handler _cluster_due_for_update_or_finish"


def _probe_devices() -> None:
    from tensorflow.python.eager import context

    assert "_physical_devices" in vars(context.context())


HOOKS = [
    Hook("tensorflow.collective_new", "tensorflow",
         "tensorflow.python.distribute.collective_all_reduce_strategy.CollectiveAllReduceStrategy",
         "MultiWorkerMirroredStrategy() inside train_fn (it returns raytf's connected strategy)",
         "nothing: build the strategy with raytf.strategy() instead; this one is required",
         lambda: collective_strategy_class().__new__),
    Hook("tensorflow.parameter_server_new", "tensorflow",
         "tensorflow.python.distribute.parameter_server_strategy_v2.ParameterServerStrategyV2",
         "ParameterServerStrategy() inside a ParameterServerTrainer's train_fn",
         "ParameterServerTrainer (use raytf.Trainer)", lambda: parameter_server_strategy_class().__new__),
    Hook("tensorflow.coordinator_server_def", "tensorflow",
         "ClusterCoordinator._cluster.failure_handler._server_def and ._cluster_due_for_update_or_finish",
         "replacing a lost parameter-server worker in place", "ParameterServerTrainer (use raytf.Trainer)",
         _probe_server_def),
    Hook("tensorflow.physical_devices", "tensorflow", "tensorflow.python.eager.context.Context._physical_devices",
         "warm standbys of GPU workers", "FailureConfig.warm_standby", _probe_devices),
    Hook("tensorflow.host_copies", "tensorflow",
         "Trackable._copy_trackable_to_cpu, TrackableSaver._object_map (TensorFlow's asynchronous checkpoint)",
         "asynchronous checkpoints of Checkpoint.from_state (report returns once the state is copied in host memory)",
         'CheckpointConfig(upload="sync")', _probe_host_copies),
    Hook("tensorflow.counted_iterators", "tensorflow",
         "input_lib.DistributedDatasetsFromFunction and DistributedIterator, subclassed",
         "exactly-once data in a custom loop (counting the batches it takes from the strategy's iterator)",
         "DataConfig(exactly_once=False)",
         _probe_counted_iterators),
    Hook("tensorflow.function_autograph", "tensorflow", "tf.function's Function._autograph",
         "exactly-once data for parameter servers (raytf counts the batches each step takes)",
         "nothing: this one is required by ParameterServerTrainer's data",
         _probe_function_autograph),
    Hook("tensorflow.resource_writes", "tensorflow", "auto_control_deps_utils.get_read_write_resource_inputs",
         "exactly-once data for parameter servers (a step's updates are held until all of its inputs arrived)",
         "nothing: this one is required by ParameterServerTrainer's data",
         _probe_resource_writes),
    Hook("tensorflow.dataset_graph", "tensorflow", "tf.data.Dataset._inputs() and ._functions()",
         "recognising a raytf shard inside tf.data (per-worker distribution)",
         "nothing: pass raytf.keras.distribute(dataset) to model.fit; this one is required",
         _probe_dataset_graph),
]

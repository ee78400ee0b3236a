"""TensorFlow's distribution internals raytf stands on: the strategies' classes (their ``__new__``
set so that a ``train_fn``'s own strategy is raytf's), the parameter-server coordinator's cluster,
the eager context's device list, distributed datasets (counted, unwrapped).

See the package docstring of ``raytf._internal.hooks``.
"""

from __future__ import annotations

from typing import Any, Callable

from raytf._internal.hooks._hook import Hook, once_a_process, run_check_script


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
    """Whether the coordinator's failure handler is reconnecting to the cluster (a step failed on
    a lost worker, and it redials the addresses it read, whatever raytf writes, until every task
    answers). A stopped handler (the coordinator shut down, or a parameter server lost) is not."""
    handler = coordinator._cluster.failure_handler  # noqa: SLF001
    return handler._should_preemption_thread_run and handler._cluster_due_for_update_or_finish.is_set()  # noqa: SLF001


def count_closures_ended(coordinator: Any, ended: Callable[[], None]) -> None:
    """Call ``ended()`` each time one of the coordinator's scheduled functions ends, finished or
    failed (its closure queue's ``mark_finished`` and ``mark_failed``, wrapped on this one queue)."""
    queue = coordinator._cluster.closure_queue  # noqa: SLF001
    for name in ("mark_finished", "mark_failed"):
        original = getattr(queue, name)

        def counted(*args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            ended()  # first: a join() that the mark releases sees it counted
            return _original(*args, **kwargs)

        setattr(queue, name, counted)


def closures_pending(coordinator: Any) -> int:
    """How many of the coordinator's scheduled functions have not ended: queued, or running on a
    worker."""
    queue = coordinator._cluster.closure_queue  # noqa: SLF001
    return queue.inflight_closure_count + queue._queue.qsize()  # noqa: SLF001


def devices_listed() -> bool:
    """Whether this process's TensorFlow has listed its physical devices (after which
    CUDA_VISIBLE_DEVICES no longer applies: warm standbys of GPU workers)."""
    from tensorflow.python.eager import context

    return context.context()._physical_devices is not None  # noqa: SLF001


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


def distributed_original(dataset: Any) -> Any:
    """The ``tf.data.Dataset`` a strategy's ``experimental_distribute_dataset`` wrapped into
    ``dataset``, or None where ``dataset`` is no such wrapper."""
    return getattr(dataset, "_original_dataset", None)


def _probe_distributed_original() -> None:
    from tensorflow.python.distribute import input_lib

    assert "_original_dataset" in input_lib.DistributedDataset.__init__.__code__.co_names, (
        "DistributedDataset._original_dataset"
    )


def _behaves_distributed_original() -> None:
    import tensorflow as tf

    dataset = tf.data.Dataset.range(4).batch(2)
    wrapped = tf.distribute.MirroredStrategy(["/cpu:0"]).experimental_distribute_dataset(dataset)
    assert distributed_original(wrapped) is dataset, "the wrapper does not keep the dataset it wrapped"


def _probe_counted_iterators() -> None:
    from tensorflow.python.distribute import input_lib

    for name in ("DistributedIterator", "DistributedDatasetsFromFunction"):
        assert isinstance(getattr(input_lib, name, None), type), f"input_lib.{name}"
    for method in ("get_next", "get_next_as_optional"):
        assert callable(getattr(input_lib.DistributedIterator, method, None)), f"DistributedIterator.{method}"
    assert "DistributedIterator" in input_lib.DistributedDatasetsFromFunction.__iter__.__code__.co_names, (
        "DistributedDatasetsFromFunction.__iter__ makes a DistributedIterator"
    )


def _probe_server_def() -> None:
    # Without a cluster to connect to, the attributes are read off the code that sets them.
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    assert "failure_handler" in cc.Cluster.__init__.__code__.co_names, "Cluster sets no failure_handler"
    handler = cc.WorkerPreemptionHandler.__init__.__code__.co_names
    assert "_server_def" in handler, "no handler _server_def"
    assert "_cluster_due_for_update_or_finish" in handler, "no handler _cluster_due_for_update_or_finish"
    assert "_should_preemption_thread_run" in handler, "no handler _should_preemption_thread_run"


def _probe_closures() -> None:
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc

    assert "closure_queue" in cc.Cluster.__init__.__code__.co_names, "Cluster sets no closure_queue"
    queue = cc._CoordinatedClosureQueue  # noqa: SLF001
    for name in ("mark_finished", "mark_failed"):
        assert callable(getattr(queue, name, None)), f"_CoordinatedClosureQueue.{name}"
    assert isinstance(getattr(queue, "inflight_closure_count", None), property), "inflight_closure_count"
    assert "_queue" in queue.__init__.__code__.co_names, "_CoordinatedClosureQueue sets no _queue"


# A coordinator whose one worker is killed and never comes back, in a process of its own (it
# redials for ever, and its threads would hold an exit): the reconnect is seen, it redials the
# address in the ServerDef raytf writes, and its closures count as ended and pending as they do.
# Prints "ok" and leaves at once. The ports are chosen once both processes have TensorFlow imported,
# milliseconds before their servers bind them (as in eager.py's regroup check).
_COORDINATOR_SCRIPT = """
import json, os, socket, subprocess, sys, time
import tensorflow as tf
from raytf._internal.hooks.tensorflow.distribute import (
    closures_pending, coordinator_recovering, coordinator_server_def, count_closures_ended)
serve = "import sys, json, tensorflow as tf; print('ready', flush=True); tf.distribute.Server(json.loads(sys.stdin.readline()), 'worker', 0).join()"
server = subprocess.Popen([sys.executable, "-c", serve], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    assert server.stdout.readline().strip() == "ready", "the worker's server did not start"
    held = [socket.socket() for _ in range(3)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    worker, ps, chief = [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    for s in held:
        s.close()
    cluster = {"worker": [worker], "ps": [ps], "chief": [chief]}
    server.stdin.write(json.dumps(cluster) + "\\n")
    server.stdin.flush()
    ps_server = tf.distribute.Server(cluster, job_name="ps", task_index=0, start=True)
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type="chief", task_id=0, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    ended = []
    count_closures_ended(coordinator, lambda: ended.append(1))
    step = tf.function(lambda: tf.constant(1))
    assert coordinator.fetch(coordinator.schedule(step)) == 1, "no step ran"
    coordinator.join()
    assert (len(ended), closures_pending(coordinator)) == (1, 0), ("ended, pending", len(ended), closures_pending(coordinator))
    assert not coordinator_recovering(coordinator), "reconnecting before any loss"
    [job] = [j for j in coordinator_server_def(coordinator).cluster.job if j.name == "worker"]
    assert job.tasks[0] == worker, dict(job.tasks)
    server.kill()
    server.wait()
    coordinator.schedule(step)
    deadline = time.monotonic() + 60
    while not coordinator_recovering(coordinator):
        assert time.monotonic() < deadline, "no reconnect seen within 60 s of the worker's loss"
        time.sleep(0.1)
    assert (len(ended), closures_pending(coordinator)) == (1, 1), ("held: ended, pending", len(ended), closures_pending(coordinator))
    print("ok", flush=True)
finally:
    server.kill()
    os._exit(0)
"""


@once_a_process  # two hooks' checks: a second coordinator would cost seconds
def _behaves_coordinator() -> None:
    run_check_script(_COORDINATOR_SCRIPT)


def _probe_devices() -> None:
    from tensorflow.python.eager import context

    assert "_physical_devices" in vars(context.context())


def _behaves_strategy_classes() -> None:
    import tensorflow as tf

    assert issubclass(tf.distribute.MultiWorkerMirroredStrategy, collective_strategy_class()), (
        "tf.distribute.MultiWorkerMirroredStrategy is not a CollectiveAllReduceStrategy"
    )
    assert issubclass(tf.distribute.experimental.ParameterServerStrategy, parameter_server_strategy_class()), (
        "tf.distribute.experimental.ParameterServerStrategy is not a ParameterServerStrategyV2"
    )


def _behaves_devices() -> None:
    import tensorflow as tf

    assert not devices_listed(), "devices listed before anything asked for them"
    tf.config.list_physical_devices()
    assert devices_listed(), "devices not listed after tf.config.list_physical_devices()"


def _behaves_counted_iterators() -> None:
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.distribute_datasets_from_function(lambda _: tf.data.Dataset.range(3).batch(1))
    taken: list = []
    loops: list = []
    count_batches_taken(distributed, taken.append, lambda: loops.append(1))
    for _ in distributed:
        pass
    assert (len(taken), len(loops)) == (3, 1), (taken, loops)


HOOKS = [
    Hook(
        "tensorflow.collective_new",
        "tensorflow",
        "tensorflow.python.distribute.collective_all_reduce_strategy.CollectiveAllReduceStrategy",
        "MultiWorkerMirroredStrategy() inside train_fn (it returns raytf's connected strategy)",
        "nothing: build the strategy with raytf.strategy() instead; this one is required",
        lambda: collective_strategy_class().__new__,
        behaves=_behaves_strategy_classes,
    ),
    Hook(
        "tensorflow.parameter_server_new",
        "tensorflow",
        "tensorflow.python.distribute.parameter_server_strategy_v2.ParameterServerStrategyV2",
        "ParameterServerStrategy() inside a ParameterServerTrainer's train_fn",
        "ParameterServerTrainer (use raytf.Trainer)",
        lambda: parameter_server_strategy_class().__new__,
        behaves=_behaves_strategy_classes,
    ),
    Hook(
        "tensorflow.coordinator_server_def",
        "tensorflow",
        "ClusterCoordinator._cluster.failure_handler._server_def, ._cluster_due_for_update_or_finish "
        "and ._should_preemption_thread_run",
        "replacing a lost parameter-server worker in place; ending a coordinator's endless reconnect "
        "(FailureConfig.hang_timeout_s)",
        "ParameterServerTrainer (use raytf.Trainer)",
        _probe_server_def,
        behaves=_behaves_coordinator,
        in_processes=True,
    ),
    Hook(
        "tensorflow.coordinator_closures",
        "tensorflow",
        "ClusterCoordinator._cluster.closure_queue: mark_finished and mark_failed (wrapped on the "
        "queue), inflight_closure_count and ._queue",
        "ending a parameter-server run whose scheduled steps stopped ending (FailureConfig.hang_timeout_s)",
        "ParameterServerTrainer (use raytf.Trainer)",
        _probe_closures,
        behaves=_behaves_coordinator,
        in_processes=True,
    ),
    Hook(
        "tensorflow.physical_devices",
        "tensorflow",
        "tensorflow.python.eager.context.Context._physical_devices",
        "warm standbys of GPU workers",
        "FailureConfig.warm_standby",
        _probe_devices,
        behaves=_behaves_devices,
    ),
    Hook(
        "tensorflow.counted_iterators",
        "tensorflow",
        "input_lib.DistributedDatasetsFromFunction and DistributedIterator, subclassed",
        "exactly-once data in a custom loop (counting the batches it takes from the strategy's iterator)",
        "DataConfig(exactly_once=False)",
        _probe_counted_iterators,
        behaves=_behaves_counted_iterators,
    ),
    Hook(
        "tensorflow.distributed_original",
        "tensorflow",
        "input_lib.DistributedDataset._original_dataset",
        "a ParameterServerTrainer's raytf.get_dataset_shard dataset passed through "
        "experimental_distribute_dataset (recognised as raytf's)",
        "nothing: pass the dataset function (strategy.distribute_datasets_from_function) instead",
        _probe_distributed_original,
        behaves=_behaves_distributed_original,
    ),
]

"""The worker's MultiWorkerMirroredStrategy, and the one a ``train_fn`` builds itself.

Ray Train code builds its own ``tf.distribute.MultiWorkerMirroredStrategy()``
inside the training function. Two strategies in one process do not mix:
raytf's collectives (agreeing on shard sizes, the preemption check) and the
user's would share collective keys, and a callback running raytf's strategy
under the user's scope fails ("Mixing different tf.distribute.Strategy
objects"). So while a worker trains, constructing a MultiWorkerMirroredStrategy
returns raytf's own, already connected: one object, one collective group.

raytf's strategy also knows its own shards. A per-worker dataset handed to
``experimental_distribute_dataset`` (which tf-keras's ``model.fit`` calls) is
taken as the *global* batch and cut into ``num_workers`` slices, so each worker
would train on a fraction of its data in silence. A dataset made by
``raytf.get_dataset_shard`` (or derived from one) is distributed as what it
is, each worker's batches as its replica's batches.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator, Optional

from raytf._internal.hooks import tensorflow as _tf_hooks

logger = logging.getLogger(__name__)

_SHARD_MARK = "_raytf_shard"
PLANNED_MARK = "_raytf_planned"  # on a planned shard's tf.data: the cursor behind it (data/planned.py)
# Also in the shard's tf.data options, which TensorFlow carries to every dataset made from it, so a
# shard captured inside a function (``Dataset.interleave``, ``flat_map``) is recognised through
# the function's captured inputs, where no Python attribute reaches.
_SHARD_FRAMEWORK = "raytf_shard"
# Ops through which a tf.data pipeline reads from Python, where raytf cannot see what it reads.
_PYTHON_READS = frozenset({"GeneratorDataset", "EagerPyFunc", "PyFunc", "PyFuncStateless"})
_installed: Any = None  # raytf's strategy while a session is installed in this process
_strategy_class: Any = None
_shards_made = False  # whether this process has handed out a raytf shard


def mark_shard(dataset: Any) -> Any:
    """Mark a per-worker dataset as raytf's, so the strategy distributes it per worker."""
    import tensorflow as tf

    global _shards_made
    options = tf.data.Options()
    options.framework_type = [_SHARD_FRAMEWORK]
    dataset = dataset.with_options(options)
    setattr(dataset, _SHARD_MARK, True)
    _shards_made = True
    return dataset


def lineage(dataset: Any) -> Iterator[Any]:
    """``dataset`` and every dataset it was made from (``.repeat()``, ``.map()``, ...), each once."""
    stack, seen = [dataset], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        try:
            stack.extend(_tf_hooks.dataset_inputs(current))
        except Exception:  # noqa: BLE001 - not a tf.data dataset (a distributed one, a template)
            pass


def _functions(dataset: Any) -> list:
    """The traced functions of one transformation (a map's, an interleave's), or []."""
    try:
        return _tf_hooks.dataset_functions(dataset)
    except Exception:  # noqa: BLE001 - not a tf.data dataset
        return []


def _captured_is_shard(tensor: Any) -> bool:
    """Whether a dataset captured by a function (a variant tensor) carries raytf's shard option."""
    import tensorflow as tf

    if tensor.dtype != tf.variant:
        return False
    try:
        options = tf.raw_ops.GetOptions(input_dataset=tensor).numpy()
    except Exception:  # noqa: BLE001 - a variant that is not a dataset (a tensor list)
        return False
    return _SHARD_FRAMEWORK in _tf_hooks.framework_types(options)


def is_shard(dataset: Any) -> bool:
    """Whether ``dataset`` is a raytf shard or built from one: by ``.repeat()``, ``.map()``, ...,
    or with the shard inside a function (``Dataset.range(1).interleave(lambda _: shard)``)."""
    for current in lineage(dataset):
        if getattr(current, _SHARD_MARK, False):
            return True
        if any(_captured_is_shard(t) for f in _functions(current) for t in f.captured_inputs):
            return True
    return False


def reads_through_python(dataset: Any) -> bool:
    """Whether ``dataset`` reads from Python (``from_generator``, ``py_function``) anywhere."""
    for current in lineage(dataset):
        for function in _functions(current):
            ops = {op.type for op in function.graph.get_operations()}
            ops.update(node.op for node in function.function_def.node_def)
            if ops & _PYTHON_READS:
                return True
    return False


def check_not_resplit(dataset: Any, num_workers: int) -> None:
    """Refuse to split, as the global batch, a dataset that may yield a raytf shard's batches
    through Python, where raytf cannot see them: every worker would train 1/num_workers of its rows."""
    if num_workers > 1 and _shards_made and reads_through_python(dataset):
        from raytf.errors import DatasetShardError

        raise DatasetShardError(
            "the dataset handed to model.fit (or experimental_distribute_dataset) reads through Python "
            "(Dataset.from_generator or tf.py_function), and this worker reads a raytf shard: if it yields the "
            f"shard's batches, MultiWorkerMirroredStrategy would split each across the {num_workers} workers "
            f"and every worker would train 1/{num_workers} of its rows. Build it from the shard in tf.data "
            "(shard.map, .interleave, .flat_map are recognised), or distribute it per worker as it is with "
            "raytf.keras.distribute(dataset); a dataset that is one global dataset for all workers goes "
            "through strategy.distribute_datasets_from_function, sharded by you"
        )


def _class() -> Any:
    global _strategy_class
    if _strategy_class is not None:
        return _strategy_class
    import tensorflow as tf

    class RaytfMultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        """MultiWorkerMirroredStrategy that distributes raytf's shards per worker and is
        what ``tf.distribute.MultiWorkerMirroredStrategy()`` returns inside ``train_fn``."""

        _raytf_connected = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if self._raytf_connected:  # a train_fn's own MultiWorkerMirroredStrategy(...): this one
                _note_ignored_arguments(args, kwargs)
                return
            super().__init__(*args, **kwargs)
            self._raytf_connected = True

        def distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
            cursors: list = []

            def noted(context: Any) -> Any:
                dataset = dataset_fn(context)
                cursors.append((cursor_of(dataset), _endless(dataset)))
                return dataset

            distributed = super().distribute_datasets_from_function(noted, options)
            if cursors and cursors[0][0] is not None:  # a planned shard: count what the loop takes (planned.py)
                from raytf._internal import hooks

                cursor, endless = cursors[0]
                hooks.require("tensorflow.counted_iterators")
                _tf_hooks.count_batches_taken(distributed, cursor.took, lambda: cursor.iterated(by_pass=not endless))
            return distributed

        def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
            if is_shard(dataset):
                return self.distribute_datasets_from_function(lambda _: dataset, options)
            check_not_resplit(dataset, self.num_replicas_in_sync)
            return super().experimental_distribute_dataset(dataset, options)

    _strategy_class = RaytfMultiWorkerMirroredStrategy
    return _strategy_class


def _endless(dataset: Any) -> bool:
    """Whether ``dataset`` repeats without end (``shard.repeat()``): a loop over it takes its
    epochs' steps from ``steps_per_epoch``, not from the passes."""
    import tensorflow as tf

    try:
        return int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    except Exception:  # noqa: BLE001 - not a tf.data dataset
        return False


def cursor_of(dataset: Any) -> Any:
    """The cursor (data/planned.py) of the planned shard ``dataset`` is, or is made from, if any."""
    for current in lineage(dataset):
        cursor = getattr(current, PLANNED_MARK, None)
        if cursor is not None:
            return cursor
    return None


def _note_ignored_arguments(args: tuple, kwargs: dict) -> None:
    if args or any(v is not None for v in kwargs.values()):
        logger.info(
            "MultiWorkerMirroredStrategy(...) inside train_fn returns raytf's strategy, already "
            "connected; its arguments are not used (set them with raytf.TensorflowConfig)"
        )


def wait_for_leader(tf_config: str, timeout_s: float = 10.0) -> float:
    """On every task but the coordination service's leader (the chief, else worker 0): wait until
    the leader's server accepts connections, before building the strategy. Returns seconds waited.

    The workers are released together, and the leader's gRPC server needs a moment to listen; a
    peer whose first connection is refused waits out gRPC's reconnect backoff (up to 1 s in
    TensorFlow) before it tries again, which made the strategy's connect take ~1 s where ~0.1 s
    does. A refused TCP connect costs microseconds, so this polls every 10 ms. After
    ``timeout_s`` it goes on and leaves the waiting to TensorFlow.
    """
    import json
    import socket
    import time

    config = json.loads(tf_config)
    cluster, task = config.get("cluster", {}), config.get("task", {})
    leader_job = "chief" if cluster.get("chief") else "worker"
    if not cluster.get(leader_job) or (task.get("type"), task.get("index")) == (leader_job, 0):
        return 0.0
    host, _, port = cluster[leader_job][0].rpartition(":")
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                break
        except OSError:
            time.sleep(0.01)
    return time.monotonic() - started


def make_strategy(communication: str, collective_timeout_s: Optional[float], bytes_per_pack: int = 0) -> Any:
    """This worker's MultiWorkerMirroredStrategy from TF_CONFIG; blocks until every peer has joined."""
    import tensorflow as tf

    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }[communication]
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation, timeout_seconds=collective_timeout_s, bytes_per_pack=bytes_per_pack
    )
    return _class()(
        cluster_resolver=tf.distribute.cluster_resolver.TFConfigClusterResolver(), communication_options=options
    )


def return_installed(base: type, own_class: Callable[[], type], installed: Callable[[], Any]) -> None:
    """Make ``base(...)`` return ``installed()`` while it is set: how a ``train_fn``'s own strategy
    becomes raytf's, connected one. ``own_class()`` (raytf's subclass) still constructs normally;
    its ``__init__`` is a no-op on a connected strategy."""
    if base.__dict__.get("_raytf_returns_installed"):
        return

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        current = installed()
        if current is not None and cls is not own_class():
            return current
        return object.__new__(cls)

    setattr(base, "__new__", staticmethod(__new__))  # noqa: B010 - a class's method, replaced
    setattr(base, "_raytf_returns_installed", True)  # noqa: B010


def install(strategy: Any) -> None:
    """From now on, constructing any MultiWorkerMirroredStrategy in this process returns ``strategy``."""
    global _installed
    return_installed(_tf_hooks.collective_strategy_class(), _class, lambda: _installed)
    _installed = strategy


def uninstall() -> None:
    global _installed
    _installed = None

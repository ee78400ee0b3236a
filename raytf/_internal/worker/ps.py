"""The chief's ParameterServerStrategy and ClusterCoordinator, and the servers' TensorFlow server.

As with MultiWorkerMirroredStrategy (strategy.py), a ``train_fn`` that builds
its own ``tf.distribute.ParameterServerStrategy(...)`` gets raytf's, already
connected, and ``ClusterCoordinator(strategy)`` (one per strategy, by
TensorFlow's design) is raytf's coordinator. That coordinator knows raytf's
shards: handed a shard that ``raytf.get_dataset_shard`` returned (directly, or
as tf-keras' ``model.fit`` passes it), it builds each worker's own pipeline
over that worker's files (data/tfdata_ps.py).

A lost worker's replacement takes the old worker's port again (the driver
waits for the old process to end; the port is bound despite the dead
server's lingering connections): TensorFlow's failure handling redials the
lost worker's address, with no timeout, until a server answers there. Where
the replacement cannot hold that address (another node), :func:`retarget`
points the coordinator at the new one; that helps only if TensorFlow has not
yet begun redialing the old address, which it does as soon as a step fails
on the lost worker. Where it has, the driver restarts the group from the last
checkpoint rather than leave the coordinator waiting.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from raytf._internal.data import ps_positions, tfdata_ps
from raytf.errors import ConfigError

logger = logging.getLogger(__name__)

_tracing = threading.local()  # set while the coordinator traces a per-worker dataset function
_installed: Any = None
_classes: Optional[tuple[Any, Any]] = None


def tracing_per_worker_dataset() -> bool:
    """Whether the caller runs inside a dataset function the coordinator is tracing for the workers."""
    return getattr(_tracing, "active", False)


def _make_classes() -> tuple[Any, Any]:
    global _classes
    if _classes is not None:
        return _classes
    import tensorflow as tf

    class RaytfParameterServerStrategy(tf.distribute.ParameterServerStrategy):
        """ParameterServerStrategy that is what ``tf.distribute.ParameterServerStrategy(...)``
        returns inside ``train_fn``."""

        _raytf_connected = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if self._raytf_connected:
                if args[1:] or any(v is not None for k, v in kwargs.items() if k != "cluster_resolver"):
                    logger.info(
                        "ParameterServerStrategy(...) inside train_fn returns raytf's strategy, "
                        "already connected; set variable_partitioner on ParameterServerTrainer"
                    )
                return
            super().__init__(*args, **kwargs)
            self._raytf_connected = True

    class RaytfClusterCoordinator(tf.distribute.coordinator.ClusterCoordinator):
        """ClusterCoordinator that builds each worker's pipeline from raytf's shards."""

        def schedule(self, fn: Any, args: Any = None, kwargs: Any = None) -> Any:
            counted = ps_positions.counting(fn, args or (), kwargs or {})
            return super().schedule(counted or fn, args=args, kwargs=kwargs)

        def create_per_worker_dataset(self, dataset_fn: Any) -> Any:
            shard = tfdata_ps.template_of(dataset_fn)
            if shard is not None:

                def dataset_fn() -> Any:
                    return shard.build(tf.distribute.coordinator.experimental_get_current_worker_index())
            elif not callable(dataset_fn) and tfdata_ps.derived_from_template(dataset_fn):
                raise ConfigError(
                    "create_per_worker_dataset: this dataset was made from a raytf parameter-server shard "
                    "by a transformation, which the workers cannot rebuild from the shard; apply it in a "
                    "dataset function instead: coordinator.create_per_worker_dataset(lambda: "
                    "raytf.get_dataset_shard(...).map(...))"
                )
            previous, _tracing.active = getattr(_tracing, "active", False), True
            built, _tracing.built = getattr(_tracing, "built", None), []
            try:
                datasets = super().create_per_worker_dataset(dataset_fn)
                shards = [shard] if shard is not None else _tracing.built
            finally:
                _tracing.active, _tracing.built = previous, built
            positions = {id(s.positions): s.positions for s in shards if s.positions is not None}
            if len(positions) != 1:  # none, or a pipeline of several shards: its steps are not counted
                return datasets
            return CountedPerWorkerDataset(datasets, next(iter(positions.values())))

    _classes = (RaytfParameterServerStrategy, RaytfClusterCoordinator)
    return _classes


class CountedPerWorkerDataset:
    """A per-worker dataset of a raytf shard whose iterators the coordinator counts batches of
    (data/ps_positions.py); otherwise TensorFlow's own."""

    def __init__(self, datasets: Any, positions: Any):
        self._datasets = datasets
        self._positions = positions

    def __iter__(self) -> Any:
        iterator = iter(self._datasets)
        iterator._raytf_positions = self._positions
        return iterator

    def __getattr__(self, name: str) -> Any:
        return getattr(self._datasets, name)


def note_built(shard: Any) -> None:
    """``shard``'s pipeline was built inside the dataset function the coordinator traces now."""
    built = getattr(_tracing, "built", None)
    if built is not None:
        built.append(shard)


def make_strategy(variable_partitioner: Any) -> tuple[Any, Any]:
    """(strategy, coordinator) from TF_CONFIG; connects to every worker and ps."""
    import tensorflow as tf

    strategy_class, coordinator_class = _make_classes()
    strategy = strategy_class(
        tf.distribute.cluster_resolver.TFConfigClusterResolver(), variable_partitioner=variable_partitioner
    )
    return strategy, coordinator_class(strategy)


def install(strategy: Any) -> None:
    """From now on, constructing a ParameterServerStrategy in this process returns ``strategy``."""
    global _installed
    from raytf._internal.hooks import tensorflow as tf_hooks
    from raytf._internal.worker.strategy import return_installed

    return_installed(tf_hooks.parameter_server_strategy_class(), lambda: _make_classes()[0], lambda: _installed)
    _installed = strategy


def uninstall() -> None:
    global _installed
    _installed = None


def retarget(coordinator: Any, task_type: str, task_index: int, host_port: str) -> bool:
    """Point ``coordinator`` at a replaced task's new address, before that task's server starts.
    False where that comes too late: the coordinator already redials the old address (and would
    wait there for ever), so the group must restart instead."""
    from raytf._internal.hooks import tensorflow as tf_hooks

    server_def = tf_hooks.coordinator_server_def(coordinator)
    for job in server_def.cluster.job:
        if job.name == task_type:
            job.tasks[task_index] = host_port
            return not tf_hooks.coordinator_recovering(coordinator)
    raise ValueError(f"the coordinator's cluster has no job {task_type!r}")


def start_server(task_type: str, task_index: int) -> Any:
    """This process's TensorFlow server for a worker or ps task, from TF_CONFIG; serves until the
    process ends."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.Server(
        resolver.cluster_spec(), job_name=task_type, task_index=task_index, protocol="grpc", start=True
    )

"""The functions ``train_fn`` calls on a worker: its context, the strategy, its data, reports.

One session per worker process, installed by raytf before ``train_fn``
starts. Calling these anywhere else is an error that says so, rather than a
silent no-op. Names follow Ray Train's (``report``, ``get_context``,
``get_checkpoint``, ``get_dataset_shard``).
"""

from __future__ import annotations

from typing import Any, Optional

from raytf._internal.protocol import TrainContext

__all__ = [
    "TrainContext",
    "all_reduce_gradients",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "preemption_requested",
    "report",
    "strategy",
]


def _current(function: str) -> Any:
    from raytf._internal.worker.session import current

    return current(function)


def get_context() -> TrainContext:
    """This worker's ranks, world size, attempt number and run."""
    return _current("get_context").context


def strategy() -> Any:
    """This worker group's ``tf.distribute.MultiWorkerMirroredStrategy``, already connected (the
    chief's ``ParameterServerStrategy`` under ParameterServerTrainer)."""
    return _current("strategy").strategy


def coordinator() -> Any:
    """The ``tf.distribute.coordinator.ClusterCoordinator`` of a ParameterServerTrainer's chief,
    already connected (``ClusterCoordinator(strategy)`` in ``train_fn`` returns the same one)."""
    session = _current("coordinator")
    if session.parameter_server is None:
        from raytf.errors import RaytfError

        raise RaytfError(
            "raytf.coordinator() exists only in a ParameterServerTrainer's train_fn, which runs on "
            "the chief; raytf.Trainer's workers use raytf.strategy()"
        )
    return session.parameter_server.coordinator


def get_dataset_shard(
    name: str = "train",
    *,
    batch_size: Optional[int] = None,
    global_batch_size: Optional[int] = None,
    features: Any = None,
    label: Optional[str] = None,
    shuffle: bool = False,
    seed: Optional[int] = None,
    drop_remainder: bool = False,
    cache: bool = True,
) -> Any:
    """This worker's shard of ``Trainer(datasets={name: ...})`` as a ``tf.data.Dataset``.

    ``batch_size`` is per worker; or pass ``global_batch_size`` and each of
    the ``world_size`` workers takes ``global_batch_size // world_size`` (for
    elastic runs that must keep the global batch when the group shrinks).
    ``features`` is one column (a tensor), a list
    of columns (a dict of tensors, for multi-input models) or None for every
    column but the label; ``label`` is optional. ``shuffle`` reshuffles every
    epoch, reproducibly when ``seed`` is set. ``cache=True`` reads the shard
    into memory once (fastest); ``cache=False`` streams it every epoch, for
    shards larger than memory. Every worker yields the same number of batches.
    """
    return _current("get_dataset_shard").get_dataset_shard(
        name,
        batch_size=batch_size,
        global_batch_size=global_batch_size,
        features=features,
        label=label,
        shuffle=shuffle,
        seed=seed,
        drop_remainder=drop_remainder,
        cache=cache,
    )


def report(metrics: dict[str, Any], checkpoint: Any = None, *, ranks: str = "chief") -> None:
    """Send metrics to the driver, which logs them and keeps rank 0's as the run's history.

    With ``checkpoint=raytf.Checkpoint.from_directory(d)`` (or ``from_state``) the
    chief's files are uploaded to the run's storage and committed. With
    ``CheckpointConfig(upload="async")``, the default, this returns once they are
    in host memory (``d`` may be deleted at once) and the upload and the commit go
    on in the background, one checkpoint at a time; with ``upload="sync"`` it
    returns only after the commit, so a checkpoint whose report returned is never
    lost. Include ``epoch`` and ``step`` in ``metrics`` to resume from them.

    What several ranks' checkpoints become depends on ``ranks``:

    - ``"chief"`` (default): under MultiWorkerMirroredStrategy every rank holds
      the same state, so only the chief's checkpoint is kept; other ranks may
      pass theirs (identical) too, and theirs are not uploaded. A rank other
      than the chief passing the only checkpoint saves nothing: use ``"all"``.
    - ``"all"``: a collective report, as Ray Train's ``report`` is. Every rank
      calls it at the same points (synchronous: it returns on each once every
      rank has reported and the checkpoint is committed; asynchronous: once this
      rank's files are in host memory); each rank's files are uploaded in parallel, and the driver
      merges them into one checkpoint directory and commits it, if any rank
      passed one. A file two ranks wrote with different contents is an error
      naming it; the same file from several ranks is kept once. For state
      that differs per rank (a rank's part of a table, its data position).
    """
    _current("report").report(metrics, checkpoint, ranks)


def all_reduce_gradients(gradients: Any, variables: Any = None) -> list:
    """Sum ``gradients`` across the workers, as the run's ``TensorflowConfig`` says to send them.

    For custom loops that all-reduce gradients themselves rather than through
    ``optimizer.apply_gradients`` (which already does this). Call it inside
    ``strategy.run``; it returns the summed gradients in ``gradients``' order and
    dtypes. With ``gradient_compression`` they travel in 16 bits; pass the
    ``variables`` (one per gradient) for ``error_feedback`` to keep each one's
    rounding residual. Without compression it is ``ReplicaContext.all_reduce(SUM, ...)``.
    """
    from raytf._internal.worker.compression import all_reduce_sum

    return all_reduce_sum(list(gradients), None if variables is None else list(variables))


def preemption_requested() -> bool:
    """Whether this run was asked to stop for a preemption, agreed by every rank.

    True once any rank's node is draining (Ray's drain notice, as autoscalers
    and spot-instance handlers send it) or any worker got SIGTERM. It runs one
    small all-reduce, so every rank must call it at the same points: every few
    dozen steps, or at each epoch's end. When it returns True, report a
    checkpoint (it is saved whatever CheckpointConfig.every_n_* says) and
    return from ``train_fn``: raytf restarts the group from that checkpoint,
    without counting a failure.
    """
    return _current("preemption_requested").preemption_requested()


def get_checkpoint() -> Any:
    """The committed checkpoint this attempt resumes from (with ``.epoch`` and
    ``.step``), or None on a fresh start."""
    return _current("get_checkpoint").get_checkpoint()

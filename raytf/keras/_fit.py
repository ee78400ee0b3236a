"""``raytf.keras.fit`` and ``evaluate``: a compiled Keras model (Keras 3 or tf-keras) trained on
this worker's shard with the model's own ``train_step`` under the strategy.

Keras 3's ``model.fit`` fails under MultiWorkerMirroredStrategy, and tf-keras's
works only when the per-worker dataset is handed over just so. This loop runs
``train_step`` and ``test_step`` (so the optimizer, loss, metrics and loss
scaling from ``compile`` all apply) with ``strategy.run``, reads the metrics
once per epoch across every worker, and drives the usual Keras callbacks.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import raytf.session as session
from raytf._internal.data.cursor import cursor_of
from raytf._internal.worker.session import current
from raytf.errors import RaytfError
from raytf.keras._local_sgd import average_weights
from raytf.keras._model import build_optimizer, check_accumulation_window, distribute, keras_of, restore

logger = logging.getLogger(__name__)


def _metrics(model: Any) -> dict[str, float]:
    """Every compiled metric as a float, summed over every worker (one all-reduce per variable).

    Keras keeps metric state in on-read-synchronized variables; read outside
    ``strategy.run`` they aggregate across all replicas. Every rank must call
    this at the same point.
    """
    logs = {}
    for name, value in model.get_metrics_result().items():
        try:
            logs[name] = float(value)
        except (TypeError, ValueError):
            logs[name] = value
    return logs


class _Steps:
    """The compiled step functions: ``steps_per_execution`` steps per call, fewer at the end."""

    def __init__(self, model: Any, steps_per_execution: int):
        import tensorflow as tf

        self.model = model
        strategy = session.strategy()

        def make(step_fn: Any) -> Any:
            @tf.function(reduce_retracing=True)
            def known(iterator: Any, steps: Any) -> Any:
                # The caller knows these steps exist: no end-of-data check, which under
                # MultiWorkerMirroredStrategy costs an all-reduce per step.
                for _ in tf.range(steps):
                    strategy.run(step_fn, args=(next(iterator),))
                return steps

            @tf.function(reduce_retracing=True)
            def unknown(iterator: Any, steps: Any) -> Any:
                ran = tf.constant(0)
                for _ in tf.range(steps):
                    optional = iterator.get_next_as_optional()  # agreed across workers
                    if not optional.has_value():
                        break
                    strategy.run(step_fn, args=(optional.get_value(),))
                    ran += 1
                return ran

            return known, unknown

        @tf.function
        def skip(iterator: Any, steps: Any) -> None:
            for _ in tf.range(steps):
                next(iterator)

        self._skip = skip
        self.train = make(lambda data: model.train_step(data))
        self.test = make(lambda data: model.test_step(data))
        self.steps_per_execution = steps_per_execution

    def skip(self, iterator: Any, steps: int) -> None:
        """Draw ``steps`` batches without training on them (already trained before a restart)."""
        import tensorflow as tf

        self._skip(iterator, tf.constant(steps))

    def epoch(self, functions: Any, iterator: Any, steps: Optional[int], on_begin: Any, on_end: Any) -> int:
        """Run ``steps`` steps, or to the end of ``iterator`` when None; returns the steps run."""
        import tensorflow as tf

        function = functions[0] if steps is not None else functions[1]
        done = 0
        while steps is None or done < steps:
            chunk = self.steps_per_execution if steps is None else min(self.steps_per_execution, steps - done)
            on_begin(done)
            ran = int(function(iterator, tf.constant(chunk)))
            if ran == 0:
                break
            done += ran
            on_end(done - 1)
            if ran < chunk or getattr(self.model, "stop_training", False):
                break
        return done


def fit(
    model: Any,
    dataset: Any,
    *,
    epochs: int = 1,
    initial_epoch: Optional[int] = None,
    validation_data: Any = None,
    callbacks: Optional[Sequence[Any]] = None,
    steps_per_epoch: Optional[int] = None,
    validation_steps: Optional[int] = None,
    steps_per_execution: int = 1,
    verbose: int = 0,
    distribute_fn: Callable[[Any], Any] = distribute,
) -> Any:
    """Train a compiled Keras model (Keras 3 or tf-keras) on this worker's shard; returns its History.

    ``dataset`` and ``validation_data`` are per-worker ``tf.data`` datasets
    (``raytf.get_dataset_shard``): each batch is this worker's share of the
    global batch. Every worker must run the same number of steps, which
    raytf's shards guarantee. ``initial_epoch=None`` resumes from
    ``raytf.get_checkpoint()`` when there is one (see :func:`restore`).
    ``steps_per_execution`` runs that many steps per call into TensorFlow,
    which cuts Python overhead when steps are short. ``distribute_fn`` hands
    a dataset to the strategy; pass ``raytf.strategy().experimental_distribute_dataset``
    for datasets of *global* batches (Keras's own meaning, which raytf's
    strategy keeps for everything but raytf's shards).

    Epoch logs (for History, EarlyStopping, ReduceLROnPlateau, ReportCallback)
    hold each metric over every worker's data; batch-level callbacks see
    ``{}``, since reading metrics across workers at every step would cost an
    all-reduce per step. Every rank sees the same epoch logs, so callbacks
    that stop training stop every rank at the same epoch.
    """
    keras = keras_of(model)
    from raytf._internal.hooks import tf_keras as tf_keras_hooks

    if not getattr(model, "compiled", None) and not tf_keras_hooks.is_compiled(model):
        raise RaytfError("raytf.keras.fit: compile the model first (under raytf.strategy().scope())")
    for name, value in (("epochs", epochs), ("steps_per_execution", steps_per_execution)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RaytfError(f"raytf.keras.fit: {name} must be an int >= 1, got {value!r}")
    resuming = initial_epoch is None
    if initial_epoch is None:
        initial_epoch = restore(model)
    else:
        build_optimizer(model)
    cursor = cursor_of(dataset)
    if steps_per_epoch is None:
        steps_per_epoch = _known_length(dataset) if cursor is None else cursor.full_steps()
    elif cursor is not None and steps_per_epoch != cursor.full_steps():
        logger.warning(
            "raytf.keras.fit: steps_per_epoch=%d is not the %d steps of an epoch of dataset %r; "
            "an epoch is then not one pass over it, and a resume cannot be exact",
            steps_per_epoch,
            cursor.full_steps(),
            cursor.name,
        )
    check_accumulation_window(model, steps_per_epoch)
    if cursor is not None:
        # A planned shard (DataConfig(exactly_once=True)) starts where the checkpoint's position says:
        # an interrupted epoch's first pass holds only what that epoch has not trained.
        skip, offset, first_steps = 0, 0, cursor.steps(initial_epoch)
    else:
        # A checkpoint taken mid-epoch (a preemption) records the steps done: skip their batches.
        skip = offset = _steps_done_in_epoch(model, initial_epoch, steps_per_epoch) if resuming else 0
        first_steps = None if steps_per_epoch is None else steps_per_epoch - skip
    if validation_steps is None and validation_data is not None:
        validation_steps = _known_length(validation_data)
    train_data = _Feed(dataset, steps_per_epoch, distribute_fn)
    val_data = _Feed(validation_data, validation_steps, distribute_fn) if validation_data is not None else None
    steps = _Steps(model, steps_per_execution)
    callback_list = keras.callbacks.CallbackList(
        list(callbacks or []),
        add_history=True,
        add_progbar=verbose != 0,
        model=model,
        verbose=verbose,
        epochs=epochs,
        steps=steps_per_epoch,
    )
    model.stop_training = False
    logs: dict[str, Any] = {}
    state = current("keras.fit")
    if cursor is not None:
        state.exact_resume.add(cursor.name)  # it runs an interrupted epoch's rest as its first epoch
    callback_list.on_train_begin()
    epoch_steps = first_steps
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        state.note_progress(epoch=epoch, epochs=epochs, step=offset, steps=steps_per_epoch)
        callback_list.on_epoch_begin(epoch)
        iterator = train_data.iterator()
        if skip:
            steps.skip(iterator, skip)

        def batch_end(step: int, epoch: int = epoch, offset: int = offset) -> None:
            callback_list.on_train_batch_end(step + offset, {})
            done = step + offset + 1
            state.note_progress(
                step=done, global_step=None if steps_per_epoch is None else epoch * steps_per_epoch + done
            )

        steps.epoch(
            steps.train,
            iterator,
            epoch_steps,
            lambda step: callback_list.on_train_batch_begin(step + offset),  # noqa: B023 - called in this epoch
            batch_end,
        )
        average_weights(model)  # local SGD: validation, callbacks and checkpoints see one model
        skip = offset = 0
        epoch_steps = steps_per_epoch
        if state.preempted:
            break  # a checkpoint of this step was reported; raytf restarts the group from it
        logs = _metrics(model)
        if val_data is not None:
            logs.update({f"val_{k}": v for k, v in _evaluate(model, steps, val_data, validation_steps).items()})
        callback_list.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callback_list.on_train_end(logs)
    return model.history


def _steps_done_in_epoch(model: Any, epoch: int, steps_per_epoch: Optional[int]) -> int:
    """Steps of ``epoch`` already trained, by the optimizer's count, when a restore left it mid-epoch."""
    optimizer = getattr(model, "optimizer", None)
    if steps_per_epoch is None or optimizer is None:
        return 0
    done = int(optimizer.iterations.numpy()) - epoch * steps_per_epoch
    return done if 0 < done < steps_per_epoch else 0


def _evaluate(model: Any, steps: _Steps, data: "_Feed", validation_steps: Optional[int]) -> dict[str, float]:
    model.reset_metrics()
    steps.epoch(steps.test, data.iterator(), validation_steps, lambda step: None, lambda step: None)
    return _metrics(model)


def evaluate(
    model: Any, dataset: Any, *, steps: Optional[int] = None, distribute_fn: Callable[[Any], Any] = distribute
) -> dict[str, float]:
    """The compiled loss and metrics of ``model`` over every worker's shard of ``dataset``."""
    steps = _known_length(dataset) if steps is None else steps
    average_weights(model)
    return _evaluate(model, _Steps(model, 1), _Feed(dataset, steps, distribute_fn), steps)


class _Feed:
    """Where each epoch's batches come from.

    With a known number of steps, one iterator over the repeated dataset
    serves every epoch, as tf-keras does: its prefetching runs across epoch
    boundaries, and a distributed iterator is not rebuilt each epoch, which
    measured twice as fast on W1. Otherwise, a fresh pass per epoch, run to
    its end.
    """

    def __init__(self, dataset: Any, steps: Optional[int], distribute_fn: Callable[[Any], Any] = distribute):
        self._dataset = dataset
        self._steps = steps
        self._distribute = distribute_fn  # per worker: the dataset holds this worker's batches
        self._repeated: Any = None

    def iterator(self) -> Any:
        if self._steps is None:
            return iter(self._distribute(self._dataset))
        if self._repeated is None:
            self._repeated = iter(self._distribute(self._dataset.repeat()))
        return self._repeated


def _known_length(dataset: Any) -> Optional[int]:
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None

"""Keras on raytf workers: one training loop for Keras 3 and tf-keras.

Keras 3's ``model.fit`` fails under MultiWorkerMirroredStrategy, and tf-keras's
works only when the per-worker dataset is handed over just so. :func:`fit`
runs the model's own ``train_step`` and ``test_step`` (so the optimizer, loss,
metrics and loss scaling from ``compile`` all apply) with ``strategy.run``,
reads the metrics once per epoch across every worker, and drives the usual
Keras callbacks. The same code trains a Keras 3 model or a tf-keras one.

    with raytf.strategy().scope():
        model = build_model()
        model.compile(optimizer="adam", loss=..., metrics=["accuracy"])
    history = raytf.keras.fit(model, raytf.get_dataset_shard("train", batch_size=128, ...),
                              epochs=10, validation_data=raytf.get_dataset_shard("val", ...),
                              callbacks=[keras.callbacks.EarlyStopping(), raytf.keras.ReportCallback()])

Everything here runs inside ``train_fn``; nothing imports TensorFlow before then.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from raytf._internal.worker import session as _session
from raytf.errors import RaytfError

logger = logging.getLogger(__name__)


def keras_of(model: Any) -> Any:
    """The Keras package ``model`` belongs to: ``tf_keras`` or Keras 3's ``keras``."""
    if any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__):
        import tf_keras

        return tf_keras
    import keras

    return keras


def is_tf_keras(model: Any) -> bool:
    return keras_of(model).__name__ == "tf_keras"


def distribute(dataset: Any) -> Any:
    """A per-worker ``tf.data.Dataset`` as the strategy's distributed dataset, batches as they are.

    Each worker's batches are its share of the global batch, which is what
    ``distribute_datasets_from_function`` expects; ``experimental_distribute_dataset``
    would instead treat each as the global batch and keep 1/num_workers of it.
    """
    strategy = _session.strategy()
    return strategy.distribute_datasets_from_function(lambda _: dataset)


def restore(model: Any) -> int:
    """Load the checkpoint this attempt resumes from into ``model`` and its optimizer.

    Returns the epoch to start at: the checkpoint's epoch plus one, or 0 on a
    fresh start. Works with checkpoints from :func:`ReportCallback` (or any
    ``Checkpoint.from_state(model=model, optimizer=model.optimizer)``).
    """
    checkpoint = _session.get_checkpoint()
    if checkpoint is None:
        return 0
    _build_optimizer(model)
    checkpoint.restore_state(**_state(model))
    return (checkpoint.epoch + 1) if checkpoint.epoch is not None else 0


def _state(model: Any) -> dict[str, Any]:
    state = {"model": model}
    if getattr(model, "optimizer", None) is not None:
        state["optimizer"] = model.optimizer
    return state


def _build_optimizer(model: Any) -> None:
    """Create the optimizer's variables now, so a restore fills them instead of deferring."""
    if not model.built:
        raise RaytfError(
            "raytf.keras: the model has no weights yet; give it an Input layer (or call it on a "
            "batch) before fit or restore"
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "built", True):
        return
    with _session.strategy().scope():
        optimizer.build(model.trainable_variables)


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
        strategy = _session.strategy()

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
) -> Any:
    """Train a compiled Keras model (Keras 3 or tf-keras) on this worker's shard; returns its History.

    ``dataset`` and ``validation_data`` are per-worker ``tf.data`` datasets
    (``raytf.get_dataset_shard``): each batch is this worker's share of the
    global batch. Every worker must run the same number of steps, which
    raytf's shards guarantee. ``initial_epoch=None`` resumes from
    ``raytf.get_checkpoint()`` when there is one (see :func:`restore`).
    ``steps_per_execution`` runs that many steps per call into TensorFlow,
    which cuts Python overhead when steps are short.

    Epoch logs (for History, EarlyStopping, ReduceLROnPlateau, ReportCallback)
    hold each metric over every worker's data; batch-level callbacks see
    ``{}``, since reading metrics across workers at every step would cost an
    all-reduce per step. Every rank sees the same epoch logs, so callbacks
    that stop training stop every rank at the same epoch.
    """
    keras = keras_of(model)
    if not getattr(model, "compiled", getattr(model, "_is_compiled", False)):
        raise RaytfError("raytf.keras.fit: compile the model first (under raytf.strategy().scope())")
    for name, value in (("epochs", epochs), ("steps_per_execution", steps_per_execution)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RaytfError(f"raytf.keras.fit: {name} must be an int >= 1, got {value!r}")
    resuming = initial_epoch is None
    if resuming:
        initial_epoch = restore(model)
    else:
        _build_optimizer(model)
    if steps_per_epoch is None:
        steps_per_epoch = _known_length(dataset)
    # A checkpoint taken mid-epoch (a preemption) records the steps done: skip their batches.
    skip = _steps_done_in_epoch(model, initial_epoch, steps_per_epoch) if resuming else 0
    if validation_steps is None and validation_data is not None:
        validation_steps = _known_length(validation_data)
    train_data = _Feed(dataset, steps_per_epoch)
    val_data = _Feed(validation_data, validation_steps) if validation_data is not None else None
    steps = _Steps(model, steps_per_execution)
    callback_list = keras.callbacks.CallbackList(
        list(callbacks or []), add_history=True, add_progbar=verbose != 0, model=model,
        verbose=verbose, epochs=epochs, steps=steps_per_epoch,
    )
    model.stop_training = False
    logs: dict[str, Any] = {}
    session = _session._current("keras.fit")
    callback_list.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        session.note_progress(epoch=epoch, epochs=epochs, step=skip, steps=steps_per_epoch)
        callback_list.on_epoch_begin(epoch)
        iterator = train_data.iterator()
        if skip:
            steps.skip(iterator, skip)

        def batch_end(step: int, epoch: int = epoch, skip: int = skip) -> None:
            callback_list.on_train_batch_end(step + skip, {})
            done = step + skip + 1
            session.note_progress(step=done, global_step=None if steps_per_epoch is None
                                  else epoch * steps_per_epoch + done)

        steps.epoch(
            steps.train, iterator, None if steps_per_epoch is None else steps_per_epoch - skip,
            lambda step: callback_list.on_train_batch_begin(step + skip), batch_end,
        )
        skip = 0
        if session.preempted:
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


def evaluate(model: Any, dataset: Any, *, steps: Optional[int] = None) -> dict[str, float]:
    """The compiled loss and metrics of ``model`` over every worker's shard of ``dataset``."""
    steps = _known_length(dataset) if steps is None else steps
    return _evaluate(model, _Steps(model, 1), _Feed(dataset, steps), steps)


class _Feed:
    """Where each epoch's batches come from.

    With a known number of steps, one iterator over the repeated dataset
    serves every epoch, as tf-keras does: its prefetching runs across epoch
    boundaries, and a distributed iterator is not rebuilt each epoch, which
    measured twice as fast on W1. Otherwise, a fresh pass per epoch, run to
    its end.
    """

    def __init__(self, dataset: Any, steps: Optional[int]):
        self._dataset = dataset
        self._steps = steps
        self._repeated: Any = None

    def iterator(self) -> Any:
        if self._steps is None:
            return iter(distribute(self._dataset))
        if self._repeated is None:
            self._repeated = iter(distribute(self._dataset.repeat()))
        return self._repeated


def _known_length(dataset: Any) -> Optional[int]:
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None


_report_classes: dict[str, type] = {}


def ReportCallback(  # noqa: N802 - used like a class
    *,
    checkpoint: bool = True,
    metrics: Optional[Sequence[str]] = None,
    preemption_check_every: Optional[int] = 20,
    keras: Any = None,
) -> Any:
    """A Keras callback that reports each epoch's logs to the driver, with a checkpoint,
    and checkpoints and stops when the run is preempted.

    At every epoch end it calls ``raytf.report`` with the epoch logs (or only
    ``metrics``), ``epoch`` (the run's: counted on across ``fit`` calls, so
    code that calls ``fit`` once per epoch reports 0, 1, 2, ...) and ``step``
    (the optimizer's iterations), and,
    with ``checkpoint=True``, ``Checkpoint.from_state(model=..., optimizer=...)``,
    thinned by ``CheckpointConfig.every_n_epochs``. :func:`restore` (and
    :func:`fit` by default) resumes from it.

    Every ``preemption_check_every`` batch ends (each one call into
    TensorFlow: ``steps_per_execution`` steps) it asks
    ``raytf.preemption_requested()``; once a node is draining or a worker got
    SIGTERM, it reports a checkpoint of the current step and stops training.
    :func:`fit` resumes from that step (tf-keras's ``model.fit`` restarts the
    interrupted epoch). ``None`` turns the check off.

    Works with Keras 3 and tf-keras (``keras`` picks the package; default: the
    one ``tf.keras`` is here), in ``raytf.keras.fit`` and in tf-keras's own
    ``model.fit``. Every rank must use it, with the same settings: checkpoints
    are written and preemption agreed by every rank.
    """
    if keras is None:
        import tensorflow as tf

        keras = tf.keras
    name = keras.__name__.split(".")[0]
    if name not in _report_classes:
        _report_classes[name] = _make_report_class(keras)
    if preemption_check_every is not None and (
        isinstance(preemption_check_every, bool) or not isinstance(preemption_check_every, int)
        or preemption_check_every < 1
    ):
        raise RaytfError(
            f"raytf.keras.ReportCallback: preemption_check_every must be an int >= 1 or None, got "
            f"{preemption_check_every!r}"
        )
    return _report_classes[name](checkpoint=checkpoint, metrics=metrics, check_every=preemption_check_every)


def _make_report_class(keras: Any) -> type:
    from raytf.checkpoint import Checkpoint

    class ReportCallback(keras.callbacks.Callback):
        def __init__(self, checkpoint: bool = True, metrics: Optional[Sequence[str]] = None,
                     check_every: Optional[int] = 20):
            super().__init__()
            self.save = checkpoint
            self.names = list(metrics) if metrics is not None else None
            self.check_every = check_every
            self.batch_ends = 0
            self.preempted = False

        def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
            session = _session._current("keras.ReportCallback")
            in_progress = epoch if epoch > session.keras_epoch else session.keras_epoch + 1
            total = self.params.get("epochs")
            session.note_progress(epoch=in_progress, step=0, steps=self.params.get("steps"),
                                  epochs=total if total and total > in_progress else None)

        def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
            self.batch_ends += 1
            _session._current("keras.ReportCallback").note_progress(step=batch + 1)
            if self.check_every is None or self.preempted or self.batch_ends % self.check_every:
                return
            if _session.preemption_requested():  # the same answer on every rank
                self.preempted = True
                step = int(self.model.optimizer.iterations.numpy())
                # "epoch" is the last completed one: resuming continues this one at "step".
                session = _session._current("keras.ReportCallback")
                _session.report({"epoch": session.keras_epoch, "step": step, "preempted_at_step": step},
                                checkpoint=Checkpoint.from_state(**_state(self.model)))
                self.model.stop_training = True

        def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
            if self.preempted:
                return  # stopped mid-epoch: its checkpoint is already reported
            logs = dict(logs or {})
            if self.names is not None:
                logs = {k: logs[k] for k in self.names if k in logs}
            optimizer = getattr(self.model, "optimizer", None)
            step = int(optimizer.iterations.numpy()) if optimizer is not None else None
            state = Checkpoint.from_state(**_state(self.model)) if self.save else None
            run_epoch = _session._current("keras.ReportCallback").end_keras_epoch(epoch)
            _session.report({**logs, "epoch": run_epoch, "step": step}, checkpoint=state)  # report() makes them plain

    return ReportCallback


def accumulate_gradients(model: Any, micro_batches: int) -> Any:
    """Make each training step split its batch into ``micro_batches`` parts and apply one update.

    The gradients of the parts are summed (each weighted by its share of the
    batch), so a step on a batch of K x b rows updates the weights as one step
    on the whole batch would, with the activation memory of b rows. Pair it
    with ``get_dataset_shard(batch_size=K * b, drop_remainder=True)``: the
    batch must divide into equal parts. Works for Keras 3 and tf-keras, in
    :func:`fit` and in tf-keras's ``model.fit``. Returns ``model``.
    """
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise RaytfError(f"raytf.keras.accumulate_gradients: micro_batches must be an int >= 1, got {micro_batches!r}")
    model.train_step = _accumulating_train_step(model, micro_batches)
    if hasattr(model, "train_function"):
        model.train_function = None  # rebuilt around the new step
    return model


def _accumulating_train_step(model: Any, k: int) -> Any:
    import tensorflow as tf

    keras = keras_of(model)
    legacy = keras.__name__ == "tf_keras"
    if legacy:
        unpack = keras.utils.unpack_x_y_sample_weight
    else:
        from keras.src.losses import loss as loss_module

        unpack = keras.utils.unpack_x_y_sample_weight

    def part(value: Any, index: int) -> Any:
        if value is None:
            return None

        def cut(t: Any) -> Any:
            size = tf.shape(t)[0] // k
            return t[index * size:(index + 1) * size]

        return tf.nest.map_structure(cut, value)

    def train_step(data: Any) -> Any:
        x, y, sample_weight = unpack(data)
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        tf.debugging.assert_equal(
            rows % k, 0,
            message=f"raytf.keras.accumulate_gradients: the batch does not split into {k} equal parts; "
                    f"use a batch size divisible by {k} and drop_remainder=True",
        )
        variables = model.trainable_variables
        optimizer = model.optimizer
        total = [tf.zeros_like(v) for v in variables]
        for index in range(k):
            xi, yi, wi = part(x, index), part(y, index), part(sample_weight, index)
            with tf.GradientTape() as tape:
                y_pred = model(xi, training=True)
                if legacy:
                    loss = model.compute_loss(xi, yi, y_pred, wi)
                    scaled = optimizer.get_scaled_loss(loss / k) if hasattr(optimizer, "get_scaled_loss") else loss / k
                else:
                    loss = model.compute_loss(x=xi, y=yi, y_pred=y_pred, sample_weight=wi, training=True)
                    tracker = getattr(model, "_loss_tracker", None)
                    if tracker is not None:
                        tracker.update_state(
                            loss_module.unscale_loss_for_distribution(loss),
                            sample_weight=tf.shape(tf.nest.flatten(xi)[0])[0],
                        )
                    scaled = optimizer.scale_loss(loss / k)
            grads = tape.gradient(scaled, variables)
            if legacy and hasattr(optimizer, "get_unscaled_gradients"):
                grads = optimizer.get_unscaled_gradients(grads)
            total = [t + g for t, g in zip(total, grads)]
            model.compute_metrics(xi, yi, y_pred, wi)
        optimizer.apply_gradients(zip(total, variables))
        return model.get_metrics_result()

    return train_step

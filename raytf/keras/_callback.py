"""``raytf.keras.ReportCallback``: each epoch's logs reported with a checkpoint; a preemption
checkpointed at the current step.

Keras 3 and tf-keras each have their own ``Callback`` base class, and their
fit loops want an instance of theirs. ``ReportCallback(...)`` therefore makes
an instance of a class derived from both ``ReportCallback`` and the base of
the Keras in use (made once per Keras): ``isinstance(cb, ReportCallback)``
holds, and so does ``isinstance(cb, keras.callbacks.Callback)``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import raytf.session as session
from raytf._internal.checkpoint.state import prewarm
from raytf._internal.data.cursor import last_iterated
from raytf._internal.protocol import CheckpointUpload
from raytf._internal.worker.session import current
from raytf.checkpoint import Checkpoint
from raytf.errors import RaytfError
from raytf.keras._local_sgd import average_weights
from raytf.keras._model import state_of

logger = logging.getLogger(__name__)
_concrete: dict[tuple[type, type], type] = {}  # (ReportCallback or a subclass, Keras Callback base) -> both


class ReportCallback:
    """A Keras callback that reports each epoch's logs to the driver, with a checkpoint,
    and checkpoints and stops when the run is preempted.

    At every epoch end it calls ``raytf.report`` with the epoch logs (or only
    ``metrics``), ``epoch`` (the run's: counted on across ``fit`` calls, so
    code that calls ``fit`` once per epoch reports 0, 1, 2, ...) and ``step``
    (the optimizer's iterations), and, with ``checkpoint=True``,
    ``Checkpoint.from_state(model=..., optimizer=...)``, thinned by
    ``CheckpointConfig.every_n_epochs``. ``raytf.keras.restore`` (and
    ``raytf.keras.fit`` by default) resumes from it.

    Every ``preemption_check_every`` batch ends (each one call into
    TensorFlow: ``steps_per_execution`` steps) it asks
    ``raytf.preemption_requested()``; once a node is draining or a worker got
    SIGTERM, it reports a checkpoint of the current step and stops training.
    The checkpoint records where the epoch's data stood (a split dataset of
    ``DataConfig(exactly_once=True)``): ``raytf.keras.fit``, and tf-keras's own
    ``model.fit`` started at ``initial_epoch=raytf.keras.restore(model)``, then
    train the rest of the interrupted epoch as their first epoch. ``None``
    turns the check off.

    Works with Keras 3 and tf-keras (``keras`` picks the package; default: the
    one ``tf.keras`` is here), in ``raytf.keras.fit`` and in tf-keras's own
    ``model.fit``. Every rank must use it, with the same settings: checkpoints
    are written and preemption agreed by every rank.
    """

    # Set by Keras: the class is made a subclass of Keras's Callback when made (__new__).
    model: Any
    params: dict

    def __new__(cls, *args: Any, keras: Any = None, **kwargs: Any) -> "ReportCallback":
        if keras is None:
            import tensorflow as tf

            keras = tf.keras
        base = keras.callbacks.Callback
        if issubclass(cls, base):
            return object.__new__(cls)
        if (cls, base) not in _concrete:  # per class: ReportCheckpointCallback is one of its own
            _concrete[cls, base] = type(cls.__name__, (cls, base), {"__module__": cls.__module__})
        return object.__new__(_concrete[cls, base])

    def __init__(
        self,
        *,
        checkpoint: bool = True,
        metrics: Optional[Sequence[str]] = None,
        preemption_check_every: Optional[int] = 20,
        keras: Any = None,
    ):
        if preemption_check_every is not None and (
            isinstance(preemption_check_every, bool)
            or not isinstance(preemption_check_every, int)
            or preemption_check_every < 1
        ):
            raise RaytfError(
                f"raytf.keras.ReportCallback: preemption_check_every must be an int >= 1 or None, got "
                f"{preemption_check_every!r}"
            )
        super().__init__()  # the Keras Callback's
        self._save = checkpoint
        self._names = list(metrics) if metrics is not None else None
        self._check_every = preemption_check_every
        self._batch_ends = 0
        self._preempted = False
        self._training_data: Optional[str] = None  # the planned dataset the fit loop trains from (its name)

    def _implements_train_batch_hooks(self) -> bool:
        # tf-keras refuses batch-level callbacks under ParameterServerStrategy (batches run on the
        # workers, asynchronously); there the preemption check happens at each epoch's end instead.
        return not _parameter_server()

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        state = current("keras.ReportCallback")
        self._training_data = last_iterated(state.cursors)  # the fit loop made its iterator just now
        in_progress = epoch if epoch > state.keras_epoch else state.keras_epoch + 1
        total = self.params.get("epochs")
        state.note_progress(
            epoch=in_progress,
            step=0,
            steps=self.params.get("steps"),
            epochs=total if total and total > in_progress else None,
        )

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        self._batch_ends += 1
        state = current("keras.ReportCallback")
        state.note_progress(step=batch + 1)
        if self._batch_ends == 1 and self._save and state.upload is CheckpointUpload.ASYNC:
            prewarm(state_of(self.model))  # the optimizer's slots exist from the first step on
        if self._check_every is None or self._preempted or self._batch_ends % self._check_every:
            return
        if session.preemption_requested():  # the same answer on every rank
            self._preempted = True
            if not state.exact_resume and self._training_data is not None:  # tf-keras's own fit: its data
                state.exact_resume.add(self._training_data)  # resumes at this step too
            step = int(self.model.optimizer.iterations.numpy())
            average_weights(self.model)  # local SGD: the checkpoint holds the averaged model
            # "epoch" is the last completed one: resuming continues this one at "step".
            session.report(
                {"epoch": state.keras_epoch, "step": step, "preempted_at_step": step},
                checkpoint=Checkpoint.from_state(**state_of(self.model)),
            )
            self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self._preempted:
            return  # stopped mid-epoch: its checkpoint is already reported
        self._after_a_resumed_epoch(epoch)
        if _parameter_server() and self._check_every is not None and session.preemption_requested():
            self.model.stop_training = True  # this epoch's checkpoint, reported below, is the last
        logs = dict(logs or {})
        if self._names is not None:
            logs = {k: logs[k] for k in self._names if k in logs}
        optimizer = getattr(self.model, "optimizer", None)
        step = int(optimizer.iterations.numpy()) if optimizer is not None else None
        if self._save:
            average_weights(self.model)  # every rank checkpoints here: local SGD's model is averaged first
        saved = Checkpoint.from_state(**state_of(self.model)) if self._save else None
        run_epoch = current("keras.ReportCallback").end_keras_epoch(epoch)
        session.report({**logs, "epoch": run_epoch, "step": step}, checkpoint=saved)  # report() makes them plain

    def _after_a_resumed_epoch(self, epoch: int) -> None:
        """tf-keras's own fit, resumed in mid-epoch, has trained the rest of that epoch, shorter than
        a whole one: it must count the next epoch's steps again, not take this one's length."""
        state = current("keras.ReportCallback")
        cursor = state.cursors.get(self._training_data) if self._training_data is not None else None
        if (
            cursor is None
            or self._training_data in state.exact_resume
            or cursor.start.epoch != epoch
            or cursor.start.is_fresh(cursor.rows)
        ):
            return
        from raytf._internal import hooks
        from raytf._internal.hooks import tf_keras as tf_keras_hooks

        hooks.require("tf_keras.fit_data_handler")
        if not tf_keras_hooks.forget_epoch_length():
            logger.warning(
                "raytf.keras.ReportCallback: the model.fit running now did not resume dataset %r's "
                "interrupted epoch through tf-keras's data handler; later epochs may be cut short",
                self._training_data,
            )


def _parameter_server() -> bool:
    """Whether this callback runs on a ParameterServerTrainer's chief."""
    from raytf._internal.worker.session import _session

    return _session is not None and _session.parameter_server is not None

"""What raytf.keras's features share: which Keras a model is, handing a shard to the strategy,
and restoring a model and its optimizer from the run's checkpoint."""

from __future__ import annotations

from typing import Any, Callable, Optional

import raytf.session as session
from raytf.errors import RaytfError


def keras_of(model: Any) -> Any:
    """The Keras package ``model`` belongs to: ``tf_keras`` or Keras 3's ``keras``."""
    if any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__):
        import tf_keras

        return tf_keras
    import keras

    return keras


_TRAIN_STEP = "_raytf_train_step"  # which raytf.keras feature replaced the model's train step
ACCUMULATE_STEPS = "_raytf_accumulate_steps"  # accumulate_gradients(steps=K): K


def claim_train_step(model: Any, feature: str, call: str) -> None:
    """Mark ``model``'s train step as replaced by ``call`` (e.g. "local_sgd(steps=3)"). Each such
    feature replaces the whole step, so a model that another one already replaced is refused:
    applied silently, the second would undo the first."""
    current = getattr(model, _TRAIN_STEP, None)
    if current is not None and current != call:
        raise RaytfError(
            f"raytf.keras.{feature}: the model already trains with raytf.keras.{current}; each of "
            "accumulate_gradients and local_sgd replaces the model's train step, and they do not combine "
            "(nor does one with other arguments): apply one of them, once, to a freshly compiled model"
        )
    setattr(model, _TRAIN_STEP, call)


def check_accumulation_window(model: Any, steps_per_epoch: Optional[int]) -> None:
    """Refuse ``accumulate_gradients(steps=K)`` with K past an epoch's steps, which would update the
    model less than once an epoch, or never (called when fit knows its steps per epoch)."""
    k = getattr(model, ACCUMULATE_STEPS, None)
    if k is None or steps_per_epoch is None or k <= steps_per_epoch:
        return
    raise RaytfError(
        f"raytf.keras.accumulate_gradients(steps={k}): an epoch here has {steps_per_epoch} steps, so the "
        f"model would be updated less than once an epoch, or never; use steps <= {steps_per_epoch}"
    )


def add_fit_callback(model: Any, name: str, make: Callable[[], Any]) -> None:
    """From now on, tf-keras's ``model.fit`` on ``model`` runs with ``make()`` first in its callbacks
    (added once per ``name``)."""
    fit = model.fit
    added = getattr(fit, "_raytf_callbacks", ())
    if name in added:
        return

    def fit_with_callback(*args: Any, **kwargs: Any) -> Any:
        first = make()
        if len(args) > 5:  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
            args = (*args[:5], [first, *(args[5] or [])], *args[6:])
        else:
            kwargs["callbacks"] = [first, *(kwargs.get("callbacks") or [])]
        return fit(*args, **kwargs)

    fit_with_callback._raytf_callbacks = (*added, name)  # type: ignore[attr-defined]
    model.fit = fit_with_callback


def distribute(dataset: Any) -> Any:
    """A per-worker ``tf.data.Dataset`` as the strategy's distributed dataset, batches as they are.

    Each worker's batches are its share of the global batch, which is what
    ``distribute_datasets_from_function`` expects; ``experimental_distribute_dataset``
    would instead treat each as the global batch and keep 1/num_workers of it.
    """
    strategy = session.strategy()
    return strategy.distribute_datasets_from_function(lambda _: dataset)


def restore(model: Any) -> int:
    """Load the checkpoint this attempt resumes from into ``model`` and its optimizer.

    Returns the epoch to start at: the checkpoint's epoch plus one, or 0 on a
    fresh start. Works with checkpoints from :func:`ReportCallback` (or any
    ``Checkpoint.from_state(model=model, optimizer=model.optimizer)``).
    """
    checkpoint = session.get_checkpoint()
    if checkpoint is None:
        return 0
    build_optimizer(model)
    checkpoint.restore_state(**state_of(model))
    return (checkpoint.epoch + 1) if checkpoint.epoch is not None else 0


def state_of(model: Any) -> dict[str, Any]:
    state = {"model": model}
    if getattr(model, "optimizer", None) is not None:
        state["optimizer"] = model.optimizer
    return state


def build_optimizer(model: Any) -> None:
    """Create the optimizer's variables now, so a restore fills them instead of deferring."""
    if not model.built:
        raise RaytfError(
            "raytf.keras: the model has no weights yet; give it an Input layer (or call it on a "
            "batch) before fit or restore"
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or getattr(optimizer, "built", True):
        return
    with session.strategy().scope():
        optimizer.build(model.trainable_variables)

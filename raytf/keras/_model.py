"""What raytf.keras's features share: which Keras a model is, handing a shard to the strategy,
and restoring a model and its optimizer from the run's checkpoint."""

from __future__ import annotations

from typing import Any

import raytf.session as session
from raytf.errors import RaytfError


def keras_of(model: Any) -> Any:
    """The Keras package ``model`` belongs to: ``tf_keras`` or Keras 3's ``keras``."""
    if any(c.__module__.split(".")[0] == "tf_keras" for c in type(model).__mro__):
        import tf_keras

        return tf_keras
    import keras

    return keras


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

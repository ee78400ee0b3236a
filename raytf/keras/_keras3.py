"""Keras 3's own ``model.fit`` and ``model.evaluate`` on raytf's workers.

Under MultiWorkerMirroredStrategy Keras 3's ``fit`` fails ("Attempt to
convert a value (PerReplica...)"), which is why Ray Train cannot run Keras 3.
On a raytf worker, ``fit`` and ``evaluate`` of a model built under raytf's
strategy run through ``raytf.keras.fit`` / ``evaluate`` instead, with Keras's
meaning of the data kept: a dataset holds global batches, which the strategy
splits across the workers, except a raytf shard, which holds this worker's.
Models built under no strategy or another one are left to Keras.
"""

from __future__ import annotations

from typing import Any

from raytf.errors import RaytfError

_UNSUPPORTED_FIT = {
    "y": None,
    "batch_size": None,
    "validation_split": 0.0,
    "class_weight": None,
    "sample_weight": None,
    "validation_batch_size": None,
    "validation_freq": 1,
}


def on_strategy(strategy: Any, keras3: bool) -> None:
    """A raytf worker plugin (RunSpec.plugins): once the worker's strategy is up, route Keras 3's
    fit through raytf where Keras 3 is the Keras in use."""
    if keras3:
        install(strategy)


_strategy: Any = None  # the worker's strategy now (a process kept for the next attempt gets a new one)


def install(strategy: Any) -> None:
    """Route Keras 3's fit and evaluate through raytf for models built under ``strategy`` (from now
    on: the worker's strategy of a later attempt replaces it)."""
    import keras

    global _strategy
    if not keras.__version__.startswith("3"):
        return
    _strategy = strategy
    if getattr(keras.Model.fit, "_raytf", False):
        return
    original_fit, original_evaluate = keras.Model.fit, keras.Model.evaluate

    def fit(
        self: Any,
        x: Any = None,
        y: Any = None,
        batch_size: Any = None,
        epochs: int = 1,
        verbose: Any = "auto",
        callbacks: Any = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool = True,
        class_weight: Any = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: Any = None,
        validation_steps: Any = None,
        validation_batch_size: Any = None,
        validation_freq: int = 1,
    ) -> Any:
        strategy = _strategy
        given = dict(
            y=y,
            batch_size=batch_size,
            validation_split=validation_split,
            class_weight=class_weight,
            sample_weight=sample_weight,
            validation_batch_size=validation_batch_size,
            validation_freq=validation_freq,
        )
        if self.distribute_strategy is not strategy:
            return original_fit(
                self,
                x,
                epochs=epochs,
                verbose=verbose,
                callbacks=callbacks,
                validation_data=validation_data,
                shuffle=shuffle,
                initial_epoch=initial_epoch,
                steps_per_epoch=steps_per_epoch,
                validation_steps=validation_steps,
                **given,
            )
        _check(x, {k: v for k, v in given.items() if _given(v, _UNSUPPORTED_FIT[k])}, "fit")
        from raytf.keras._fit import fit as raytf_fit

        return raytf_fit(
            self,
            x,
            epochs=epochs,
            initial_epoch=initial_epoch,
            validation_data=validation_data,
            callbacks=callbacks,
            steps_per_epoch=steps_per_epoch,
            validation_steps=validation_steps,
            verbose=0 if verbose in (0, "auto") else 1,
            distribute_fn=strategy.experimental_distribute_dataset,
        )

    def evaluate(
        self: Any,
        x: Any = None,
        y: Any = None,
        batch_size: Any = None,
        verbose: Any = "auto",
        sample_weight: Any = None,
        steps: Any = None,
        callbacks: Any = None,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> Any:
        strategy = _strategy
        if self.distribute_strategy is not strategy:
            return original_evaluate(
                self,
                x,
                y,
                batch_size=batch_size,
                verbose=verbose,
                sample_weight=sample_weight,
                steps=steps,
                callbacks=callbacks,
                return_dict=return_dict,
                **kwargs,
            )
        _check(
            x,
            {k: v for k, v in dict(y=y, batch_size=batch_size, sample_weight=sample_weight).items() if v is not None},
            "evaluate",
        )
        from raytf.keras._fit import evaluate as raytf_evaluate

        logs = raytf_evaluate(self, x, steps=steps, distribute_fn=strategy.experimental_distribute_dataset)
        return logs if return_dict else [logs[k] for k in logs]

    fit._raytf = evaluate._raytf = True  # type: ignore[attr-defined]
    keras.Model.fit, keras.Model.evaluate = fit, evaluate


def _given(value: Any, default: Any) -> bool:
    """Whether a fit argument was passed: by identity for None, by value only for plain numbers (the
    arrays of ``fit(x, y)`` have no truth value, and that call must meet ``_check``'s error)."""
    if default is None:
        return value is not None
    return not (isinstance(value, (int, float)) and value == default)


def _check(x: Any, unsupported: dict[str, Any], method: str) -> None:
    import tensorflow as tf

    if not isinstance(x, tf.data.Dataset):
        raise RaytfError(
            f"model.{method} on a raytf worker takes a tf.data.Dataset (raytf.get_dataset_shard, or your own), "
            f"got {type(x).__name__}: arrays would be cut into global batches on every worker alike"
        )
    if unsupported:
        raise RaytfError(
            f"model.{method} on a raytf worker runs through raytf.keras.{method}, which takes the data as a "
            f"dataset of (x, y) batches; drop {', '.join(sorted(unsupported))} (batch and weight in the dataset)"
        )

"""``raytf.keras.accumulate_gradients``: several batches' gradients, one update.

Two modes, both applying the summed gradients of K parts as one update:

- ``micro_batches=K`` saves memory: each step's batch is cut into K equal
  parts whose gradients are summed locally, so the weights move as one step
  on the whole batch would, with the activation memory of one part.
- ``steps=K`` saves bandwidth: each step adds its batch's gradients to a
  local accumulator on its own worker, and only every K-th step all-reduces
  the sum (once) and applies it. Bytes all-reduced per sample drop K-fold.
  The update is one step on the K batches together: a K times larger
  effective batch, with K times fewer updates per epoch (scale the learning
  rate or the epochs as for a larger batch).
"""

from __future__ import annotations

from typing import Any, Optional

from raytf._internal.worker.compression import replica_local
from raytf.errors import RaytfError
from raytf.keras._model import ACCUMULATE_STEPS, add_fit_callback, check_accumulation_window, claim_train_step, keras_of


def accumulate_gradients(model: Any, micro_batches: Optional[int] = None, *, steps: Optional[int] = None) -> Any:
    """Make ``model`` apply one update per K parts: ``micro_batches=K`` or ``steps=K``.

    ``micro_batches=K``: each step splits its batch into K parts and sums their
    gradients (each weighted by its share), so a step on a batch of K x b rows
    updates the weights as one step on the whole batch would, with the
    activation memory of b rows. Pair it with
    ``get_dataset_shard(batch_size=K * b, drop_remainder=True)``: the batch must
    divide into equal parts.

    ``steps=K``: each step's gradients are added up locally on its worker, and
    every K-th step all-reduces the sum once and applies it (the mean over the
    K batches), so the workers exchange gradients K times less often. The
    update equals one step on the K batches together; the optimizer steps (and
    ``optimizer.iterations``) once per K training steps. A partly accumulated
    sum is not checkpointed: a run resumed mid-way starts a fresh one. K may
    not exceed the steps of an epoch (fit refuses it: the model would be
    updated less than once an epoch, or never).

    A model takes one of ``accumulate_gradients`` and ``local_sgd``, once:
    each replaces the train step, so a second is refused rather than silently
    replacing the first.

    Works for Keras 3 and tf-keras, in ``raytf.keras.fit`` and in tf-keras's
    ``model.fit``. Returns ``model``.
    """
    if (micro_batches is None) == (steps is None):
        raise RaytfError(
            "raytf.keras.accumulate_gradients: pass micro_batches=K (split each batch, to save memory) "
            "or steps=K (all-reduce every K steps, to save bandwidth), one of the two"
        )
    k = micro_batches if steps is None else steps
    name = "micro_batches" if steps is None else "steps"
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RaytfError(f"raytf.keras.accumulate_gradients: {name} must be an int >= 1, got {k!r}")
    claim_train_step(model, "accumulate_gradients", f"accumulate_gradients({name}={k})")
    model.train_step = _accumulating_train_step(model, k) if steps is None else _deferred_train_step(model, k)
    if steps is not None:
        setattr(model, ACCUMULATE_STEPS, k)
        if keras_of(model).__name__ == "tf_keras":  # raytf.keras.fit checks it itself
            add_fit_callback(model, "accumulate_gradients", lambda: _window_check(model))
    if hasattr(model, "train_function"):
        model.train_function = None  # rebuilt around the new step
    return model


def _window_check(model: Any) -> Any:
    """A callback that refuses, as tf-keras's fit begins, an accumulation window past an epoch."""

    base: Any = keras_of(model).callbacks.Callback  # Keras 3's or tf-keras's, as the model's

    class CheckAccumulationWindow(base):
        def on_train_begin(self, logs: Any = None) -> None:
            check_accumulation_window(model, self.params.get("steps"))

    return CheckAccumulationWindow()


class _Loss:
    """One part's loss, scaled for the optimizer, and its gradients, in either Keras."""

    def __init__(self, model: Any):
        keras = keras_of(model)
        self.model = model
        self.legacy = keras.__name__ == "tf_keras"
        self.unpack = keras.utils.unpack_x_y_sample_weight
        # Keras 3 reports the loss through the model's metric named "loss" (its first), which its
        # own train_step updates with the loss before it was scaled for the replicas.
        self.loss_metric = None if self.legacy else next((m for m in model.metrics if m.name == "loss"), None)

    def gradients(self, x: Any, y: Any, sample_weight: Any, share: float) -> tuple[Any, list]:
        """(predictions, unscaled gradients of the loss / share) for one part."""
        import tensorflow as tf

        model, optimizer = self.model, self.model.optimizer
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            if self.legacy:
                loss = model.compute_loss(x, y, y_pred, sample_weight)
                scaled = (
                    optimizer.get_scaled_loss(loss / share) if hasattr(optimizer, "get_scaled_loss") else loss / share
                )
            else:
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
                if self.loss_metric is not None:
                    replicas = tf.distribute.get_strategy().num_replicas_in_sync
                    self.loss_metric.update_state(
                        loss * tf.cast(replicas, loss.dtype), sample_weight=tf.shape(tf.nest.flatten(x)[0])[0]
                    )
                scaled = optimizer.scale_loss(loss / share)
        grads = tape.gradient(scaled, model.trainable_variables)
        if self.legacy and hasattr(optimizer, "get_unscaled_gradients"):
            grads = optimizer.get_unscaled_gradients(grads)
        return y_pred, grads


def _accumulating_train_step(model: Any, k: int) -> Any:
    import tensorflow as tf

    losses = _Loss(model)

    def part(value: Any, index: int) -> Any:
        if value is None:
            return None

        def cut(t: Any) -> Any:
            size = tf.shape(t)[0] // k
            return t[index * size : (index + 1) * size]

        return tf.nest.map_structure(cut, value)

    def train_step(data: Any) -> Any:
        x, y, sample_weight = losses.unpack(data)
        rows = tf.shape(tf.nest.flatten(x)[0])[0]
        tf.debugging.assert_equal(
            rows % k,
            0,
            message=f"raytf.keras.accumulate_gradients: the batch does not split into {k} equal parts; "
            f"use a batch size divisible by {k} and drop_remainder=True",
        )
        variables = model.trainable_variables
        total = [tf.zeros_like(v) for v in variables]
        for index in range(k):
            xi, yi, wi = part(x, index), part(y, index), part(sample_weight, index)
            y_pred, grads = losses.gradients(xi, yi, wi, k)
            total = [t + g for t, g in zip(total, grads)]
            model.compute_metrics(xi, yi, y_pred, wi)
        model.optimizer.apply_gradients(zip(total, variables))
        return model.get_metrics_result()

    return train_step


def _deferred_train_step(model: Any, k: int) -> Any:
    import tensorflow as tf

    losses = _Loss(model)
    state: dict[str, Any] = {}

    def accumulators(variables: list) -> tuple[list, Any]:
        if "sums" not in state:  # made once, on the first trace; each worker's own
            state["sums"] = [
                replica_local(lambda v=v: tf.zeros(v.shape, v.dtype), "raytf_accumulated_gradient") for v in variables
            ]
            state["count"] = replica_local(lambda: tf.constant(0, tf.int64), "raytf_accumulated_steps")
        return state["sums"], state["count"]

    def train_step(data: Any) -> Any:
        x, y, sample_weight = losses.unpack(data)
        variables = model.trainable_variables
        sums, count = accumulators(variables)
        y_pred, grads = losses.gradients(x, y, sample_weight, k)
        for total, grad in zip(sums, grads):
            if grad is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        steps = count.assign_add(1)

        def apply() -> Any:
            model.optimizer.apply_gradients(zip([total.read_value() for total in sums], variables))
            return tf.group([total.assign(tf.zeros_like(total)) for total in sums])  # after the reads above

        def maybe_apply(strategy: Any, due: Any) -> None:
            # In cross-replica context: the optimizer's own synchronization (its all-reduce and
            # merge_call) cannot sit inside a tf.cond in a replica, but a strategy.run inside a
            # tf.cond here can. Every worker is on the same step, so all take the branch together.
            tf.cond(due, lambda: tf.group(strategy.run(apply)), tf.no_op)

        tf.distribute.get_replica_context().merge_call(maybe_apply, args=(steps % k == 0,))
        model.compute_metrics(x, y, y_pred, sample_weight)
        return model.get_metrics_result()

    return train_step

"""``raytf.keras.accumulate_gradients``: K micro-batches per step, one update.

The step's batch is cut into K equal parts; each part's gradients (weighted by
its share) are summed and applied once, so the weights move as one step on the
whole batch would move them, with the activation memory of one part.
"""

from __future__ import annotations

from typing import Any

from raytf.errors import RaytfError
from raytf.keras._model import keras_of


def accumulate_gradients(model: Any, micro_batches: int) -> Any:
    """Make each training step split its batch into ``micro_batches`` parts and apply one update.

    The gradients of the parts are summed (each weighted by its share of the
    batch), so a step on a batch of K x b rows updates the weights as one step
    on the whole batch would, with the activation memory of b rows. Pair it
    with ``get_dataset_shard(batch_size=K * b, drop_remainder=True)``: the
    batch must divide into equal parts. Works for Keras 3 and tf-keras, in
    ``raytf.keras.fit`` and in tf-keras's ``model.fit``. Returns ``model``.
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
    unpack = keras.utils.unpack_x_y_sample_weight
    # Keras 3 reports the loss through the model's metric named "loss" (its first), which its
    # own train_step updates with the loss before it was scaled for the replicas.
    loss_metric = None if legacy else next((m for m in model.metrics if m.name == "loss"), None)

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
                    if loss_metric is not None:
                        replicas = tf.distribute.get_strategy().num_replicas_in_sync
                        loss_metric.update_state(loss * tf.cast(replicas, loss.dtype),
                                                 sample_weight=tf.shape(tf.nest.flatten(xi)[0])[0])
                    scaled = optimizer.scale_loss(loss / k)
            grads = tape.gradient(scaled, variables)
            if legacy and hasattr(optimizer, "get_unscaled_gradients"):
                grads = optimizer.get_unscaled_gradients(grads)
            total = [t + g for t, g in zip(total, grads)]
            model.compute_metrics(xi, yi, y_pred, wi)
        optimizer.apply_gradients(zip(total, variables))
        return model.get_metrics_result()

    return train_step

"""``raytf.keras.local_sgd``: each worker steps on its own gradients; the weights are averaged
every K steps.

Synchronous training all-reduces every step's gradients, so every step moves
the whole model's bytes across the network. Local SGD (periodic model
averaging: Stich, "Local SGD converges fast and communicates little", 2019;
Lin et al., "Don't use large mini-batches, use local SGD", 2020; PyTorch's
``PostLocalSGDOptimizer``) lets each worker apply its own batch's gradient
every step, as a single worker would, and every K-th step replaces each
worker's weights with their mean over the workers: one all-reduce of the
weights per K steps, so the bytes exchanged per sample drop K-fold while the
number of updates stays that of synchronous training.

What differs from synchronous training, stated plainly:

- Between averages the workers' weights differ; each step's update uses this
  worker's batch only (the per-worker batch, not the global one).
- The optimizer's slots (momentum, Adam's moments) stay each worker's own;
  only the trainable weights are averaged. Non-trainable variables (batch
  norm statistics) keep the aggregation they were made with.
- Wherever the model is read as one model, the weights are averaged first:
  at every K-th step, before validation, at each epoch's end, before
  ``raytf.keras.ReportCallback`` writes a checkpoint, and when training ends.
  A checkpoint therefore always holds the averaged model.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.worker import compression
from raytf._internal.worker.compression import replica_local
from raytf.errors import RaytfError
from raytf.keras._accumulate import _Loss
from raytf.keras._model import add_fit_callback, claim_train_step, keras_of

_AVERAGE = "_raytf_average_weights"


def local_sgd(model: Any, steps: int) -> Any:
    """Make ``model`` train with local SGD: every worker applies its own gradients each step, and
    every ``steps`` steps the workers' weights are replaced by their mean (one all-reduce).

    The all-reduce moves the model's weights once per ``steps`` training steps
    instead of its gradients every step: ``steps`` times fewer bytes per sample.
    With ``TensorflowConfig(gradient_compression=...)`` the averaging exchanges
    each worker's change since the last average in 16 bits (the weights
    themselves stay float32), halving that again.

    Call it after ``compile``. Works for Keras 3 and tf-keras, in
    ``raytf.keras.fit`` and in tf-keras's ``model.fit``; both average the weights
    before validation, at each epoch's end and at the end of training, and
    ``raytf.keras.ReportCallback`` averages before it checkpoints. Code of your
    own that reads the model mid-epoch (a callback that saves or evaluates it)
    calls ``raytf.keras.average_weights(model)`` on every worker first. Returns
    ``model``.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise RaytfError(f"raytf.keras.local_sgd: steps must be an int >= 1 (1 is synchronous training), got {steps!r}")
    if getattr(model, "optimizer", None) is None:
        raise RaytfError("raytf.keras.local_sgd: the model has no optimizer; call model.compile(...) first")
    if "LossScale" in type(model.optimizer).__name__:
        raise RaytfError(
            "raytf.keras.local_sgd: the optimizer is a LossScaleOptimizer (mixed_float16), whose overflow check "
            "is agreed across the workers every step; local SGD steps each worker alone. Use "
            "mixed_precision='mixed_bfloat16' (no loss scaling) or float32 with local_sgd"
        )
    claim_train_step(model, "local_sgd", f"local_sgd(steps={steps})")
    compression.patch_optimizers()
    averager = _Averager(model, steps)
    model.train_step = averager.train_step
    setattr(model, _AVERAGE, averager)
    if hasattr(model, "train_function"):
        model.train_function = None  # rebuilt around the new step
    if keras_of(model).__name__ == "tf_keras":
        add_fit_callback(model, "local_sgd", lambda: getattr(model, _AVERAGE).callback())
    return model


def average_weights(model: Any) -> bool:
    """Average a ``local_sgd`` model's weights over the workers now, if they may differ.

    Every worker must call it at the same point (it is an all-reduce). Returns
    whether it averaged: False for a model without ``local_sgd`` or one whose
    weights are already the average.
    """
    averager = getattr(model, _AVERAGE, None)
    return averager.average_now() if averager is not None else False


class _Averager:
    """The local-SGD train step and the averaging it and fit's callbacks share."""

    def __init__(self, model: Any, steps: int):
        self.model = model
        self.k = steps
        self.keras = keras_of(model)
        self.losses = _Loss(model)
        self.count: Any = None  # steps since the last average; made on the first trace
        self.strategy: Any = None  # the one the step was traced under
        self._eager_average: Any = None
        self._anchors: list = []

    # -- the train step (replica context, traced) --

    def train_step(self, data: Any) -> Any:
        import tensorflow as tf

        model = self.model
        x, y, sample_weight = self.losses.unpack(data)
        variables = model.trainable_variables
        count = self._counter()
        self.strategy = tf.distribute.get_strategy()
        replicas = self.strategy.num_replicas_in_sync
        # The Keras losses are scaled by 1 / replicas for the all-reduce's sum; a worker stepping
        # alone takes its batch's mean gradient.
        y_pred, grads = self.losses.gradients(x, y, sample_weight, 1.0 / replicas)
        with compression.unaggregated():
            model.optimizer.apply_gradients(zip(grads, variables))
        due = count.assign_add(1) >= self.k

        def maybe_average(strategy: Any, due: Any) -> None:
            # Cross-replica context: a collective cannot sit in a tf.cond inside a replica, but a
            # strategy.run inside a tf.cond here can. Every worker is on the same step.
            tf.cond(due, lambda: tf.group(strategy.run(self._average)), tf.no_op)

        if replicas > 1:  # alone, a worker's weights are already the mean
            tf.distribute.get_replica_context().merge_call(maybe_average, args=(due,))
        model.compute_metrics(x, y, y_pred, sample_weight)
        return model.get_metrics_result()

    def _counter(self) -> Any:
        import tensorflow as tf

        if self.count is None:  # once, on the first trace; not checkpointed: a restored model
            # starts equal on every worker
            self.count = replica_local(lambda: tf.constant(0, tf.int64), "raytf_local_steps")
        return self.count

    def _tf_variables(self) -> list:
        if self.keras.__name__ == "tf_keras":
            return list(self.model.trainable_variables)
        return [v.value for v in self.model.trainable_variables]  # Keras 3: the tf.Variable inside

    def _average(self) -> Any:
        """Replace this worker's weights with the workers' mean (replica context)."""
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        variables = self._tf_variables()
        # This replica's copies live on its device; run in the cross-replica step (tf.cond in a
        # merge_call), the reads would carry no device, and the all-reduce needs one to send from.
        with tf.device(variables[0].device):
            means = compression.all_reduce_mean_of_weights(context, variables, self._anchor_variables(variables), self)

        def assign(strategy: Any, means: Any) -> Any:
            return tf.group(
                [
                    strategy.extended.update(v, lambda var, value: var.assign(value), args=(m,), group=True)
                    for v, m in zip(variables, means)
                ]
            )

        done = context.merge_call(assign, args=(means,))
        with tf.control_dependencies([done]):
            return self.count.assign(0)

    def _anchor_variables(self, variables: list) -> list:
        """Compressed averaging's per-worker copies of the last average (made once)."""
        import tensorflow as tf

        if compression.active() is None:
            return []
        if not self._anchors:
            self._anchors = [
                replica_local(lambda v=v: tf.convert_to_tensor(v), "raytf_last_average") for v in variables
            ]
        return self._anchors

    # -- outside the step (eager, every worker at the same point) --

    def average_now(self) -> bool:
        import tensorflow as tf

        if self.count is None or self.strategy.num_replicas_in_sync == 1:
            return False  # not trained yet (every worker holds the weights it started from), or alone
        strategy = self.strategy
        local = strategy.experimental_local_results(self.count)
        if int(local[0].numpy()) == 0:
            return False
        if self._eager_average is None:
            self._eager_average = tf.function(lambda: strategy.run(self._average))
        self._eager_average()
        return True

    def callback(self) -> Any:
        averager = self

        base: Any = self.keras.callbacks.Callback

        class AverageWeights(base):
            """Average before validation, at each epoch's end and at the end of training."""

            def on_test_begin(self, logs: Any = None) -> None:
                averager.average_now()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                averager.average_now()

            def on_train_end(self, logs: Any = None) -> None:
                averager.average_now()

        return AverageWeights()

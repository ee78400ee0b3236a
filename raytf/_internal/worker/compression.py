"""Gradient compression for the all-reduce: ``TensorflowConfig(gradient_compression=...)``.

Each worker casts its float32 gradients to bfloat16 (or float16) before the
all-reduce and the sums back to float32 after it, so half the bytes cross the
network; the weights, the optimizer's slots and the update itself stay float32
("master weights"). With error feedback, what the cast rounded away on a
worker is kept in a per-worker residual and added to its next step's gradient,
so no part of a gradient is lost for good, only delayed by a step.

Only the gradient all-reduce is compressed, never metric or loss reductions
(a bfloat16 sum of 60,000 counts is not 60,000). It happens where the Keras
optimizers sum gradients across replicas (``apply_gradients`` inside
``strategy.run``: ``raytf.keras.fit``, tf-keras ``model.fit`` and custom loops
alike) and in :func:`raytf.all_reduce_gradients` for loops that all-reduce
their gradients themselves.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from raytf._internal import hooks as _hooks
from raytf._internal.hooks import keras as keras_hooks
from raytf._internal.hooks import tf_keras as tf_keras_hooks
from raytf.errors import ConfigError

DTYPES = ("bfloat16", "float16")
_COMPRESSIBLE = ("float32", "float64")


@dataclass(frozen=True)
class Compression:
    dtype: str  # "bfloat16" or "float16"
    error_feedback: bool


_active: Optional[Compression] = None
# > 0 while a local-SGD step traces its optimizer: the optimizers then apply each replica's own
# gradients, with no all-reduce (raytf.keras.local_sgd).
_unaggregated = 0
# Error-feedback residuals: owner (an optimizer, or _LOOSE) -> {variable.ref(): residual}.
_residuals: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


class _Loose:
    """Owner of the residuals of gradients all-reduced outside an optimizer."""


_LOOSE = _Loose()


def active() -> Optional[Compression]:
    return _active


def all_reduce_sum(gradients: Sequence[Any], variables: Optional[Sequence[Any]] = None, owner: Any = None) -> list:
    """Sum ``gradients`` over the replicas, compressed as this worker's run says.

    Called in a replica context (inside ``strategy.run``). ``variables`` (one per
    gradient) key the error-feedback residuals; without them there is none.
    Dense float32/float64 gradients are compressed; others (``IndexedSlices``,
    gradients already in 16 bits) are all-reduced as they are.
    """
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None:
        raise ConfigError("raytf.all_reduce_gradients runs in a replica context: call it inside strategy.run")
    gradients = list(gradients)
    compression = _active
    if compression is None or context.num_replicas_in_sync == 1:
        return list(context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)) if gradients else []
    wire = tf.as_dtype(compression.dtype)
    residuals = _residual_table(owner) if compression.error_feedback and variables is not None else None
    sent, original = [], []
    for index, gradient in enumerate(gradients):
        original.append(gradient.dtype if isinstance(gradient, tf.Tensor) else None)
        if not (isinstance(gradient, tf.Tensor) and gradient.dtype.name in _COMPRESSIBLE):
            sent.append(gradient)
            continue
        if residuals is not None and variables is not None:  # residuals exist only where variables key them
            residual = _residual(residuals, variables[index], gradient)
            gradient = gradient + residual
            compressed = tf.cast(gradient, wire)
            residual.assign(gradient - tf.cast(compressed, gradient.dtype))
            sent.append(compressed)
        else:
            sent.append(tf.cast(gradient, wire))
    reduced = _all_reduce_by_kind(context, sent)
    return [tf.cast(r, dtype) if dtype is not None and r.dtype != dtype else r for r, dtype in zip(reduced, original)]


def all_reduce_mean_of_weights(context: Any, variables: Sequence[Any], anchors: Sequence[Any], owner: Any) -> list:
    """The mean over the replicas of each of this replica's ``variables`` (in a replica context).

    Without ``anchors`` the weights themselves are all-reduced, in their own
    dtype. With them (one per variable: this replica's copy of the last mean,
    equal on every replica) each replica sends its change since then,
    compressed as this worker's run says (error feedback keyed by ``owner``),
    and the mean is the anchor plus the mean change; the anchors become the new
    mean. A 16-bit weight would lose precision at every average; a 16-bit change
    loses it only in what moved.
    """
    import tensorflow as tf

    # A read is colocated with its variable and carries no device of its own; the all-reduce sends
    # from its inputs' devices, so each value is a copy made under the caller's device scope.
    values = [tf.identity(v) for v in variables]
    if not anchors:
        return list(context.all_reduce(tf.distribute.ReduceOp.MEAN, values)) if values else []
    changes = [value - anchor for value, anchor in zip(values, anchors)]
    keys = variables if _active is not None and _active.error_feedback else None
    sums = all_reduce_sum(changes, keys, owner)
    replicas = context.num_replicas_in_sync
    means = [anchor + total / tf.cast(replicas, total.dtype) for anchor, total in zip(anchors, sums)]
    for anchor, mean in zip(anchors, means):
        anchor.assign(mean)
    return means


@contextlib.contextmanager
def unaggregated() -> Any:
    """While inside, the Keras optimizers (patched by :func:`patch_optimizers`) apply each
    replica's own gradients: no all-reduce. Entered around ``apply_gradients`` as it is traced."""
    global _unaggregated
    _unaggregated += 1
    try:
        yield
    finally:
        _unaggregated -= 1


def _all_reduce_by_kind(context: Any, values: list) -> list:
    """One all-reduce per dtype (TensorFlow packs a batch into one concatenated tensor, which needs
    one dtype), results in the order given."""
    import tensorflow as tf

    groups: dict[Any, list[int]] = {}
    for index, value in enumerate(values):
        key = "sparse" if isinstance(value, tf.IndexedSlices) else value.dtype
        groups.setdefault(key, []).append(index)
    out: list = [None] * len(values)
    for indices in groups.values():
        for index, result in zip(indices, context.all_reduce(tf.distribute.ReduceOp.SUM, [values[i] for i in indices])):
            out[index] = result
    return out


def _residual_table(owner: Any) -> dict:
    owner = _LOOSE if owner is None else owner
    table = _residuals.get(owner)
    if table is None:
        table = _residuals[owner] = {}
    return table


def replica_local(initial: Any, name: str) -> Any:
    """A variable each replica keeps for itself (ON_READ, no aggregation: never synchronized,
    all-reduced or checkpointed as one), made outside the traced step even when called in it.
    ``initial`` is a value or a callable giving one (called there)."""
    import tensorflow as tf

    with tf.init_scope():
        return tf.Variable(
            initial() if callable(initial) else initial,
            trainable=False,
            name=name,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.NONE,
        )


def _residual(table: dict, variable: Any, gradient: Any) -> Any:
    """This worker's own residual for ``variable``, made once."""
    import tensorflow as tf

    key = variable.ref()
    residual = table.get(key)
    if residual is None:
        residual = table[key] = replica_local(
            lambda: tf.zeros(gradient.shape, gradient.dtype), "raytf_gradient_residual"
        )
    return residual


def install(dtype: Optional[str], error_feedback: bool) -> None:
    """Compress this worker's gradient all-reduces from now on (``dtype=None``: stop). Patches the
    optimizers of each Keras loaded by then (the worker loads the one tf.keras is before this)."""
    global _active
    _active = Compression(dtype, error_feedback) if dtype else None
    if _active is not None:
        patch_optimizers()


def patch_optimizers() -> None:
    """Route the gradient all-reduce of each Keras loaded by now through this module (idempotent)."""
    import sys

    if "tf_keras" in sys.modules:
        _patch_tf_keras()
    if "keras" in sys.modules:
        _patch_keras3()


def _engaged() -> bool:
    """Whether an optimizer's gradient sum is compressed now: compression is on and the
    optimizer is applying inside ``strategy.run``."""
    import tensorflow as tf

    return _active is not None and tf.distribute.get_replica_context() is not None


def _grads_and_vars(owner: Any, grads_and_vars: Any) -> list:
    pairs = list(grads_and_vars)
    present = [(g, v) for g, v in pairs if g is not None]
    reduced = iter(all_reduce_sum([g for g, _ in present], [v for _, v in present], owner))
    return [(None if g is None else next(reduced), v) for g, v in pairs]


def _patch_keras3() -> None:
    if not keras_hooks.installed():
        return
    _hooks.require("keras.optimizer_all_reduce")  # a Keras 3 whose optimizer moved fails here, naming it

    def all_reduce(optimizer: Any, grads_and_vars: Any, original: Any) -> Any:
        if _unaggregated:
            return list(grads_and_vars)
        if not _engaged():
            return original(optimizer, grads_and_vars)
        return _grads_and_vars(optimizer, grads_and_vars)

    keras_hooks.route_all_reduce(all_reduce)


def _patch_tf_keras() -> None:
    if not tf_keras_hooks.installed():
        return
    _hooks.require("tf_keras.optimizer_aggregate")  # a tf-keras whose optimizers moved fails here, naming it

    def aggregate(optimizer: Any, grads_and_vars: Any, original: Any) -> Any:
        dtensor = tf_keras_hooks.uses_dtensor(optimizer)  # tf-keras's DTensor path aggregates its own way
        if _unaggregated and not dtensor:
            return list(grads_and_vars)
        if not _engaged() or dtensor:
            return original(optimizer, grads_and_vars)
        return _grads_and_vars(optimizer, grads_and_vars)

    def aggregate_legacy(optimizer: Any, grads_and_vars: Any, original: Any) -> Any:
        if _unaggregated:
            return list(grads_and_vars)
        # A user's own gradient_aggregator is theirs to keep.
        if not _engaged() or optimizer.gradient_aggregator is not tf_keras_hooks.default_aggregator():
            return original(optimizer, grads_and_vars)
        return _grads_and_vars(optimizer, grads_and_vars)

    tf_keras_hooks.route_aggregation(aggregate, aggregate_legacy)

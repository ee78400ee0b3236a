"""The hold of a parameter-server step's updates: none of them made when the worker dies before
they all can be.

A step's writes are not one transaction on the parameter servers: each update runs where its
variable is, once its inputs have come from the worker. raytf holds every update of a counted step
(ps_positions.py) behind one op on the first parameter server that waits for everything the step's
writes need from the worker. A worker lost before the hold opens (computing its gradients, where a
step spends its time) leaves none of them made. Past it, TensorFlow cancels the parameter servers'
part of the step with the worker, and what they had not run yet is not run: the step is left
partly made and its batch, never committed, is trained again (the bound
docs/guides/parameter-servers.md states, which tests/integration/test_parameter_server.py proves
at each point of a step).
"""

from __future__ import annotations

from typing import Any, Sequence

POSITIONS_DEVICE = "/job:ps/replica:0/task:0/device:CPU:0"


def hold_until_arrived(
    made: Sequence[Any], updates: Sequence[Any], also: Sequence[Any] = (), move: bool = True
) -> tuple[list, list]:
    """Make every update op of the step wait until everything the step's writes need from the worker
    has arrived where they run: one op on the first parameter server waits for each such input and
    for ``also``, and comes before every update. A worker that dies while its step's gradients are on
    their way leaves none of the step's updates made, instead of those whose gradients came first.

    What is made after an update of the same step cannot be waited for (the update comes first):
    whatever reads or writes a resource the step already wrote (TensorFlow orders it after the
    write), and what is made from it or ordered after it. Where such an op feeds an update and was
    given no device (an EMA or a counter the step computes from a weight it just updated: TensorFlow
    would run it on the worker), raytf runs it beside the update it feeds, and waits in the hold for
    its inputs from the worker instead. So once the hold opens the step's updates and its commit
    need nothing more from the worker. Left to the worker: an op after an update that
    the step placed there itself (``tf.device``), or that reads a resource of the worker's; and
    everything, when ``move`` is false or the work is a model's (a matmul, a convolution, a gradient,
    a function: a forward or backward pass after an update, which belongs on the worker's
    accelerator).

    Returns (the ops after an update, feeding one, that stay on the worker by this rule: a worker
    lost while it runs them leaves the step's first updates made and its commit not; the ops raytf
    placed beside the update they feed, which the caller tells the user of)."""
    import tensorflow as tf

    from raytf._internal.hooks import tensorflow as tf_hooks

    if not updates:
        return [], []
    updating = set(updates)
    written: set[Any] = set()
    after: set[Any] = set()  # ops that run after one of the step's updates
    for op in made:
        if (
            any(i.op in after for i in op.inputs)
            or any(c in after for c in op.control_inputs)
            or any(i.dtype == tf.resource and i.ref() in written for i in op.inputs)
        ):
            after.add(op)
        if op in updating:
            after.add(op)
            written.update(t.ref() for t in writes(op))
    feeding = _feeding(made, updates, after)
    movable = [op for op in feeding if _movable(op)]
    move = move and not any(_model_work(op) for op in movable)
    for op in movable if move else []:  # placed with the update it feeds, not on the worker's device
        tf_hooks.place_beside(op, feeding[op])
    # What runs on a parameter server past the hold has its inputs from the worker waited for (what
    # stays on the worker is not: waiting there would cost a message a step and gain nothing).
    on_ps = [op for op in feeding if (move and op in movable) or _job(op) == "ps"]
    arrived, waited = [], set()
    for op in [*updates, *on_ps]:
        for tensor in op.inputs:
            key = (tensor.ref(), tuple(op.colocation_groups()))
            if tensor.dtype == tf.resource or tensor.op in after or key in waited:
                continue
            waited.add(key)
            with tf.compat.v1.colocate_with(op, ignore_existing=True):
                arrived.append(tf.raw_ops.Identity(input=tensor).op)
        arrived.extend(c for c in op.control_inputs if c not in after)
    with tf.device(POSITIONS_DEVICE), tf.control_dependencies(arrived + [t.op for t in also]):
        hold = tf.raw_ops.NoOp(name="raytf_all_arrived")
    for op in updates:  # an op made by the step's code, held after the fact
        tf_hooks.run_after(op, hold)
    stay = [op for op in feeding if (op in movable and not move) or _job(op) == "worker"]
    return stay, (movable if move else [])


def _feeding(made: Sequence[Any], updates: Sequence[Any], after: set) -> dict:
    """The ops after an update (``after``) that feed one of ``updates``, by data or by order, each with
    an update it feeds."""
    updating, in_step = set(updates), set(made)
    feeding: dict[Any, Any] = {}
    for update in updates:
        todo = [update]
        while todo:
            op = todo.pop()
            for source in [i.op for i in op.inputs] + list(op.control_inputs):
                if source in after and source in in_step and source not in updating and source not in feeding:
                    feeding[source] = update
                    todo.append(source)
    return feeding


def _movable(op: Any) -> bool:
    """Whether raytf may place ``op`` beside the update it feeds: the step named no task for it (the
    strategy's own device scope names just the worker's compute device), put it with no other op, and
    it touches no resource (a resource's ops run where the resource is)."""
    import tensorflow as tf

    return (
        _job(op) is None
        and "_class" not in op.node_def.attr
        and not any(t.dtype == tf.resource for t in [*op.inputs, *op.outputs])
    )


def _job(op: Any) -> Any:
    """The task type the step placed ``op`` on ("ps", "worker"), or None where it named none."""
    import tensorflow as tf

    return tf.DeviceSpec.from_string(op.device or "").job


_MODEL_WORK = (
    "MatMul",
    "BatchMatMul",
    "Conv",
    "DepthwiseConv",
    "Einsum",
    "PartitionedCall",
    "StatefulPartitionedCall",
    "While",
    "StatelessWhile",
    "If",
    "StatelessIf",
    "Case",
)


def _model_work(op: Any) -> bool:
    return op.type.startswith(_MODEL_WORK) or op.type.endswith("Grad")


def writes(op: Any) -> list:
    """The resources ``op`` may write, a variable's or another's (a loop, a conditional or a call
    writes what its functions write), but an iterator's (the batches, counted apart)."""
    from raytf._internal.hooks import tensorflow as tf_hooks

    if op.type.startswith(("Iterator", "AnonymousIterator", "OptionalGet", "OptionalHas")) or op.type in (
        "VarIsInitializedOp",
        "DestroyResourceOp",
    ):
        return []
    return tf_hooks.resource_writes(op)

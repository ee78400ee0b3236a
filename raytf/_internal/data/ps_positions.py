"""Where each parameter-server worker's stream of a shard stands: every row once per pass.

Under ParameterServerStrategy every worker reads its own piece of a dataset
(tfdata_ps.py), as a stream of batches: pass after pass over the piece, each
pass in its own order. TensorFlow's coordinator is at-least-once: a step that
was running on a worker that died is run again on another worker, and the
dead worker's replacement builds its pipeline afresh, from the start of the
piece. Left at that, a replacement trains again the rows its predecessor had
trained, and the batch the dead worker had taken is never trained.

raytf counts, on a parameter server, the batches of each worker's stream whose
step finished: a :class:`StreamPositions` holds ``committed[w]`` (batches of
worker ``w``'s stream trained) and ``taken[w]`` (batches the step now running
on ``w`` has taken). raytf's coordinator runs every step that reads a raytf
shard inside :func:`counting`: the step starts with ``taken[w] = committed[w]``,
each batch it takes adds one, and once all of its updates are made it sets
``committed[w] = taken[w]``. A worker's pipeline, built and rebuilt on the
worker, starts at ``committed[w]``: a replacement goes on with the first batch
its predecessor did not finish, a step run again elsewhere takes that
worker's own next batch, and no row is trained twice in a pass. Every
checkpoint records the positions (the run resumes at them), so a group
restarted from a checkpoint goes on where that checkpoint's model stood.

A step's writes are not one transaction on the parameter servers. raytf holds
every update the step makes until everything they need from the worker has
arrived on their parameter servers (the worker's gradients above all;
ps_hold.py), and commits the step's batch only once all of them are made: a
worker lost while its gradients are on their way leaves none of the step's
updates made; one lost past the hold may leave the step partly made, and its
batch, never committed, is trained again (the bound the docs state: at most
one batch again per lost worker, none skipped).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional, Sequence

from raytf._internal.data import ps_hold
from raytf._internal.data.ps_hold import POSITIONS_DEVICE

logger = logging.getLogger(__name__)

_counted: dict[
    tuple, tuple[Any, Any]
] = {}  # (id(fn), its counted arguments) -> (fn, its counting wrapper): traced once
_counted_lock = threading.Lock()


class StreamPositions:
    """``committed`` and ``taken`` batches of every worker's stream of one shard, on the
    first parameter server (unpartitioned, whatever the run's variable partitioner)."""

    def __init__(self, name: str, workers: int):
        import tensorflow as tf

        self.name = name
        self.workers = workers
        with tf.init_scope(), tf.device(POSITIONS_DEVICE):
            self.committed = tf.Variable(
                tf.zeros([workers], tf.int64), trainable=False, name=f"raytf_committed_{_safe(name)}"
            )
            self.taken = tf.Variable(tf.zeros([workers], tf.int64), trainable=False, name=f"raytf_taken_{_safe(name)}")

    def start(self, worker: Any) -> Any:
        """The first batch of ``worker``'s stream its pipeline yields (a tensor, read where the
        pipeline is built: on the worker, each time it is built)."""
        import tensorflow as tf

        return tf.gather(self.committed, tf.cast(worker, tf.int64))

    def set(self, positions: Sequence[int]) -> None:
        """Where every worker's stream starts, set from the chief (eagerly, even while a dataset
        function is traced)."""
        import tensorflow as tf

        with tf.init_scope():
            self.committed.assign(tf.constant(list(positions), tf.int64))
            self.taken.assign(tf.constant(list(positions), tf.int64))

    def values(self) -> list[int]:
        import tensorflow as tf

        with tf.init_scope():
            return [int(v) for v in self.committed.numpy()]

    def begin(self, worker: Any) -> Any:
        import tensorflow as tf

        return self.taken.scatter_nd_update([[worker]], tf.gather(self.committed, [worker]))

    def count(self, worker: Any, taken: Any = 1) -> Any:
        import tensorflow as tf

        return self.taken.scatter_nd_add([[worker]], tf.reshape(tf.cast(taken, tf.int64), [1]))

    def commit(self, at: "Worker") -> Any:
        """``committed[w] = taken[w]``: made on this parameter server from values already there, so
        that a commit whose updates are made needs nothing more from the worker."""
        import tensorflow as tf

        return self.committed.scatter_nd_update(at.rows, tf.gather(self.taken, at.index))


class Worker:
    """The index of the worker running a step, as the commit's inputs, placed on the parameter
    server of the positions from the step's start."""

    def __init__(self, worker: Any):
        import tensorflow as tf

        with tf.device(POSITIONS_DEVICE):
            self.index = tf.reshape(worker, [1])
            self.rows = tf.reshape(worker, [1, 1])


class PsStreams:
    """The chief's streams: one :class:`StreamPositions` per dataset the workers hold pieces of
    (``shard_files``: by worker, dataset -> its files), made at once, since a dataset function the
    coordinator traces may create no variable; each started once per request, at the checkpoint's
    record of it or at pass ``first_epoch``."""

    def __init__(self, recorded: Optional[dict[str, Any]], first_epoch: int, shard_files: Sequence[Any]):
        self._recorded = recorded or {}
        self._first_epoch = first_epoch
        names = sorted(shard_files[0]) if shard_files else []
        self.positions = {name: StreamPositions(name, len(shard_files)) for name in names}
        self._started: dict[str, Any] = {}  # name -> the PsShard whose start was set last

    def start(self, shard: Any) -> None:
        """Set where each worker's stream of ``shard`` starts, the first time it is asked for (or
        asked for again with other batching, which starts its passes afresh)."""
        name = shard.request.name
        earlier = self._started.get(name)
        if earlier is not None and earlier.request == shard.request:
            return
        start, why = shard.initial_positions(self._recorded.get(name) if earlier is None else None)
        if why:
            logger.warning(
                "raytf: dataset %r starts its passes afresh at epoch %d, not where the checkpoint recorded it: %s",
                name,
                self._first_epoch,
                why,
            )
        shard.positions.set(start)
        self._started[name] = shard

    def records(self) -> dict[str, Any]:
        """What a checkpoint records: each stream's positions, read now (after the steps joined)."""
        return {name: shard.record() for name, shard in self._started.items()}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


class CountingIterator:
    """A worker's iterator inside a counted step: every batch taken is counted in ``taken``."""

    def __init__(self, iterator: Any, positions: StreamPositions, worker: Any):
        self._iterator = iterator
        self._positions = positions
        self._worker = worker
        self._takes: list[Any] = []  # the graph each batch was taken in, while a step is traced

    def __iter__(self) -> "CountingIterator":
        return self

    def __next__(self) -> Any:
        return self._counted(next(self._iterator))

    def get_next(self, *args: Any, **kwargs: Any) -> Any:
        return self._counted(self._iterator.get_next(*args, **kwargs))

    def get_next_as_optional(self) -> Any:
        import tensorflow as tf

        optional = self._iterator.get_next_as_optional()
        self._takes.append(tf.compat.v1.get_default_graph())
        self._positions.count(self._worker, tf.cast(optional.has_value(), tf.int64))
        return optional

    def takes_one_batch(self, graph: Any) -> bool:
        """Whether the step traced since the last call took one batch, in ``graph`` (not in a loop
        of its own), and forget what it took."""
        one = len(self._takes) <= 1 and all(g is graph for g in self._takes)
        self._takes = []
        return one

    def _counted(self, element: Any) -> Any:
        import tensorflow as tf

        self._takes.append(tf.compat.v1.get_default_graph())
        with tf.control_dependencies([t for t in tf.nest.flatten(element) if isinstance(t, tf.Tensor)]):
            self._positions.count(self._worker)
        return element

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # TensorFlow's own protocols see no iterator here
            raise AttributeError(name)
        return getattr(self._iterator, name)


def positions_of(value: Any) -> Optional[StreamPositions]:
    return getattr(value, "_raytf_positions", None)


def counting(fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[Callable[..., Any]]:
    """``fn`` as a step that counts the batches it takes from raytf's per-worker iterators among
    its (top-level) arguments, or None when it takes none, or is not a ``tf.function`` (a plain
    Python step runs eagerly, batch by batch: raytf does not count it, and says so once)."""
    positional = {i: p for i, a in enumerate(args) if (p := positions_of(a)) is not None}
    keyword = {k: p for k, a in kwargs.items() if (p := positions_of(a)) is not None}
    if not positional and not keyword:
        return None
    python_function = getattr(fn, "python_function", None)
    if python_function is None:
        _warn_once(fn)
        return None
    key = (id(fn), tuple(sorted(positional)), tuple(sorted(keyword)))
    with _counted_lock:
        found = _counted.get(key)
        if found is not None and found[0] is fn:
            return found[1]
        wrapped = _wrap(python_function, positional, keyword, _autograph(fn))
        _counted[key] = (fn, wrapped)
        return wrapped


def _wrap(
    python_function: Callable[..., Any],
    positional: dict[int, StreamPositions],
    keyword: dict[str, StreamPositions],
    autograph: bool,
) -> Any:
    import tensorflow as tf

    streams = list({id(p): p for p in [*positional.values(), *keyword.values()]}.values())
    name = getattr(python_function, "__name__", "step")
    multi_step = _multi_step(python_function)
    if multi_step is not None and list(positional) == [0] and not keyword:
        return _wrap_multi_step(*multi_step, positional[0])
    # The step's own code, converted as its tf.function would (AutoGraph leaves library modules,
    # tf-keras's train_function among them, alone when they are called from another function).
    python_function = tf.autograph.to_graph(python_function) if autograph else python_function

    @tf.function
    def counted_step(*args: Any, **kwargs: Any) -> Any:
        worker = _current_worker()
        given = [CountingIterator(a, positional[i], worker) if i in positional else a for i, a in enumerate(args)]
        named = {k: CountingIterator(a, keyword[k], worker) if k in keyword else a for k, a in kwargs.items()}
        counted = [a for a in [*given, *named.values()] if isinstance(a, CountingIterator)]
        return _held(lambda: python_function(*given, **named), streams, worker, counted, name)

    return counted_step


def _wrap_multi_step(step_function: Callable[..., Any], model: Any, positions: StreamPositions) -> Any:
    """tf-keras's train function of ``steps_per_execution`` steps, its loop run by raytf: each
    step's batch is committed in the loop with that step's updates, so a worker lost in the middle
    of an execution trains none of its finished batches again."""
    import tensorflow as tf

    def run(steps_per_execution: Any, one_step: Callable[[], Any]) -> Any:
        for _ in tf.range(steps_per_execution):
            outputs = one_step()
        return outputs

    run = tf.autograph.to_graph(run)

    @tf.function
    def counted_step(iterator: Any, steps_per_execution: Any) -> Any:
        worker = _current_worker()
        counting = CountingIterator(iterator, positions, worker)

        @tf.autograph.experimental.do_not_convert
        def one_step() -> Any:
            return _held(lambda: step_function(model, counting), [positions], worker, [counting], "train_function")

        return run(steps_per_execution, one_step)

    return counted_step


def _current_worker() -> Any:
    import tensorflow as tf

    return tf.cast(tf.distribute.coordinator.experimental_get_current_worker_index(), tf.int64)


def _held(
    step: Callable[[], Any],
    streams: Sequence[StreamPositions],
    worker: Any,
    iterators: Sequence[CountingIterator],
    name: str,
) -> Any:
    """Run ``step`` (made into the graph being built) counted: ``taken = committed`` before it,
    every update it makes held until all of their inputs arrived, and the count committed once they
    are made, on nothing else."""
    import tensorflow as tf

    at = Worker(worker)
    for positions in streams:  # taken = committed, before any batch (both ordered on `taken`)
        positions.begin(worker)
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    outputs = step()
    one_batch = all(iterator.takes_one_batch(graph) for iterator in iterators)
    if not one_batch:
        _warn_once(name, _SEVERAL)
    # Every update of the step waits until all of their inputs are where they run, and the commit
    # waits for every update, and on nothing else: a worker lost during its step leaves either none
    # of the step's updates made, or all of them and the commit. (A step of several batches keeps its
    # later batches' work on the worker: it is warned of above.)
    made = graph.get_operations()[first:]
    updates = [op for op in made if ps_hold.writes(op)]
    if hold_updates:
        stay, moved = ps_hold.hold_until_arrived(made, updates, also=[at.index, at.rows], move=one_batch)
        if stay and one_batch:
            _warn_once(name, _ON_WORKER)
        if moved:
            _warn_once(name, _MOVED % ", ".join(sorted(f"{op.name} ({op.type})" for op in moved)))
    with tf.control_dependencies(updates):
        for positions in streams:
            positions.commit(at)
    return outputs


def _multi_step(python_function: Callable[..., Any]) -> Optional[tuple[Any, Any]]:
    from raytf._internal.hooks import tf_keras as tf_keras_hooks

    return tf_keras_hooks.multi_step_train_function(python_function) if tf_keras_hooks.installed() else None


def _autograph(fn: Any) -> bool:
    """Whether the ``tf.function`` ``fn`` converts its code with AutoGraph (its default)."""
    from raytf._internal.hooks import tensorflow as tf_hooks

    return tf_hooks.function_autograph(fn)


_warned: set[tuple[str, str]] = set()
_PLAIN = (
    "coordinator.schedule(%s, ...) takes a raytf shard's iterator but is not a tf.function; raytf counts the "
    "batches of tf.function steps only, so a worker lost during this step may train rows of its pass again. "
    "Decorate the step with @tf.function"
)
_SEVERAL = (
    "the step %s takes several batches from a raytf shard's iterator (or takes them in a loop of its own); "
    "raytf commits a step's batches once, when all of its updates are made, so a worker lost in the middle "
    "of this step trains the batches it had finished again. Take one batch a step (for tf-keras's "
    "model.fit, steps_per_execution is fine: raytf commits each of its steps)"
)

_ON_WORKER = (
    "the step %s computes on the worker, from a value one of its updates made, the input of a later update "
    "(a forward or backward pass, or ops it placed on the worker); a worker lost meanwhile leaves the "
    "step's first updates made and its batch uncommitted, so that batch is trained again. Make every update "
    "from what the step computed before its first update (raytf runs small work after an update, an EMA or "
    "a counter, on the parameter server itself)"
)


_MOVED = (
    "the step %%s computes, after one of its updates, the input of another: raytf runs that work on the "
    "parameter server beside the update it feeds, so that the step's updates need nothing more from the "
    "worker once the hold opens: %s. To keep it on the worker, place it with tf.device yourself, or turn the hold off "
    "(ParameterServerTrainer(hold_updates=False))"
)

# ParameterServerTrainer(hold_updates=...): a chief sets it before its train_fn runs.
hold_updates = True


def _warn_once(fn: Any, message: str = _PLAIN) -> None:
    name = getattr(fn, "__name__", str(fn))
    if (name, message) not in _warned:
        _warned.add((name, message))
        logger.warning("raytf: " + message, name)

"""Parameter-server shards: pipelines the chief builds and each worker's TensorFlow server runs.

Under ParameterServerStrategy the chief traces every dataset function and the
workers run the graph, so the pipeline may only use TensorFlow ops. Each
worker's actor has written its piece of every dataset to files on its own node
(worker_files.py) and the driver handed the chief all of their manifests. A
:class:`PsShard` names every worker's files in one constant table; the graph
picks its own row with ``experimental_get_current_worker_index()``, reads the
files once per iterator, and batches with one ``tf.gather`` per column, as the
cached path of the synchronous trainer does.

The pipeline repeats without end (ParameterServerStrategy's workers each take
batches at their own pace; ``steps_per_epoch`` says when an epoch ends), and
pass ``e`` over a worker's piece is shuffled by ``(seed, worker, e)`` when asked.
A worker's stream starts where its :class:`~raytf._internal.data.ps_positions.StreamPositions`
says the steps that trained from it stopped (ps_positions.py): batch ``k`` of the
stream is batch ``k % b`` of pass ``k // b``, ``b`` the batches of one pass.

``raytf.get_dataset_shard`` on the chief returns a *template*: a dataset with
the right element spec that the raytf coordinator replaces by the per-worker
pipeline in ``create_per_worker_dataset`` (and that tf-keras' ``model.fit``
passes there). Iterated on the chief itself, it fails with a message that
says where the data is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from raytf._internal.data.request import ShardRequest, check_request
from raytf._internal.data.worker_files import ColumnFiles
from raytf.errors import DatasetShardError

TEMPLATE_MARK = "_raytf_ps_shard"

ON_THE_CHIEF = (
    "raytf: a parameter-server shard is read by the workers, not by the chief: pass it to "
    "model.fit(..., steps_per_epoch=...) or to coordinator.create_per_worker_dataset(...)"
)


@dataclass(frozen=True)
class PsShard:
    """One ``get_dataset_shard`` call under ParameterServerStrategy: what it asked for and
    where every worker's piece of the dataset lies."""

    request: ShardRequest
    manifests: tuple[Mapping[str, ColumnFiles], ...]  # by worker task index: column -> files
    seed: Optional[int]
    first_epoch: int = 0
    positions: Any = None  # ps_positions.StreamPositions: where each worker's stream starts

    def batches_per_pass(self) -> list[int]:
        """By worker: the batches of one pass over its piece."""
        batch, rows = self.request.batch_size, self.rows()
        return [n // batch if self.request.drop_remainder else -(-n // batch) for n in rows]

    def rows(self) -> list[int]:
        return [m[next(iter(m))].rows if m else 0 for m in self.manifests]

    def record(self) -> dict[str, Any]:
        """What a checkpoint records of this shard: each worker's position, and what it means."""
        return {"ps_positions": self.positions.values(), **self._meaning()}

    def _meaning(self) -> dict[str, Any]:
        return {
            "rows": self.rows(),
            "batch_size": self.request.batch_size,
            "drop_remainder": self.request.drop_remainder,
            "shuffle": self.request.shuffle,
        }

    def initial_positions(self, recorded: Any) -> tuple[list[int], Optional[str]]:
        """(each worker's start, why a checkpoint's record was not used): the record when it is
        of this shard, else the start of pass ``first_epoch``."""
        fresh = [self.first_epoch * b for b in self.batches_per_pass()]
        if not isinstance(recorded, dict) or "ps_positions" not in recorded:
            return fresh, None
        mine = self._meaning()
        differs = [k for k in mine if recorded.get(k) != mine[k]]
        if differs or len(recorded["ps_positions"]) != len(fresh):
            return fresh, ", ".join(f"{k} was {recorded.get(k)!r}, now {mine[k]!r}" for k in differs) or "worker count"
        return [int(p) for p in recorded["ps_positions"]], None

    def columns(self) -> tuple[list[str], Optional[str]]:
        return self.request.columns(list(self.manifests[0]))

    def build(self, worker_index: Any) -> Any:
        """The pipeline of the worker at ``worker_index`` (a scalar tensor), TensorFlow ops only."""
        return self._pipeline(worker_index, on_chief=False)

    def template(self) -> Any:
        """A dataset of the same element spec that fails if the chief reads it."""
        import tensorflow as tf

        dataset = self._pipeline(tf.constant(0, tf.int64), on_chief=True)
        setattr(dataset, TEMPLATE_MARK, self)
        return dataset

    def _pipeline(self, worker_index: Any, on_chief: bool) -> Any:
        import tensorflow as tf

        features, label = self.columns()
        needed = features + ([label] if label is not None else [])
        index = tf.cast(worker_index, tf.int64)
        tables = {c: _file_table([m[c] for m in self.manifests]) for c in needed}
        rows = tf.constant([m[needed[0]].rows for m in self.manifests], tf.int64)
        per_pass = tf.gather(tf.constant(self.batches_per_pass(), tf.int64), index)
        if self.positions is not None and not on_chief:
            start = self.positions.start(index)  # read on the worker, each time its pipeline is built
        else:
            start = per_pass * self.first_epoch
        first_pass, skipped = start // per_pass, start % per_pass
        specs = {c: self.manifests[0][c] for c in needed}

        def load(_: Any) -> Any:
            if on_chief:
                with tf.control_dependencies([tf.debugging.Assert(False, [ON_THE_CHIEF])]):
                    index_here = tf.identity(index)
            else:
                index_here = index
            return {c: _load_column(tables[c], index_here, specs[c]) for c in needed}

        batch = self.request.batch_size
        seed = _seed(self.seed, self.request.name)
        shuffle = self.request.shuffle
        drop = self.request.drop_remainder
        single = isinstance(self.request.features, str)

        def one_pass(epoch: Any, arrays: Any) -> Any:
            n = tf.gather(rows, index)
            order = tf.range(n)
            if shuffle:
                order = tf.random.experimental.stateless_shuffle(
                    order, seed=tf.stack([tf.constant(seed, tf.int64), index * 1_000_003 + epoch])
                )
            indices = tf.data.Dataset.from_tensor_slices(order).batch(batch, drop_remainder=drop)
            indices = indices.skip(tf.where(tf.equal(epoch, first_pass), skipped, tf.constant(0, tf.int64)))

            def take(i: Any) -> Any:
                x = tf.gather(arrays[features[0]], i) if single else {c: tf.gather(arrays[c], i) for c in features}
                return x if label is None else (x, tf.gather(arrays[label], i))

            return indices.map(take)

        with tf.device("/cpu:0"):
            arrays = tf.data.Dataset.range(1).map(load).cache().repeat()
            data = tf.data.Dataset.zip((tf.data.Dataset.range(first_pass, tf.int64.max), arrays)).flat_map(one_pass)
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
            return data.prefetch(tf.data.AUTOTUNE).with_options(options)


def _file_table(columns: Sequence[ColumnFiles]) -> tuple[Any, Any]:
    """(paths padded to a rectangle [workers, most files], files per worker) as constants."""
    import tensorflow as tf

    longest = max(len(c.files) for c in columns)
    paths = [list(c.files) + [""] * (longest - len(c.files)) for c in columns]
    return tf.constant(paths), tf.constant([len(c.files) for c in columns], tf.int32)


def _load_column(table: tuple[Any, Any], index: Any, spec: ColumnFiles) -> Any:
    """Worker ``index``'s files of one column, parsed and joined in order."""
    import tensorflow as tf

    paths, counts = table
    mine, count = tf.gather(paths, index), tf.gather(counts, index)
    dtype = tf.string if spec.dtype == "string" else tf.as_dtype(spec.dtype)
    parts = tf.TensorArray(dtype, size=count, infer_shape=False, element_shape=tf.TensorShape([None, *spec.shape]))

    def read(i: Any, parts: Any) -> Any:
        return i + 1, parts.write(i, tf.io.parse_tensor(tf.io.read_file(mine[i]), dtype))

    _, parts = tf.while_loop(lambda i, _: i < count, read, (tf.constant(0), parts))
    return tf.ensure_shape(parts.concat(), [None, *spec.shape])


def _seed(seed: Optional[int], name: str) -> int:
    """The shuffle seed of a dataset: the user's, or one fixed by the dataset's name."""
    text = f"{seed}:{name}" if seed is not None else f"raytf:{name}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def make_shard(
    request: ShardRequest,
    manifests: Sequence[Mapping[str, ColumnFiles]],
    seed: Optional[int],
    first_epoch: int,
    positions: Any = None,
) -> PsShard:
    """The checked :class:`PsShard` of one ``get_dataset_shard`` call on the chief."""
    check_request(request)
    pieces = [m[next(iter(m))].rows if m else 0 for m in manifests]  # each worker's rows
    if not any(pieces):
        raise DatasetShardError(
            f"raytf.get_dataset_shard({request.name!r}): the dataset is empty (0 rows); pass a dataset with rows"
        )
    if not all(pieces):
        raise DatasetShardError(
            f"raytf.get_dataset_shard({request.name!r}): the dataset has {sum(pieces)} row(s), fewer than the "
            f"{len(pieces)} workers it is split across, so some worker got none. Pass more data, lower "
            "ParameterServerScaling.num_workers, or leave it out of DataConfig(datasets_to_split=...)"
        )
    shard = PsShard(request, tuple(manifests), seed, first_epoch, positions)
    shard.columns()
    smallest = min(pieces)
    if smallest < request.batch_size:
        raise DatasetShardError(
            f"raytf.get_dataset_shard({request.name!r}): batch_size={request.batch_size} is larger than a "
            f"worker's piece ({smallest} rows, the smallest across {len(manifests)} workers); lower "
            "batch_size or pass more data"
        )
    return shard


def template_of(dataset: Any) -> Optional[PsShard]:
    """The :class:`PsShard` behind ``dataset`` (a template, or tf.distribute's wrapper of one)."""
    from raytf._internal.hooks import tensorflow as tf_hooks

    for candidate in (dataset, tf_hooks.distributed_original(dataset)):
        shard = getattr(candidate, TEMPLATE_MARK, None)
        if shard is not None:
            return shard
    return None


def derived_from_template(dataset: Any) -> bool:
    """Whether ``dataset`` was made from a template by a transformation (which the workers
    cannot rebuild from the template's recipe)."""
    from raytf._internal.worker.strategy import lineage

    from raytf._internal.hooks import tensorflow as tf_hooks

    original = tf_hooks.distributed_original(dataset)
    original = dataset if original is None else original
    return any(getattr(d, TEMPLATE_MARK, None) is not None for d in lineage(original))

"""Reader: a worker's tf.data over its run of a file source (files.py): TensorFlow's own readers,
interleave, parse and prefetch, in the order the group's position gives.

Each pass asks its :class:`FileCursor` for the rank's run and the batches' bounds (one Python
call per pass), and reads it as pieces (files.py), several at once: a piece's chunks are read
by a deterministic parallel interleave, each chunk whole as one element (a read buffer of the
chunk's size), so its output is the chunks one after the other while several are read at once;
then its rows are taken in the window's order (no copy where it takes them all in order) and,
for TFRecord, parsed by ``tf.io.parse_example`` in one call per piece; ``rebatch`` cuts the
pieces into the pass's batches. How a piece is read is its format's (formats/: a TFRecord chunk
opened at its byte offset, a Parquet row group read by pyarrow).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from raytf._internal.data.cursor import FileCursor
from raytf._internal.data.files import FilePlan, changed_files, run_slice
from raytf._internal.data.formats import format_of
from raytf._internal.data.request import ShardRequest, check_rows
from raytf.errors import DatasetShardError

_PIECES_IN_FLIGHT = 4  # pieces read at once (each up to a shuffle window)


def column_specs(plan: FilePlan) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """column -> (NumPy dtype, per-row shape), in the source's order."""
    return format_of(plan.source).column_specs(plan)


def file_dataset(plan: FilePlan, cursor: FileCursor, request: ShardRequest) -> Any:
    """This rank's tf.data over a file source: one pass per iteration, as ``cursor`` plans them."""
    import tensorflow as tf

    if plan.rows == 0:
        check_rows(request.name, 0, cursor.world_size)
    specs = column_specs(plan)
    features, label = request.columns(list(specs))
    needed = features + ([label] if label is not None else [])
    share = plan.rows // cursor.world_size
    if share < request.batch_size:
        raise DatasetShardError(
            f"raytf.get_dataset_shard({request.name!r}): batch_size={request.batch_size} is larger than the "
            f"worker's shard ({share} rows, the smallest across {cursor.world_size} workers); lower batch_size or "
            "pass more data"
        )
    tf_dtype = {c: tf.string if specs[c][0] == object else tf.as_dtype(specs[c][0]) for c in needed}  # noqa: E721 - numpy "O"

    def tables() -> list[np.ndarray]:
        """The pass's pieces, as flat arrays and their splits: whole batches, then the last."""
        layout, run, bounds = cursor.next_run()
        count = len(bounds) - 1
        cut = int(bounds[-1] if request.drop_remainder or count == 0 else bounds[-2])
        out = []
        parts = [
            layout.pieces(run_slice(run, 0, cut)),
            layout.pieces(run_slice(run, cut, int(bounds[-1]) if count else 0)),
        ]
        reading = plan.chunk_file[
            np.concatenate([p.chunks for pieces in parts for p in pieces] or [np.zeros(0, np.int64)])
        ]
        cursor.files_read = sorted(set(reading.tolist()))  # where a failed read is looked for (data/diagnose.py)
        changed = changed_files(plan, cursor.files_read)
        if changed:
            raise DatasetShardError(
                f"raytf.get_dataset_shard({request.name!r}): {len(changed)} file(s) changed since the run counted "
                f"them: {'; '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}. Every epoch reads the files as "
                "they were when the run planned them (a file rewritten with as many rows would train other rows): "
                "put the files back, or start a new run (another RunConfig.name) over the new files"
            )
        for pieces in parts:
            for arrays in ([p.chunks for p in pieces], [_take(p, plan) for p in pieces]):
                out.append(np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64))
                out.append(np.concatenate([[0], np.cumsum([len(a) for a in arrays])]).astype(np.int64))
        return out

    batch = request.batch_size
    read_piece = format_of(plan.source).piece_reader(plan, needed, tf_dtype, specs)

    def one_pass(_: Any) -> Any:
        out = [tf.ensure_shape(t, (None,)) for t in tf.py_function(tables, [], Tout=[tf.int64] * 8)]
        parts = []
        for first in (0, 4):
            chunks = tf.RaggedTensor.from_row_splits(out[first], out[first + 1], validate=False)
            take = tf.RaggedTensor.from_row_splits(out[first + 2], out[first + 3], validate=False)
            pieces = tf.data.Dataset.from_tensor_slices((chunks, take)).map(
                read_piece, num_parallel_calls=_PIECES_IN_FLIGHT, deterministic=True
            )
            # Whole batches, then the last: what the run has left (request.batch_size + 1 rows at most).
            parts.append(pieces.rebatch(batch, drop_remainder=True) if first == 0 else pieces.rebatch(2 * batch + 2))
        return parts[0].concatenate(parts[1])

    single = isinstance(request.features, str)
    batch_dim = batch if request.drop_remainder else None

    def split(columns: dict[str, Any]) -> Any:
        columns = {c: tf.ensure_shape(v, (batch_dim, *specs[c][1])) for c, v in columns.items()}
        x = columns[features[0]] if single else {c: columns[c] for c in features}
        return x if label is None else (x, columns[label])

    dataset = tf.data.Dataset.range(1).flat_map(one_pass).map(split)
    if cursor.start.is_fresh(cursor.rows):
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cursor.full_steps()))
    return dataset.prefetch(tf.data.AUTOTUNE)  # tfdata.finish makes it the shard


def _take(piece: Any, plan: FilePlan) -> np.ndarray:
    """A piece's rows to take from its chunks; none where it takes every row in order and its
    format reads them so without a copy."""
    if (
        format_of(plan.source).reads_in_order_without_copy
        and len(piece.take) == plan.chunk_rows[piece.chunks].sum()
        and (piece.take == np.arange(len(piece.take))).all()
    ):
        return piece.take[:0]
    return piece.take

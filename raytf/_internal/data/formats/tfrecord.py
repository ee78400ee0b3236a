"""TFRecord files (``raytf.data.tfrecord_files``): uncompressed records of ``tf.train.Example``,
a chunk being a run of at most ``chunk_rows`` records of one file, read from its byte offset."""

from __future__ import annotations

import struct
import time
from typing import Any, Optional

from raytf._internal.data.files import FilePlan, FileSource
from raytf.errors import DataError

_HEADER = 12  # a TFRecord's uint64 length and its masked CRC
_SCAN_BLOCK = 1 << 20  # bytes read at a time while counting a TFRecord file's records
_READERS = 4  # chunks of one piece read at once
_CHECK_BATCH = 4096  # records parsed at a time while looking for a bad one


def scan_tfrecord(read_at: Any, size: int, chunk_rows: int, name: str) -> tuple[list[int], list[int]]:
    """(records, byte offset of each chunk's first record) of one uncompressed TFRecord file of
    ``size`` bytes, walking its record headers through blocks of ``read_at(nbytes, offset)``; a
    file that ends inside a record is named, with the likely cause."""
    counts: list[int] = []
    offsets: list[int] = []
    at = block_at = records = 0
    block = b""
    while at < size:
        if at + _HEADER > block_at + len(block):
            block_at, block = at, read_at(min(_SCAN_BLOCK, size - at), at)
        if at + _HEADER > block_at + len(block):
            raise DataError(
                f"raytf.data.tfrecord_files: {name} ends inside a record's header (truncated, or "
                "compressed: the files must be uncompressed TFRecord)"
            )
        (length,) = struct.unpack_from("<Q", block, at - block_at)
        if records % chunk_rows == 0:
            offsets.append(at)
            counts.append(0)
        counts[-1] += 1
        records += 1
        at += _HEADER + length + 4
    if at != size:
        raise DataError(
            f"raytf.data.tfrecord_files: {name} ends inside a record (truncated, or compressed: the "
            "files must be uncompressed TFRecord)"
        )
    return counts, offsets


def _features(source: FileSource) -> dict:
    """The features a TFRecord source parses (``raytf.data.tfrecord_files`` requires them)."""
    if source.features is None:
        raise DataError(f"{source.describe()}: no features to parse; pass features= to raytf.data.tfrecord_files")
    return source.features


class TFRecord:
    name = "tfrecord"
    chunk_is_window = False  # chunks are grouped into shuffle windows of about shuffle_rows rows
    reads_in_order_without_copy = True  # the records go on as read

    def scan(self, source: FileSource, filesystem: Any, on_fs: str, path: str) -> tuple:
        with filesystem.open_input_file(on_fs) as handle:
            size = handle.size()
            counts, offsets = scan_tfrecord(handle.read_at, size, source.chunk_rows, path)
        firsts = [i * source.chunk_rows for i in range(len(counts))]
        ends = offsets[1:] + [size]
        return counts, firsts, offsets, [e - o for o, e in zip(offsets, ends)], None

    def schema(self, source: FileSource, files: list, scanned: list) -> dict:
        return {}  # the features the user named are the schema (column_specs)

    def column_specs(self, plan: FilePlan) -> dict[str, tuple[Any, tuple[int, ...]]]:
        return {name: (dtype, shape) for name, (shape, dtype, _) in _features(plan.source).items()}

    def piece_reader(self, plan: FilePlan, needed: list[str], tf_dtype: dict, specs: dict) -> Any:
        """A piece's rows, parsed in one ``tf.io.parse_example`` call: each chunk read whole (one
        element per chunk, several chunks at once), the chunks concatenated, the piece's records
        taken in its order."""
        import tensorflow as tf

        files = tf.constant(list(plan.files))
        chunk_file, chunk_offset = tf.constant(plan.chunk_file), tf.constant(plan.chunk_offset)
        chunk_rows, chunk_first = tf.constant(plan.chunk_rows), tf.constant(plan.chunk_first)
        chunk_bytes = tf.constant(plan.chunk_bytes)
        spec = {
            name: tf.io.FixedLenFeature(shape, tf_dtype[name], default_value=default)
            for name, (shape, _, default) in _features(plan.source).items()
            if name in needed
        }

        def read_chunk(filename: Any, offset: Any, size: Any, first: Any, rows: Any) -> Any:
            return _records_at(filename, offset, size, first).take(rows).batch(rows)

        def read(chunks: Any, take: Any) -> Any:
            records = tf.data.Dataset.from_tensor_slices(
                (
                    tf.gather(files, tf.gather(chunk_file, chunks)),
                    tf.gather(chunk_offset, chunks),
                    tf.gather(chunk_bytes, chunks),
                    tf.gather(chunk_first, chunks),
                    tf.gather(chunk_rows, chunks),
                )
            ).interleave(read_chunk, cycle_length=_READERS, num_parallel_calls=_READERS, deterministic=True)
            serialized = records.ragged_batch(tf.size(chunks, out_type=tf.int64)).get_single_element().flat_values
            serialized = tf.cond(tf.size(take) > 0, lambda: tf.gather(serialized, take), lambda: serialized)
            return tf.io.parse_example(serialized, spec)

        return read

    def bad_record(self, plan: FilePlan, path: str, deadline: float = float("inf")) -> Optional[str]:
        """The first record of ``path`` that cannot be read or parsed with the source's features,
        as "<path>, record <i>: <why>"; None if every record reads (or the deadline passed first)."""
        import tensorflow as tf

        spec = {
            k: tf.io.FixedLenFeature(shape, tf.as_dtype(dtype), default_value=default)
            for k, (shape, dtype, default) in _features(plan.source).items()
        }
        done = 0
        batches = iter(tf.data.TFRecordDataset(path).batch(_CHECK_BATCH))
        while time.monotonic() < deadline:
            try:
                batch = next(batches)
            except StopIteration:
                return None
            except tf.errors.DataLossError as error:
                return f"{path}, record {done} or one of the {_CHECK_BATCH - 1} after it: {error.message}"
            try:
                tf.io.parse_example(batch, spec)
            except tf.errors.InvalidArgumentError:
                for offset in range(int(tf.shape(batch)[0])):
                    try:
                        tf.io.parse_example(batch[offset : offset + 1], spec)
                    except tf.errors.InvalidArgumentError as error:
                        return f"{path}, record {done + offset}: {error.message.splitlines()[0]}"
            done += int(tf.shape(batch)[0])
        return None


def _records_at(filename: Any, offset: Any, size: Any, first: Any) -> Any:
    """A TFRecord file's records from the one at byte ``offset`` (record number ``first``), read
    with a buffer of the chunk's ``size`` in bytes (TensorFlow's ``TFRecordDatasetV2`` op, which
    the public ``TFRecordDataset`` does not expose; without it, read from the file's start and
    skipped to the chunk's first record, warned of once)."""
    import tensorflow as tf

    from raytf._internal import hooks
    from raytf._internal.hooks import tensorflow as tf_hooks

    source: Any = hooks.named("tensorflow.records_at").call_or_warn(tf_hooks.records_at_class)
    if source is None:  # the same records, read from the file's start and skipped
        return tf.data.TFRecordDataset(filename, buffer_size=1 << 20).skip(first)
    return source(filename, offset, size)

"""Parquet files (``raytf.data.parquet_files``): a chunk is one row group, read by pyarrow."""

from __future__ import annotations

import threading
from typing import Any, Optional, Sequence

import numpy as np

from raytf._internal.data.files import FilePlan, FileSource, filesystem_of
from raytf.errors import ConfigError, DataError


def parquet_schema(source: FileSource, files: Sequence[str], schemas: Sequence[Any]) -> dict:
    """column -> (NumPy dtype, per-row shape) of the columns read, the same in every file;
    fixed-size lists are tensor columns."""
    import pyarrow as pa

    first = schemas[0]
    names = list(source.columns) if source.columns else list(first.names)
    out = {}
    for name in names:
        if first.get_field_index(name) < 0:
            raise ConfigError(
                f"raytf.data.parquet_files: column {name!r} is not in {files[0]} (its columns: "
                f"{', '.join(first.names)})"
            )
        kind, shape = first.field(name).type, []
        while pa.types.is_fixed_size_list(kind):
            shape.append(kind.list_size)
            kind = kind.value_type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
            dtype = np.dtype(object)
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            dtype = np.dtype(kind.to_pandas_dtype())
        else:
            raise DataError(
                f"raytf.data.parquet_files: column {name!r} is {first.field(name).type}; a worker reads "
                "numbers, strings and fixed-size lists of them (write variable lists padded, as "
                "pa.list_(type, size))"
            )
        out[name] = (dtype, tuple(shape))
    for path, schema in zip(files[1:], schemas[1:]):
        for name in names:
            if schema.get_field_index(name) < 0 or schema.field(name).type != first.field(name).type:
                raise DataError(f"raytf.data.parquet_files: column {name!r} of {path} does not match {files[0]}'s")
    return out


class Parquet:
    name = "parquet"
    chunk_is_window = True  # a row group is a shuffle window of its own
    reads_in_order_without_copy = False

    def scan(self, source: FileSource, filesystem: Any, on_fs: str, path: str) -> tuple:
        """A file's row groups, from its footer, and its arrow schema."""
        import pyarrow.parquet as pq

        with filesystem.open_input_file(on_fs) as handle:
            parquet = pq.ParquetFile(handle)
            meta = parquet.metadata
            groups = range(meta.num_row_groups)
            rows = [meta.row_group(g).num_rows for g in groups]
            size = [meta.row_group(g).total_byte_size for g in groups]
            return rows, list(groups), [0] * len(rows), size, parquet.schema_arrow

    def schema(self, source: FileSource, files: list, scanned: list) -> dict:
        return parquet_schema(source, files, scanned)

    def column_specs(self, plan: FilePlan) -> dict[str, tuple[Any, tuple[int, ...]]]:
        return dict(plan.schema)

    def piece_reader(self, plan: FilePlan, needed: list[str], tf_dtype: dict, specs: dict) -> Any:
        import tensorflow as tf

        reader = _Reader(plan, needed)

        def read(chunks: Any, take: Any) -> dict[str, Any]:
            out = tf.py_function(
                lambda c, t: reader.read(c.numpy(), t.numpy()), [chunks, take], Tout=[tf_dtype[c] for c in needed]
            )
            return {c: tf.ensure_shape(v, (None, *specs[c][1])) for c, v in zip(needed, out)}

        return read

    def bad_record(self, plan: FilePlan, path: str, deadline: float = float("inf")) -> Optional[str]:
        return None  # pyarrow names the file and column of a failed read itself


class _Reader:
    """Row groups of a plan's Parquet files, as NumPy columns. Each of tf.data's threads opens
    the files it reads once (a pyarrow ParquetFile must not be read by two threads at once)."""

    def __init__(self, plan: FilePlan, columns: list[str]):
        self.plan, self.columns = plan, columns
        self._local = threading.local()

    def _file(self, index: int) -> Any:
        opened = self._local.__dict__.setdefault("files", {})
        if index not in opened:
            import pyarrow.parquet as pq

            filesystem, path = filesystem_of(self.plan.files[index])
            opened[index] = pq.ParquetFile(filesystem.open_input_file(path))
        return opened[index]

    def read(self, chunks: np.ndarray, take: np.ndarray) -> list[np.ndarray]:
        import pyarrow as pa

        tables = [
            self._file(int(self.plan.chunk_file[c])).read_row_group(int(self.plan.chunk_first[c]), columns=self.columns)
            for c in chunks
        ]
        table = pa.concat_tables(tables).take(pa.array(take))
        out = []
        for name in self.columns:
            dtype, shape = self.plan.schema[name]
            values = table.column(name).combine_chunks()
            for _ in shape:
                values = values.flatten()
            array = values.to_numpy(zero_copy_only=False)
            out.append(array.reshape(len(take), *shape) if shape else array)
        return out

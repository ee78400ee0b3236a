"""tf.data's internals raytf stands on: a dataset's graph and options (recognising raytf's shard),
and TFRecord reads from a byte offset.

See the package docstring of ``raytf._internal.hooks``.
"""

from __future__ import annotations

from typing import Any

from raytf._internal.hooks._hook import Hook


def dataset_inputs(dataset: Any) -> list:
    """The datasets a ``tf.data.Dataset`` was made from (``.map``'s input, ...)."""
    return list(dataset._inputs())  # noqa: SLF001


def dataset_functions(dataset: Any) -> list:
    """The traced functions of a ``tf.data`` transformation (a map's, an interleave's)."""
    return [f.function for f in dataset._functions()]  # noqa: SLF001


_RECORDS_AT: list = []


def records_at_class() -> Any:
    """A ``tf.data`` source of one TFRecord file's records from a byte offset (TensorFlow's
    ``TFRecordDatasetV2`` op takes one; its public dataset does not): ``cls(filename, offset,
    size)``, reading with a buffer of ``size`` bytes. Raises where the op or the class is gone."""
    if not _RECORDS_AT:
        import tensorflow as tf
        from tensorflow.python.data.ops import dataset_ops
        from tensorflow.python.ops import gen_dataset_ops

        make = gen_dataset_ops.tf_record_dataset_v2

        class RecordsAt(dataset_ops.DatasetSource):
            def __init__(self, filename: Any, offset: Any, size: Any):
                self._name = None
                variant = make(
                    tf.reshape(filename, [1]),
                    "",
                    tf.cast(size, tf.int64),
                    tf.reshape(tf.cast(offset, tf.int64), [1]),
                    metadata=self._metadata.SerializeToString(),
                )
                super().__init__(variant)

            @property
            def element_spec(self) -> Any:
                return tf.TensorSpec([], tf.string)

        _RECORDS_AT.append(RecordsAt)
    return _RECORDS_AT[0]


def framework_types(options: bytes) -> list:
    """The ``framework_type`` of a dataset's serialized options (what ``GetOptions`` returns)."""
    from tensorflow.core.framework import dataset_options_pb2

    return list(dataset_options_pb2.Options.FromString(options).framework_type)


def _probe_records_at() -> None:
    from tensorflow.python.data.ops import dataset_ops
    from tensorflow.python.ops import gen_dataset_ops

    assert "byte_offsets" in gen_dataset_ops.tf_record_dataset_v2.__code__.co_varnames, (
        "gen_dataset_ops.tf_record_dataset_v2(byte_offsets=...)"
    )
    assert isinstance(getattr(dataset_ops, "DatasetSource", None), type), "dataset_ops.DatasetSource"
    assert isinstance(getattr(dataset_ops.DatasetV2, "_metadata", None), property), "DatasetV2._metadata"


def _behaves_records_at() -> None:
    import os
    import tempfile

    import tensorflow as tf

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "probe.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in (b"a", b"bb", b"ccc"):
                writer.write(record)
        offset = 16 + 1 + 16 + 2  # each record: length (8), its CRC (4), the data, the data's CRC (4)
        # Made inside a tf.data function, as raytf's reader makes it (a dataset made eagerly is
        # serialized when iterated, which this op's TensorFlow kernel does not do with its offsets).
        read = [
            r.numpy()
            for r in tf.data.Dataset.from_tensors(tf.constant(path)).interleave(
                lambda name: records_at_class()(name, offset, 1 << 10)
            )
        ]
        assert read == [b"ccc"], f"the records from byte {offset} read {read}"


def _probe_framework_types() -> None:
    from tensorflow.core.framework import dataset_options_pb2

    assert "framework_type" in dataset_options_pb2.Options.DESCRIPTOR.fields_by_name, "Options.framework_type"


def _behaves_framework_types() -> None:
    import tensorflow as tf

    options = tf.data.Options()
    options.framework_type = ["raytf_probe"]
    dataset = tf.data.Dataset.range(2).with_options(options)
    found = framework_types(tf.raw_ops.GetOptions(input_dataset=dataset._variant_tensor).numpy())  # noqa: SLF001
    assert "raytf_probe" in found, found


def _probe_dataset_graph() -> None:
    # Read off the classes, running nothing: a probe must not initialize TensorFlow's eager
    # context before the strategy configures its collectives.
    import tensorflow as tf
    from tensorflow.python.data.ops import structured_function

    for method in ("_inputs", "_functions"):
        assert callable(getattr(tf.data.Dataset, method, None)), f"tf.data.Dataset.{method}"
    assert isinstance(getattr(structured_function.StructuredFunctionWrapper, "function", None), property), (
        "StructuredFunctionWrapper.function"
    )


def _behaves_dataset_graph() -> None:
    import tensorflow as tf

    source = tf.data.Dataset.range(3)
    mapped = source.map(lambda x: x + 1)
    assert dataset_inputs(mapped) == [source], dataset_inputs(mapped)
    assert len(dataset_functions(mapped)) == 1, dataset_functions(mapped)


HOOKS = [
    Hook(
        "tensorflow.dataset_graph",
        "tensorflow",
        "tf.data.Dataset._inputs() and ._functions()",
        "recognising a raytf shard inside tf.data (per-worker distribution)",
        "nothing: pass raytf.keras.distribute(dataset) to model.fit; this one is required",
        _probe_dataset_graph,
        behaves=_behaves_dataset_graph,
    ),
    Hook(
        "tensorflow.records_at",
        "tensorflow",
        "gen_dataset_ops.tf_record_dataset_v2(byte_offsets=...) as a dataset_ops.DatasetSource",
        "reading a TFRecord file from where a chunk or a resumed position starts",
        "nothing (it is optional): without it each chunk is read from its file's start and the records "
        "before it skipped (the same rows, more reading)",
        _probe_records_at,
        behaves=_behaves_records_at,
        optional=True,
    ),
    Hook(
        "tensorflow.dataset_options",
        "tensorflow",
        "tensorflow.core.framework.dataset_options_pb2.Options",
        "recognising a raytf shard captured inside a tf.data function (per-worker distribution)",
        "nothing: pass raytf.keras.distribute(dataset) to model.fit; this one is required",
        _probe_framework_types,
        behaves=_behaves_framework_types,
    ),
]

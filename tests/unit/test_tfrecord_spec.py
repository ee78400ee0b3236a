"""raytf.data.read_tfrecords' reading: a TFRecord file's records, parsed by a feature spec."""

import numpy as np
import pytest

from raytf.data import _ParseFiles, feature_spec, records
from raytf.errors import ConfigError, DataError

pytestmark = pytest.mark.unit


def _file(tmp_path, examples):
    import tensorflow as tf

    path = str(tmp_path / "part.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for features in examples:
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    with open(path, "rb") as f:
        return f.read()


def test_features_become_fixed_shape_columns_with_defaults_and_unnamed_ones_dropped(tmp_path):
    import tensorflow as tf

    def floats(*v):
        return tf.train.Feature(float_list=tf.train.FloatList(value=v))

    data = _file(tmp_path, [
        {"x": floats(0, 1, 2, 3), "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])), "w": floats(0.5),
         "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"abc"[i:i + 1]])), "extra": floats(9)}
        if i != 1 else
        {"x": floats(4, 5, 6, 7), "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
         "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"b"]))}
        for i in range(3)
    ])
    assert len(records(data)) == 3
    parse = _ParseFiles(feature_spec({
        "x": tf.io.FixedLenFeature([2, 2], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
        "w": tf.io.FixedLenFeature([], tf.float32, default_value=1.0),
        "name": tf.io.FixedLenFeature([], tf.string),
    }))
    out = parse({"bytes": np.array([data], dtype=object)})
    assert set(out) == {"x", "y", "w", "name"}
    assert out["x"].shape == (3, 2, 2) and out["x"].dtype == np.float32 and out["x"][1, 1, 1] == 7.0
    assert out["y"].dtype == np.int64 and list(out["y"]) == [0, 1, 2]
    assert list(out["w"]) == [0.5, 1.0, 0.5]  # the record without it takes the default
    assert list(out["name"]) == [b"a", b"b", b"c"]


def test_a_record_that_does_not_fit_or_a_cut_file_is_an_error_naming_it(tmp_path):
    import tensorflow as tf

    data = _file(tmp_path, [{"x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0, 2.0]))}])
    parse = _ParseFiles(feature_spec({"x": tf.io.FixedLenFeature([3], tf.float32)}))
    with pytest.raises(DataError, match="a record does not fit the feature spec"):
        parse({"bytes": np.array([data], dtype=object)})
    with pytest.raises(DataError, match="ends inside a record"):
        records(data[:-3])


def test_only_fixed_length_features_are_read():
    import tensorflow as tf

    with pytest.raises(ConfigError, match="feature 'tags' is a VarLenFeature; only tf.io.FixedLenFeature"):
        feature_spec({"tags": tf.io.VarLenFeature(tf.int64)})
    with pytest.raises(ConfigError, match="takes a dict of feature names"):
        feature_spec({})

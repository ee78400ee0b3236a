"""raytf.data.read_tfrecords' parsing: Ray Data's TFRecord columns as a feature spec's fixed shapes."""

import numpy as np
import pytest

from raytf.data import _Parse, feature_spec

pytestmark = pytest.mark.unit


def test_features_become_fixed_shape_columns_with_defaults_and_unnamed_ones_dropped():
    import tensorflow as tf

    parse = _Parse(feature_spec({
        "x": tf.io.FixedLenFeature([2, 2], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
        "w": tf.io.FixedLenFeature([], tf.float32, default_value=1.0),
        "name": tf.io.FixedLenFeature([], tf.string),
    }))
    lists = np.empty(3, dtype=object)
    lists[:] = [np.arange(4.0), np.arange(4.0) + 1, np.arange(4.0) + 2]
    weights = np.array([0.5, None, 2.0], dtype=object)
    out = parse({"x": lists, "y": np.array([0, 1, 0]), "w": weights, "name": np.array([b"a", b"b", b"c"], dtype=object),
                 "extra": np.array([1, 2, 3])})
    assert set(out) == {"x", "y", "w", "name"}
    assert out["x"].shape == (3, 2, 2) and out["x"].dtype == np.float32 and out["x"][2, 1, 1] == 5.0
    assert out["y"].dtype == np.int64 and list(out["y"]) == [0, 1, 0]
    assert list(out["w"]) == [0.5, 1.0, 2.0]  # the record without it takes the default
    assert list(out["name"]) == [b"a", b"b", b"c"]


def test_a_missing_value_without_default_or_a_wrong_count_names_the_feature():
    import tensorflow as tf

    parse = _Parse(feature_spec({"x": tf.io.FixedLenFeature([3], tf.float32)}))
    short = np.empty(2, dtype=object)
    short[:] = [np.zeros(3), np.zeros(2)]
    with pytest.raises(ValueError, match=r"feature 'x' has 2 values in a record, its FixedLenFeature shape \[3\] holds 3"):
        parse({"x": short})
    with pytest.raises(ValueError, match="a record has no feature 'x', and its FixedLenFeature has no default_value"):
        parse({"x": np.array([None, None], dtype=object)})


def test_only_fixed_length_features_are_read():
    import tensorflow as tf

    with pytest.raises(ValueError, match="feature 'tags' is a VarLenFeature; only tf.io.FixedLenFeature"):
        feature_spec({"tags": tf.io.VarLenFeature(tf.int64)})
    with pytest.raises(ValueError, match="takes a dict of feature names"):
        feature_spec({})

"""raytf.keras's gradient options refuse what would silently do nothing: in one process, no Ray."""

import numpy as np
import pytest

import raytf
import raytf.keras


def tf_keras_model():
    import tf_keras

    model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
    model.compile(optimizer=tf_keras.optimizers.SGD(0.1), loss="mse")
    return model


def keras3_model():
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.parametrize("make", [tf_keras_model, keras3_model])
def test_accumulate_gradients_and_local_sgd_on_one_model_are_refused_in_either_order(make):
    model = raytf.keras.accumulate_gradients(make(), steps=4)
    with pytest.raises(raytf.RaytfError, match=r"already trains with raytf.keras.accumulate_gradients\(steps=4\)"):
        raytf.keras.local_sgd(model, steps=2)
    model = raytf.keras.local_sgd(make(), steps=2)
    with pytest.raises(raytf.RaytfError, match=r"already trains with raytf.keras.local_sgd\(steps=2\)"):
        raytf.keras.accumulate_gradients(model, micro_batches=2)
    with pytest.raises(raytf.RaytfError, match="do not combine"):
        raytf.keras.local_sgd(model, steps=3)  # nor one with other arguments
    assert raytf.keras.local_sgd(model, steps=2) is model  # the same again is the same model


def test_an_accumulation_window_past_an_epoch_is_refused_when_tf_keras_fit_begins():
    model = raytf.keras.accumulate_gradients(tf_keras_model(), steps=10**9)
    x, y = np.zeros((32, 2), "float32"), np.zeros((32, 1), "float32")
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(raytf.RaytfError, match=r"steps=1000000000\): an epoch here has 8 steps.*use steps <= 8"):
        model.fit(x, y, batch_size=4, epochs=3, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    fine = raytf.keras.accumulate_gradients(tf_keras_model(), steps=8)
    fine.fit(x, y + 1.0, batch_size=4, epochs=1, verbose=0)  # one update in the epoch
    assert int(fine.optimizer.iterations.numpy()) == 1


def test_an_accumulation_window_past_an_epoch_is_refused_by_raytf_keras_fit():
    import tensorflow as tf

    model = raytf.keras.accumulate_gradients(keras3_model(), steps=100)
    model.optimizer.build(model.trainable_variables)
    data = tf.data.Dataset.from_tensor_slices((np.zeros((40, 2), "float32"), np.zeros((40, 1), "float32"))).batch(4)
    with pytest.raises(raytf.RaytfError, match=r"accumulate_gradients\(steps=100\): an epoch here has 10 steps"):
        raytf.keras.fit(model, data, epochs=1, initial_epoch=0)


def test_keras3_fit_under_a_raytf_strategy_refuses_arrays_and_batch_arguments_by_name(monkeypatch):
    """The routed fit (raytf/keras/_keras3.py) names what to pass instead: ``fit(x, y)`` on arrays, the
    first call of most Keras users, and a batch_size beside a dataset."""
    import keras
    import tensorflow as tf

    from raytf.keras import _keras3

    for name in ("fit", "evaluate"):  # the routing patches keras.Model for the process: undone after
        monkeypatch.setattr(keras.Model, name, getattr(keras.Model, name))
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    _keras3.install(strategy)
    with strategy.scope():
        model = keras3_model()
    x, y = np.ones((8, 2), np.float32), np.ones((8, 1), np.float32)
    with pytest.raises(raytf.RaytfError, match="takes a tf.data.Dataset .*got ndarray"):
        model.fit(x, y, epochs=1, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with pytest.raises(raytf.RaytfError, match="drop batch_size, validation_split"):
        model.fit(dataset, batch_size=4, validation_split=0.5, verbose=0)
    with pytest.raises(raytf.RaytfError, match="drop y"):
        model.evaluate(dataset, y, verbose=0)


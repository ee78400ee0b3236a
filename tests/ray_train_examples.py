"""Ray Train's own TensorFlow examples, with the data download replaced by local data of the
same shape and only the imports changed: ``config["api"]`` picks Ray Train's modules or raytf's.

- ``mnist_keras``: tensorflow_mnist_example.py (a CNN on 28x28 digits, its own
  MultiWorkerMirroredStrategy, ``model.fit`` on a dataset of global batches,
  ``ReportCheckpointCallback``); with ``callback=False`` it is Ray Train's TensorFlow quick start.
- ``regression``: tensorflow_regression_example.py (100 features concatenated into one
  column with Ray Data, ``get_dataset_shard("train").to_tf(...)`` every epoch, ``model.fit``
  once per epoch with ``ReportCheckpointCallback``).
- ``autoencoder``: an autoencoder trained from ``iter_tf_batches`` with a custom step.
"""

from __future__ import annotations

import json
import os


def api(name):
    """(train, ReportCheckpointCallback) of Ray Train or raytf: the import swap."""
    if name == "ray":
        from ray import train
        from ray.train.tensorflow.keras import ReportCheckpointCallback
    else:
        from raytf import train
        from raytf.train.keras import ReportCheckpointCallback
    return train, ReportCheckpointCallback


def mnist_like(rows, seed=0):
    """mnist's shape: 28x28 uint8 images, labels 0-9; each class a bright band, plus noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, rows)
    x = rng.integers(0, 80, (rows, 28, 28))
    for c in range(10):
        x[y == c, 2 * c + 4: 2 * c + 7, 4:24] += 150
    return x.astype("uint8"), y.astype("int64")


def mnist_dataset(batch_size):
    import tensorflow as tf

    (x_train, y_train) = mnist_like(6000)
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / 255.0
    y_train = y_train.astype("int64")
    train_dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(6000, seed=0).repeat().batch(batch_size)
    )
    return train_dataset


def build_cnn_model():
    import tensorflow as tf

    model = tf.keras.Sequential([
        tf.keras.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    return model


def mnist_keras(config):
    import tensorflow as tf

    train, ReportCheckpointCallback = api(config["api"])
    tf.keras.utils.set_random_seed(config.get("seed", 0))  # (not in the example: both runs start alike)
    per_worker_batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)
    steps_per_epoch = config.get("steps_per_epoch", 70)

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_cnn_model()
        learning_rate = config.get("lr", 0.001)
        multi_worker_model.compile(
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=tf.keras.optimizers.SGD(learning_rate=learning_rate),
            metrics=["accuracy"],
        )

    callbacks = [ReportCheckpointCallback()] if config.get("callback", True) else []
    history = multi_worker_model.fit(
        multi_worker_dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks,
    )
    results = history.history
    if not config.get("callback", True):
        train.report({"loss": results["loss"][-1], "epoch": epochs - 1})
    return results


def regression_data(rows=2000, seed=0):
    """The regression example's shape: columns x000..x099 and y, y linear in x plus noise."""
    import numpy as np
    import pandas as pd
    import ray

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 100)).astype("float32")
    w = np.random.default_rng(1).standard_normal(100).astype("float32") / 10
    y = x @ w + 0.01 * rng.standard_normal(rows).astype("float32")
    frame = pd.DataFrame({f"x{i:03d}": x[:, i] for i in range(100)})
    frame["y"] = y
    return ray.data.from_pandas(frame)


def concatenate(dataset):
    """The example's Concatenator: the x columns into one column "x"."""
    from ray.data.preprocessors import Concatenator

    return Concatenator(columns=[f"x{i:03d}" for i in range(100)], output_column_name="x").fit_transform(dataset)


def build_regression_model():
    import tensorflow as tf

    model = tf.keras.Sequential()
    model.add(tf.keras.layers.InputLayer(input_shape=(100,)))
    model.add(tf.keras.layers.Dense(10))
    model.add(tf.keras.layers.Dense(1))
    return model


def regression(config):
    import tensorflow as tf

    train, ReportCheckpointCallback = api(config["api"])
    tf.keras.utils.set_random_seed(config.get("seed", 0))  # (not in the example: both runs start alike)
    batch_size = config.get("batch_size", 64)
    epochs = config.get("epochs", 3)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_regression_model()
        multi_worker_model.compile(
            optimizer=tf.keras.optimizers.SGD(learning_rate=config.get("lr", 1e-2)),
            loss=tf.keras.losses.MeanAbsoluteError(),
            metrics=[tf.keras.metrics.MeanSquaredError()],
        )

    dataset = train.get_dataset_shard("train")

    results = []
    for _ in range(epochs):
        tf_dataset = dataset.to_tf(feature_columns="x", label_columns="y", batch_size=batch_size)
        history = multi_worker_model.fit(tf_dataset, callbacks=[ReportCheckpointCallback()])
        results.append(history.history)
    return results


def autoencoder(config):
    """An autoencoder on a Ray Dataset's "image" column, trained from iter_tf_batches."""
    import tensorflow as tf

    train, _ = api(config["api"])
    context = train.get_context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    batch_size = config.get("batch_size", 32)
    global_batch = batch_size * context.get_world_size()
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((64,)), tf.keras.layers.Dense(16, activation="relu"), tf.keras.layers.Dense(64),
        ])
        optimizer = tf.keras.optimizers.Adam(0.01)

    @tf.function
    def step(images):
        def replica(x):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.reduce_mean(tf.square(model(x) - x), axis=1),
                                                  global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica, args=(images,)), axis=None)

    shard = train.get_dataset_shard("train")
    for epoch in range(config.get("epochs", 3)):
        losses = [float(step(batch["image"])) for batch in shard.iter_tf_batches(batch_size=batch_size,
                                                                                   dtypes=tf.float32)]
        train.report({"epoch": epoch, "loss": sum(losses) / len(losses)})

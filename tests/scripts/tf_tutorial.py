"""TensorFlow's multi-worker Keras tutorial (tensorflow.org/tutorials/distribute/multi_worker_with_keras),
as it is written there: TF_CONFIG, MultiWorkerMirroredStrategy, BackupAndRestore. Only the data
(mnist-shaped, generated: no download) and the backup directory (raytf's, shared by every rank)
differ; a log line per epoch lets the test see where each attempt started."""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--epoch-sleep", type=float, default=0.0)
args = parser.parse_args()


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    y_train = rng.integers(0, 10, 6000)
    x_train = rng.integers(0, 80, (6000, 28, 28)).astype("float32")
    for c in range(10):
        x_train[y_train == c, 2 * c + 4: 2 * c + 7, 4:24] += 150
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(6000).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=['accuracy'])
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)

with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()


class EpochLog(tf.keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        with open(os.path.join(os.environ["RAYTF_RUN_DIR"], f"pid{tf_config['task']['index']}"), "w") as f:
            f.write(str(os.getpid()))

    def on_epoch_end(self, epoch, logs=None):
        if tf_config['task']['index'] == 0:
            with open(os.path.join(os.environ["RAYTF_RUN_DIR"], "epochs.log"), "a") as f:
                f.write(f"attempt {os.environ['RAYTF_ATTEMPT']} epoch {epoch} loss {logs['loss']:.4f}\n")
        time.sleep(args.epoch_sleep)


callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=os.environ["RAYTF_CHECKPOINT_DIR"]), EpochLog()]
multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=20, callbacks=callbacks)

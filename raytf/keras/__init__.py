"""Keras on raytf workers: one training loop for Keras 3 and tf-keras.

Keras 3's ``model.fit`` fails under MultiWorkerMirroredStrategy, and tf-keras's
works only when the per-worker dataset is handed over just so. :func:`fit`
runs the model's own ``train_step`` and ``test_step`` (so the optimizer, loss,
metrics and loss scaling from ``compile`` all apply) with ``strategy.run``,
reads the metrics once per epoch across every worker, and drives the usual
Keras callbacks. The same code trains a Keras 3 model or a tf-keras one.

    with raytf.strategy().scope():
        model = build_model()
        model.compile(optimizer="adam", loss=..., metrics=["accuracy"])
    history = raytf.keras.fit(model, raytf.get_dataset_shard("train", batch_size=128, ...),
                              epochs=10, validation_data=raytf.get_dataset_shard("val", ...),
                              callbacks=[keras.callbacks.EarlyStopping(), raytf.keras.ReportCallback()])

Everything here runs inside ``train_fn``; nothing imports TensorFlow before then.
"""

from raytf.keras._accumulate import accumulate_gradients
from raytf.keras._callback import ReportCallback
from raytf.keras._fit import evaluate, fit
from raytf.keras._local_sgd import average_weights, local_sgd
from raytf.keras._model import distribute, keras_of, restore

__all__ = [
    "ReportCallback",
    "accumulate_gradients",
    "average_weights",
    "distribute",
    "evaluate",
    "fit",
    "keras_of",
    "local_sgd",
    "restore",
]

"""After training: a checkpoint evaluated offline, exported, loaded outside Ray, and served.

The guide "After training" quotes this file; ``tests/integration/test_docs_examples.py`` runs it
on the checkpoint that ``custom_loop.py`` trained (Keras 3, as ``tf.keras`` is by default).

    python docs/examples/after_training.py ~/raytf_results/custom-loop/checkpoints/<checkpoint>
"""

from __future__ import annotations

import argparse
import os

import raytf


# --8<-- [start:model]
def build_model():
    """The model train_fn built (custom_loop.py), to restore the checkpoint's weights into."""
    import tensorflow as tf

    return tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(32, activation="relu"),
                                tf.keras.layers.Dense(2)])
# --8<-- [end:model]


# --8<-- [start:evaluate]
def evaluate(checkpoint: raytf.Checkpoint, x, y) -> dict:
    """A checkpoint scored on held-out rows, in this process: no Ray, no strategy."""
    import tensorflow as tf

    model = build_model()
    checkpoint.restore_state(model=model)  # the weights; the optimizer's state stays in the files
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model.evaluate(x, y, batch_size=256, verbose=0, return_dict=True)
# --8<-- [end:evaluate]


# --8<-- [start:export]
def export(checkpoint: raytf.Checkpoint, directory: str) -> tuple[str, str]:
    """The checkpoint's model as a SavedModel (for TF Serving, or anything that loads one) and a
    .keras file (for Keras); returns both paths."""
    model = build_model()
    checkpoint.restore_state(model=model)
    saved_model, keras_file = os.path.join(directory, "saved_model", "1"), os.path.join(directory, "model.keras")
    model.export(saved_model)  # a SavedModel whose "serve" endpoint and serving_default signature run the model
    model.save(keras_file)
    return saved_model, keras_file
# --8<-- [end:export]


# --8<-- [start:load]
def predict(saved_model: str, x):
    """Logits from the exported SavedModel, loaded with TensorFlow alone: no Keras, raytf or Ray."""
    import tensorflow as tf

    loaded = tf.saved_model.load(saved_model)  # held while its function runs: it owns the variables
    return loaded.serve(tf.constant(x, tf.float32)).numpy()
# --8<-- [end:load]


# --8<-- [start:serve]
def deployment(saved_model: str):
    """A Ray Serve application of the SavedModel, answering TF Serving's REST format:
    ``{"instances": [[...8 floats...], ...]}`` -> ``{"predictions": [[...2 logits...], ...]}``."""
    from ray import serve

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class Classifier:
        def __init__(self, path: str):
            import tensorflow as tf

            self._model = tf.saved_model.load(path)
            self._tf = tf

        def predict(self, instances: list) -> list:
            return self._model.serve(self._tf.constant(instances, self._tf.float32)).numpy().tolist()

        async def __call__(self, request) -> dict:
            return {"predictions": self.predict((await request.json())["instances"])}

    return Classifier.bind(saved_model)
# --8<-- [end:serve]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", help="a checkpoint directory of the custom-loop run")
    parser.add_argument("--export-dir", default="exported")
    args = parser.parse_args()
    saved_model, keras_file = export(raytf.Checkpoint(os.path.expanduser(args.checkpoint)), args.export_dir)
    print(f"exported {saved_model} and {keras_file}")

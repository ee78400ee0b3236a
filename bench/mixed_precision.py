"""What a mixed-precision policy does to W1's model on this machine: one process, one thread.

    python bench/mixed_precision.py

Keras 3 ``model.fit`` on 30,000 in-memory rows of W1's shape (784 features,
MLP 784-128-10, batch 128, steps_per_execution 8), under float32,
mixed_bfloat16 and mixed_float16. Prints one JSON line per policy and the
ratios to float32. No distribution: this isolates the arithmetic.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def main() -> None:
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras = tf.keras
    rows, batch = 30_000, 128
    x = np.random.default_rng(0).standard_normal((rows, 784)).astype("float32")
    y = np.argmax(x @ np.random.default_rng(1).standard_normal((784, 10)), axis=1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).cache()
    speed = {}
    for policy in ("float32", "mixed_bfloat16", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        model = keras.Sequential([
            keras.Input((784,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10),
            keras.layers.Activation("linear", dtype="float32"),  # logits in float32
        ])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=8)
        model.fit(data, epochs=1, verbose=0)  # trace and warm up
        start = time.perf_counter()
        history = model.fit(data, epochs=2, verbose=0)
        speed[policy] = 2 * (rows // batch) * batch / (time.perf_counter() - start)
        print(json.dumps({"policy": policy, "samples_per_s": round(speed[policy]),
                          "loss": round(history.history["loss"][-1], 4),
                          "optimizer": type(model.optimizer).__name__}), flush=True)
    print(json.dumps({"vs_float32": {p: round(v / speed["float32"], 3) for p, v in speed.items()}}))


if __name__ == "__main__":
    main()

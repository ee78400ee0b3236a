"""Ray Train code on raytf: the imports are the only change.

The guide "Coming from Ray Train" quotes this file; ``tests/integration/test_docs_examples.py``
runs it.

    python docs/examples/ray_train_swap.py
"""

from __future__ import annotations

import numpy as np
import ray

# --8<-- [start:imports]
# from ray import train                                          # before
# from ray.train import ScalingConfig, RunConfig
# from ray.train.tensorflow import TensorflowTrainer
# from ray.train.tensorflow.keras import ReportCheckpointCallback
from raytf import train                                           # after
from raytf.train import RunConfig, ScalingConfig, TensorflowTrainer
from raytf.train.keras import ReportCheckpointCallback
# --8<-- [end:imports]


# --8<-- [start:train_func]
def train_func(config: dict) -> None:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # raytf's, already connected
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="mse")
    shard = train.get_dataset_shard("train")
    for _ in range(config["epochs"]):
        model.fit(shard.to_tf("x", "y", batch_size=64), callbacks=[ReportCheckpointCallback()], verbose=0)
# --8<-- [end:train_func]


def regression_rows(batch: dict) -> dict:
    x = np.random.default_rng(int(batch["id"][0])).standard_normal((len(batch["id"]), 16)).astype("float32")
    return {"x": x, "y": (x @ np.linspace(-1, 1, 16, dtype="float32"))[:, None]}


def main(storage_path: str = "~/raytf_results", num_workers: int = 4, use_gpu: bool = True,
         epochs: int = 5, num_rows: int = 20_000):
    # --8<-- [start:fit]
    ds = ray.data.range(num_rows).map_batches(regression_rows, batch_size=None)
    result = TensorflowTrainer(
        train_func, train_loop_config={"epochs": epochs}, datasets={"train": ds},
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name="regression", storage_path=storage_path),
    ).fit()
    print(result.metrics["loss"], result.checkpoint)
    # --8<-- [end:fit]
    return result


if __name__ == "__main__":
    main()

"""Parameter-server training with tf-keras model.fit: W1's MLP, its variables split across the ps.

tf-keras runs model.fit under ParameterServerStrategy when steps_per_epoch is
given (the workers' data repeats without end). raytf's shard goes to model.fit
as it is: each worker reads its own piece. The variable partitioner splits
every variable of at least --min-shard-kib across the parameter servers, as a
large embedding table would be.

    python jobs/train_ps_keras.py                          # starts a local Ray
    ray job submit --working-dir jobs -- python train_ps_keras.py --num-workers 8 --num-ps 4
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

import raytf  # noqa: E402
import raytf.keras  # noqa: E402


# --8<-- [start:train_fn]
def train_fn(config: dict) -> None:
    import tensorflow as tf  # tf.keras is tf-keras here: TensorflowConfig(keras="tf_keras")

    strategy = raytf.strategy()
    shard = raytf.get_dataset_shard("train", batch_size=config["batch_size"], features="x", label="y",
                                    shuffle=True, seed=0)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.Adam(config["lr"]), metrics=["accuracy"],
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=config["steps_per_execution"])
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        raytf.keras.restore(model, resumed)
    model.fit(shard, epochs=config["epochs"], steps_per_epoch=config["steps_per_epoch"], verbose=0,
              initial_epoch=0 if resumed is None else resumed.epoch + 1,
              callbacks=[raytf.keras.ReportCallback()])  # each epoch's logs, with a checkpoint
    kernel = model.layers[0].kernel  # a ShardedVariable: one part per parameter server
    print(f"the first kernel lives in {len(getattr(kernel, 'variables', [kernel]))} parts across the ps")
# --8<-- [end:train_fn]


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=3, batch_size=128, cpus_per_worker=0.5)
    common.parameter_server_flags(p, num_ps=2)
    p.add_argument("--rows", type=int, default=30_000, help="training rows in all")
    p.add_argument("--steps-per-epoch", type=int, default=200)
    p.add_argument("--steps-per-execution", type=int, default=10, help="steps per scheduled function")
    p.add_argument("--min-shard-kib", type=int, default=64, help="variables this large are split across the ps")
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(common)
    import tensorflow as tf

    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=args.min_shard_kib << 10, max_shards=args.num_ps)
    result = raytf.ParameterServerTrainer(
        train_fn, variable_partitioner=partitioner,
        config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                "steps_per_epoch": args.steps_per_epoch, "steps_per_execution": args.steps_per_execution},
        datasets={"train": common.w1_dataset(args.rows)},
        scaling=common.parameter_server_scaling(args),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),
        run=common.run_config(args),
    ).fit()
    common.print_result(result)


if __name__ == "__main__":
    main()

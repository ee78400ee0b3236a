"""TensorFlow's parameter-server training tutorial (tensorflow.org/tutorials/distribute/
parameter_server_training), as a TFJob replica would run it: every task runs this script; workers
and parameter servers start a server and wait, the evaluator evaluates checkpoints as they appear,
the chief trains with ParameterServerStrategy and a ClusterCoordinator custom loop. The data is
generated (no download); each scheduled step counts itself on the ps, and the chief writes what it
saw to --out."""

import argparse
import json
import os
import time

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=200)
args = parser.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
task_type, task_id = cluster_resolver.task_type, cluster_resolver.task_id
checkpoint_dir = os.environ["RAYTF_CHECKPOINT_DIR"]

if task_type in ("worker", "ps"):
    server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=task_type, task_index=task_id,
                                  protocol=cluster_resolver.rpc_layer or "grpc", start=True)
    server.join()


def build_model():
    return tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(16, activation="relu"),
                                tf.keras.layers.Dense(2)])


if task_type == "evaluator":
    model = build_model()
    evaluated = []
    while True:  # until the chief's last checkpoint (tf.keras.utils.SidecarEvaluator does the same)
        latest = tf.train.latest_checkpoint(checkpoint_dir)
        if latest and latest not in evaluated:
            tf.train.Checkpoint(model=model).read(latest).expect_partial()
            evaluated.append(latest)
            with open(os.path.join(args.out, "evaluator.json"), "w") as f:
                json.dump({"evaluated": evaluated}, f)
        time.sleep(0.5)

strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)


def dataset_fn(_):
    x = tf.random.stateless_normal((1024, 16), seed=[1, 2])
    y = tf.cast(x[:, 0] > 0, tf.int64)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(1024).repeat().batch(32)


with strategy.scope():
    model = build_model()
    optimizer = tf.keras.optimizers.SGD(0.1)
    steps = tf.Variable(0, dtype=tf.int64)
per_worker_dataset = coordinator.create_per_worker_dataset(
    lambda: strategy.distribute_datasets_from_function(dataset_fn))
per_worker_iterator = iter(per_worker_dataset)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def step_fn(iterator):
    def replica_fn(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        steps.assign_add(1)
        return loss

    return strategy.run(replica_fn, args=next(iterator))


losses = [coordinator.schedule(step_fn, args=(per_worker_iterator,)) for _ in range(args.steps)]
coordinator.join()
tf.train.Checkpoint(model=model).write(os.path.join(checkpoint_dir, "ckpt"))
with open(os.path.join(checkpoint_dir, "checkpoint"), "w") as f:  # what tf.train.latest_checkpoint reads
    f.write('model_checkpoint_path: "ckpt"\nall_model_checkpoint_paths: "ckpt"\n')
time.sleep(2)  # the evaluator's turn at the last checkpoint
with open(os.path.join(args.out, "chief.json"), "w") as f:
    json.dump({"steps": int(steps.numpy()), "scheduled": args.steps, "first_loss": float(losses[0].fetch()),
               "last_loss": float(losses[-1].fetch()), "tf_config": json.loads(os.environ["TF_CONFIG"])}, f)

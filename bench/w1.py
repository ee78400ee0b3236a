"""Benchmark workload W1, defined once for every system it is run on.

Synthetic classification: 60,000 rows of 784 standard-normal float32 features
(generated per block, seeded by the block's first row id), label = argmax(x @ W)
with W a fixed 784x10 standard-normal matrix (seed 0). MLP 784-128(relu)-10,
Adam, sparse categorical cross-entropy from logits, global batch 256, 3 epochs,
2 workers with 1 CPU and 1 intra/inter-op thread each (and a GPU or a share of one
with a bench's --gpus-per-worker). Trained with tf-keras
``model.fit`` (the path Ray Train supports), so all systems run the same
training code and differ only in how data reaches it.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs"))
import common  # noqa: E402  (W1's data: jobs/common.py)

ROWS = 60_000
DIM = 784
CLASSES = 10
GLOBAL_BATCH = 256
EPOCHS = 3
WORKERS = 2
BLOCKS = 16
# Each worker's dataset yields its own batches of WORKER_BATCH rows; the global
# batch is WORKERS x WORKER_BATCH. Every system hands its per-worker dataset to
# model.fit through distribute_datasets_from_function (see fit()).
WORKER_BATCH = GLOBAL_BATCH // WORKERS
# Keras steps_per_execution, the same for every system compared (bench/throughput.py
# --steps-per-execution sets it, for subprocesses too).
STEPS_PER_EXECUTION = int(os.environ.get("W1_STEPS_PER_EXECUTION", "1"))
STEPS_PER_EPOCH = ROWS // WORKERS // WORKER_BATCH
# GPUs per worker: 0 (the default) trains on CPUs, as defined above. A bench's --gpus-per-worker
# (use_gpus()) changes it for every system alike, its plain-TensorFlow subprocesses too.
GPUS_PER_WORKER = float(os.environ.get("W1_GPUS_PER_WORKER", "0"))
WORKER_ENV = {
    "TF_USE_LEGACY_KERAS": "1",
    "TF_NUM_INTRAOP_THREADS": "1",
    "TF_NUM_INTEROP_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def use_gpus(gpus_per_worker: float) -> None:
    """Train every system compared on GPUs, ``gpus_per_worker`` each.

    Below 1 the workers share a GPU (one GPU machine): they grow their GPU memory as
    they need it rather than each taking all of it, and, since NCCL runs one rank per
    GPU, all-reduce with RING over the host, as on CPUs. At 1 or more every system
    uses NCCL."""
    global GPUS_PER_WORKER
    GPUS_PER_WORKER = float(gpus_per_worker)
    os.environ["W1_GPUS_PER_WORKER"] = str(GPUS_PER_WORKER)  # read again by the plain workers' processes
    _set_worker_env()


def _set_worker_env() -> None:
    # In place: the benches hand this dict to ray.init and subprocesses.
    WORKER_ENV.pop("CUDA_VISIBLE_DEVICES", None)
    WORKER_ENV.pop("TF_FORCE_GPU_ALLOW_GROWTH", None)
    if GPUS_PER_WORKER == 0:
        WORKER_ENV["CUDA_VISIBLE_DEVICES"] = ""
    elif GPUS_PER_WORKER < 1:
        WORKER_ENV["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"


_set_worker_env()


GPU_FLAG_HELP = ("GPUs per worker, for every system alike (default 0: CPUs only); below 1 the workers share "
                 "a GPU and all-reduce with RING, at 1 or more with NCCL")


def plain_worker_gpus(rank: int) -> dict:
    """The plain anchor's rank ``rank`` process: its own GPUs when each worker has whole ones."""
    if GPUS_PER_WORKER < 1:
        return {}
    count = int(GPUS_PER_WORKER)
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(rank * count + i) for i in range(count))}


def communication() -> str:
    """The collective implementation every system uses: NCCL with a GPU per worker, else RING."""
    return "nccl" if GPUS_PER_WORKER >= 1 else "ring"


def raytf_scaling():
    import raytf

    return raytf.ScalingConfig(num_workers=WORKERS, cpus_per_worker=1, gpus_per_worker=GPUS_PER_WORKER)


def ray_train_scaling():
    from ray.train import ScalingConfig

    resources = {"CPU": 1, **({"GPU": GPUS_PER_WORKER} if GPUS_PER_WORKER else {})}
    return ScalingConfig(num_workers=WORKERS, use_gpu=GPUS_PER_WORKER > 0, resources_per_worker=resources)


def mwms_strategy():
    """MultiWorkerMirroredStrategy from TF_CONFIG, communication() collectives, one thread each:
    how the anchors (plain TensorFlow, Ray Train) build theirs."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    implementation = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=implementation.NCCL if communication() == "nccl" else implementation.RING
        )
    )


def ray_dataset():
    """W1 as a materialized Ray Dataset (columns x: 784-float tensor, y: int64), built by the
    same code as the jobs' (jobs/common.py): one definition of the workload."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(common)  # Ray Data's tasks cannot import jobs/ modules
    return common.w1_dataset(ROWS, blocks=BLOCKS).materialize()


def model_layers(keras) -> list:
    """W1's model: MLP 784-128(relu)-10."""
    return [keras.Input((DIM,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(CLASSES)]


def fit(dataset, strategy, distribute: bool = True, steps_per_execution: int | None = None, *,
        layers=model_layers, epochs: int = EPOCHS, steps_per_epoch: int = STEPS_PER_EPOCH,
        worker_batch: int = WORKER_BATCH, accumulate_steps: int = 1, local_sgd_steps: int = 1) -> dict:
    """Train the W1 model on this worker's dataset; return per-epoch timings and the loss.

    The dataset holds this worker's rows only. Passed straight to model.fit,
    MultiWorkerMirroredStrategy would treat each batch as the global batch and
    train on this worker's 1/WORKERS slice of it, silently dropping the rest
    (static batch size), or split every batch in WORKERS (unknown batch size).
    distribute_datasets_from_function takes the batches as they are; tf-keras
    then needs steps_per_epoch and a repeated dataset.

    ``distribute=False`` hands the dataset to model.fit directly, as Ray
    Train's examples do with ``to_tf``: its batches have an unknown size, so
    each is split in WORKERS and the run trains at half the global batch, with
    twice the steps (and all-reduces) per epoch.

    ``layers``, ``epochs``, ``steps_per_epoch`` and ``worker_batch`` make it another
    workload's fit (bench/w2.py); ``accumulate_steps`` > 1 applies
    ``raytf.keras.accumulate_gradients(model, steps=...)``, ``local_sgd_steps`` > 1
    ``raytf.keras.local_sgd(model, steps=...)``.
    """
    import tensorflow as tf

    keras = tf.keras  # tf-keras, since TF_USE_LEGACY_KERAS=1 is set before TensorFlow loads

    class EpochTimer(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.epochs, self.steps = [], 0

        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.steps = time.perf_counter(), 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append((time.perf_counter() - self.start, self.steps))

    keras.utils.set_random_seed(0)  # the same initial weights in every system and run compared
    with strategy.scope():
        model = keras.Sequential(layers(keras))
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            steps_per_execution=steps_per_execution or STEPS_PER_EXECUTION,
        )
    if accumulate_steps > 1:
        import raytf.keras

        raytf.keras.accumulate_gradients(model, steps=accumulate_steps)
    if local_sgd_steps > 1:
        import raytf.keras

        raytf.keras.local_sgd(model, steps=local_sgd_steps)
    timer = EpochTimer()
    if distribute:
        distributed = strategy.distribute_datasets_from_function(lambda _: dataset.repeat())
        history = model.fit(
            distributed, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=[timer]
        )
    else:
        history = model.fit(dataset, epochs=epochs, verbose=0, callbacks=[timer])
    seconds, steps = timer.epochs[-1]
    return {
        "last_epoch_s": seconds,
        "steps_per_epoch": steps,
        # Either way every row of every shard is trained on once per epoch.
        "samples_per_s": WORKERS * steps_per_epoch * worker_batch / seconds,
        "loss": float(history.history["loss"][-1]),
    }

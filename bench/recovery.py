"""Recovery from a killed worker on W1: raytf against Ray Train's TensorflowTrainer, in one invocation.

    python bench/recovery.py [--systems raytf,raytf_warm,raytf_kept,ray_train] [--kill-step 351]

Each system trains W1 (tf-keras ``model.fit``, a checkpoint of the model and
optimizer at every epoch end, resuming from the latest one) twice: once
without a fault, once with rank 1 killed (``os._exit``) in the middle of
epoch 1. Prints one JSON line per run and a summary line:

- ``resume_s``: seconds from the kill to the first training step of the retry, and
  (raytf) ``resume_components_s``, the same seconds in parts: the driver noticing the
  loss, stopping the group, the retry's placement, actors, loading (TensorFlow's
  import, ``train_fn``) and connect, then the dataset shard, the model and its
  restore, and the first step (tracing, distributing the data);
- ``steps_redone``: steps trained twice (the kill's step minus the step the
  retry resumed from; the work since the last checkpoint is the least possible);
- ``retries``: attempts after the first;
- ``wall_s`` and ``wall_vs_fault_free``: fit() wall time, and its ratio to the
  same system's fault-free run.

raytf's restarts three ways: ``raytf`` cold (every rank a new process: ``keep_survivors=False``),
``raytf_warm`` in warm standbys alone (``warm_standby=True``), ``raytf_kept`` as by default on CPU
workers (the rank that outlived the attempt kept in its process, ``keep_survivors``; the lost one new).

Target here: raytf resumes within 3 s of the kill with warm standbys (`raytf_warm`), redoes at most the work
since the last checkpoint, and uses one retry.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402

KILL_STEP = w1.STEPS_PER_EPOCH + w1.STEPS_PER_EPOCH // 2  # the middle of epoch 1


def _mark(marks: str, name: str, value: dict) -> None:
    with open(os.path.join(marks, name), "a") as f:
        f.write(json.dumps(value) + "\n")


def _read_marks(marks: str, name: str) -> list[dict]:
    path = os.path.join(marks, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_w1(strategy, dataset, *, rank: int, restore, save, marks: str, kill_step: int | None) -> None:
    """W1 with tf-keras model.fit, one checkpoint per epoch, resumed by ``restore``.

    ``restore(trackables) -> initial_epoch`` loads the latest checkpoint, if
    any; ``save(trackables, epoch, step, loss)`` checkpoints and reports. Marks
    written for the driver: ``start`` (each attempt), ``resumed`` (the first
    step after a resume), ``killed`` (the step and time of the kill), ``entered`` (each
    attempt's entry here, its dataset shard made).
    """
    import tensorflow as tf

    if rank == 0:
        _mark(marks, "entered", {"time": time.time()})
    keras = tf.keras  # tf-keras: TF_USE_LEGACY_KERAS=1 is set before TensorFlow loads
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((w1.DIM,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(w1.CLASSES)]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    trackables = {"model": model, "optimizer": model.optimizer}
    initial_epoch = restore(trackables)
    if rank == 0:
        _mark(marks, "start", {"time": time.time(), "initial_epoch": initial_epoch})

    class Hooks(keras.callbacks.Callback):
        step = initial_epoch * w1.STEPS_PER_EPOCH
        first = True

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            if self.first and initial_epoch > 0 and rank == 0:
                _mark(marks, "resumed", {"time": time.time(), "from_step": initial_epoch * w1.STEPS_PER_EPOCH})
            self.first = False
            if kill_step is not None and rank == 1 and self.step == kill_step:
                if not _read_marks(marks, "killed"):
                    _mark(marks, "killed", {"time": time.time(), "step": self.step})
                    os._exit(1)

        def on_epoch_end(self, epoch, logs=None):
            save(trackables, epoch, self.step, float(logs["loss"]))

    distributed = strategy.distribute_datasets_from_function(lambda _: dataset.repeat())
    model.fit(
        distributed, epochs=w1.EPOCHS, initial_epoch=initial_epoch, steps_per_epoch=w1.STEPS_PER_EPOCH,
        callbacks=[Hooks()], verbose=0,
    )


def _raytf_train(config):
    import raytf

    ctx = raytf.get_context()
    if ctx.world_rank == 0:
        _mark(config["marks"], "called", {"time": time.time()})  # train_fn called: the strategy is up

    def restore(trackables):
        checkpoint = raytf.get_checkpoint()
        if checkpoint is None:
            return 0
        checkpoint.restore_state(**trackables)
        return checkpoint.epoch + 1

    def save(trackables, epoch, step, loss):
        raytf.report({"epoch": epoch, "step": step, "loss": loss},
                     checkpoint=raytf.Checkpoint.from_state(**trackables))

    dataset = raytf.get_dataset_shard("train", batch_size=w1.WORKER_BATCH, features="x", label="y",
                                      drop_remainder=True)
    train_w1(raytf.strategy(), dataset, rank=ctx.world_rank, restore=restore, save=save,
          marks=config["marks"], kill_step=config["kill_step"])


def run_raytf(dataset, workdir: str, marks: str, kill_step: int | None, warm_standby: bool = False,
              keep_survivors: bool = False) -> dict:
    import raytf

    start = time.perf_counter()
    result = raytf.Trainer(
        _raytf_train,
        config={"marks": marks, "kill_step": kill_step},
        datasets={"train": dataset},
        scaling=w1.raytf_scaling(),
        run=raytf.RunConfig(name=f"recovery-raytf-{kill_step}-{warm_standby}-{keep_survivors}", storage_path=workdir,
                            verbose=0, failure_config=raytf.FailureConfig(max_failures=3, warm_standby=warm_standby,
                                                                          keep_survivors=keep_survivors)),
        tensorflow=raytf.TensorflowConfig(communication=w1.communication(), worker_env={"TF_USE_LEGACY_KERAS": "1"}),
    ).fit()
    # Where the retry's start went (placement, actors, loading, connect, first step), from result.startup,
    # and when the driver noticed the loss (the first failure's time).
    retry = result.startup[1] if len(result.startup) > 1 else None
    noticed = result.failures[0].time if result.failures else None
    return {"wall_s": time.perf_counter() - start, "loss": result.metrics["loss"], "failed": None,
            "retry_startup_s": retry, "noticed": noticed}


def _ray_train_train(config):
    import tensorflow as tf
    from ray import train

    strategy = w1.mwms_strategy()
    rank = train.get_context().get_world_rank()

    def restore(trackables):
        checkpoint = train.get_checkpoint()
        if checkpoint is None:
            return 0
        local = checkpoint.to_directory(tempfile.mkdtemp())  # kept: slots restore on first use
        tf.train.Checkpoint(**trackables).read(os.path.join(local, "state"))
        with open(os.path.join(local, "epoch.json")) as f:
            return json.load(f)["epoch"] + 1

    def save(trackables, epoch, step, loss):
        directory = tempfile.mkdtemp()
        tf.train.Checkpoint(**trackables).write(os.path.join(directory, "state"))  # every rank
        with open(os.path.join(directory, "epoch.json"), "w") as f:
            json.dump({"epoch": epoch}, f)
        checkpoint = train.Checkpoint.from_directory(directory) if rank == 0 else None
        train.report({"epoch": epoch, "step": step, "loss": loss}, checkpoint=checkpoint)

    dataset = train.get_dataset_shard("train").to_tf("x", "y", batch_size=w1.WORKER_BATCH, drop_last=True)
    train_w1(strategy, dataset, rank=rank, restore=restore, save=save,
             marks=config["marks"], kill_step=config["kill_step"])


def run_ray_train(dataset, workdir: str, marks: str, kill_step: int | None) -> dict:
    from ray.train import FailureConfig, RunConfig
    from ray.train.tensorflow import TensorflowTrainer

    start = time.perf_counter()
    result = TensorflowTrainer(
        _ray_train_train,
        train_loop_config={"marks": marks, "kill_step": kill_step},
        datasets={"train": dataset},
        scaling_config=w1.ray_train_scaling(),
        run_config=RunConfig(name=f"recovery-ray-train-{kill_step}", storage_path=workdir,
                             failure_config=FailureConfig(max_failures=3)),
    ).fit()
    wall = time.perf_counter() - start
    failed = None if result.error is None else repr(result.error)[:300]
    loss = (result.metrics or {}).get("loss")
    return {"wall_s": wall, "loss": loss, "failed": failed}


def run_raytf_warm(dataset, workdir: str, marks: str, kill_step: int | None) -> dict:
    """raytf with FailureConfig(warm_standby=True): the retry's workers are standbys that
    imported TensorFlow and loaded train_fn while the first attempt trained."""
    return run_raytf(dataset, workdir, marks, kill_step, warm_standby=True)


def run_raytf_kept(dataset, workdir: str, marks: str, kill_step: int | None) -> dict:
    """raytf as by default on CPU workers: the retry keeps the rank that outlived the attempt in its
    process (FailureConfig.keep_survivors); only the lost rank's is new."""
    return run_raytf(dataset, workdir, marks, kill_step, keep_survivors=True)


SYSTEMS = {"raytf": run_raytf, "raytf_warm": run_raytf_warm, "raytf_kept": run_raytf_kept, "ray_train": run_ray_train}


def _components(killed: float, retry: dict | None, noticed: float | None, marks: str) -> dict | None:
    """resume_s in parts, from the clocks of the driver and of rank 0 (one machine, one clock):
    the driver noticing the loss (``detect``); stopping the group and starting the retry's, up to
    the strategy connected (``stop``, ``placement``, ``actors``, ``loading``, ``connect``: the last
    four from result.startup, which the driver measures at its polls, so ``stop`` also holds their
    rounding); then, in train_fn, the dataset shard (``dataset``), building the model and
    restoring the checkpoint (``model_and_restore``), and the first step (``first_step``: tracing,
    distributing the data)."""
    after = {name: [m["time"] for m in _read_marks(marks, name) if m["time"] > killed]
             for name in ("called", "entered", "start", "resumed")}
    if not retry or noticed is None or not all(after.values()):
        return None
    called, entered, start, resumed = (after[name][0] for name in ("called", "entered", "start", "resumed"))
    group = {k: retry[k] for k in ("placement", "actors", "loading", "connect")}
    return {
        "detect": round(noticed - killed, 2),
        "stop": round(max(0.0, called - noticed - sum(group.values())), 2),
        **group,
        "dataset": round(entered - called, 2),
        "model_and_restore": round(start - entered, 2),
        "first_step": round(resumed - start, 2),
    }


def measure(system: str, dataset, workdir: str, kill_step: int | None) -> dict:
    marks = tempfile.mkdtemp(dir=workdir, prefix=f"marks-{system}-")
    outcome = SYSTEMS[system](dataset, workdir, marks, kill_step)
    noticed = outcome.pop("noticed", None)
    starts = _read_marks(marks, "start")
    line = {"system": system, "fault": kill_step is not None, **outcome, "retries": len(starts) - 1}
    killed, resumed = _read_marks(marks, "killed"), _read_marks(marks, "resumed")
    if killed:
        line["killed_at_step"] = killed[0]["step"]
        if resumed:
            line["resume_s"] = round(resumed[0]["time"] - killed[0]["time"], 2)
            line["resumed_from_step"] = resumed[0]["from_step"]
            line["steps_redone"] = killed[0]["step"] - resumed[0]["from_step"]
            components = _components(killed[0]["time"], outcome.get("retry_startup_s"), noticed, marks)
            if components:
                line["resume_components_s"] = components
        else:
            # No resumed step: the retry started from scratch (or never started).
            line["resumed_from_step"] = 0 if len(starts) > 1 else None
            line["steps_redone"] = killed[0]["step"] if len(starts) > 1 else None
            later = [s for s in starts if s["time"] > killed[0]["time"]]
            if later:
                line["restart_s"] = round(later[0]["time"] - killed[0]["time"], 2)
        # The least that must be redone: the steps since the last epoch-end checkpoint.
        line["steps_since_checkpoint"] = killed[0]["step"] % w1.STEPS_PER_EPOCH
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--kill-step", type=int, default=KILL_STEP)
    parser.add_argument("--epochs", type=int, default=w1.EPOCHS,
                        help="W1's epochs (3); more let a fast machine's standbys load TensorFlow before the kill")
    parser.add_argument("--gpus-per-worker", type=float, default=0, help=w1.GPU_FLAG_HELP)
    args = parser.parse_args()
    w1.use_gpus(args.gpus_per_worker)
    w1.EPOCHS = args.epochs  # pickled with w1 to the workers

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": w1.WORKER_ENV}, log_to_driver=False, include_dashboard=False)
    dataset = w1.ray_dataset()
    summary = {}
    with tempfile.TemporaryDirectory() as workdir:
        for system in args.systems.split(","):
            clean = measure(system, dataset, workdir, None)
            print(json.dumps(clean), flush=True)
            faulty = measure(system, dataset, workdir, args.kill_step)
            faulty["wall_vs_fault_free"] = round(faulty["wall_s"] / clean["wall_s"], 2)
            print(json.dumps(faulty), flush=True)
            summary[system] = {k: faulty.get(k) for k in (
                "resume_s", "resume_components_s", "restart_s", "steps_redone", "steps_since_checkpoint", "retries", "wall_vs_fault_free", "failed",
            ) if k in faulty}
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

"""Training functions the integration tests run on raytf workers.

conftest registers this module to be pickled by value, so worker processes
(which cannot import the tests package) receive these functions whole.
"""

from __future__ import annotations

import json
import os
import signal
import shutil
import time
from typing import Any

import raytf
import raytf.keras
from tests.hidden import TEST_ONLY  # a tuple: it travels with the functions pickled by value


def _write(out_dir: str, name: str, value: dict) -> None:
    tmp = os.path.join(out_dir, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, os.path.join(out_dir, name))


def describe_worker() -> dict:
    """What this worker sees: its ranks, TF_CONFIG, TensorFlow settings and strategy."""
    import ray
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    options = strategy.extended._communication_options
    # A collective over every worker: the sum of (rank + 1) proves they are one group.
    total = strategy.reduce(
        tf.distribute.ReduceOp.SUM,
        strategy.run(lambda: tf.constant(float(ctx.world_rank + 1))),
        axis=None,
    )
    return {
        "world_rank": ctx.world_rank,
        "world_size": ctx.world_size,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "node_rank": ctx.node_rank,
        "num_nodes": ctx.num_nodes,
        "attempt": ctx.attempt,
        "run_name": ctx.run_name,
        "node_id": ray.get_runtime_context().get_node_id(),
        "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "context_tf_config": json.loads(ctx.tf_config),
        "intra_env": os.environ.get("TF_NUM_INTRAOP_THREADS"),
        "intra_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "is_mwms": isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy),
        "replicas": strategy.num_replicas_in_sync,
        "implementation": options.implementation.name,
        "timeout_seconds": options.timeout_seconds,
        "collective_sum": float(total),
        "pid": os.getpid(),
        # How its process started (TensorflowConfig.start_method): the fork server it was forked
        # from (None: spawned), its parent, and a draw of NumPy's global generator, which a fork
        # server's child draws anew (none of this module's callers seeds it before).
        "forkserver": os.environ.get("RAYTF_FORKSERVER"),
        "ppid": os.getppid(),
        "numpy_draw": float(__import__("numpy").random.random()),
    }


def make_data(rows: int, seed: int, dim: int = 32, classes: int = 4):
    import numpy as np

    w = np.random.default_rng(0).standard_normal((dim, classes)).astype("float32")
    x = np.random.default_rng(seed).standard_normal((rows, dim)).astype("float32")
    return x, np.argmax(x @ w, axis=1).astype("int64")


def small_train(config: dict) -> None:
    """A small MLP trained with a custom loop under the worker's MWMS; reports each epoch."""
    import tensorflow as tf

    ctx = raytf.get_context()
    info = describe_worker()
    strategy = raytf.strategy()
    global_batch = 64
    x, y = make_data(1024, seed=100 + ctx.world_rank)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch // ctx.world_size)
    dist = strategy.distribute_datasets_from_function(lambda _: data)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)]
        )
        optimizer = tf.keras.optimizers.Adam(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(batch):
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(labels, model(features)), global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    for epoch in range(config.get("epochs", 4)):
        losses = [float(train_step(batch)) for batch in dist]
        raytf.report({"epoch": epoch, "loss": sum(losses) / len(losses)})
    info["weights_sum"] = float(sum(float(tf.reduce_sum(v)) for v in model.trainable_variables))
    _write(config["out_dir"], f"rank{ctx.world_rank}.json", info)


def report_until_stopped(config: dict) -> None:
    """Reports forever; the test stops the run from the driver."""
    ctx = raytf.get_context()
    step = 0
    while True:
        raytf.report({"step": step})
        if step == 3:
            _write(config["out_dir"], f"running{ctx.world_rank}", {"pid": os.getpid()})
        step += 1
        time.sleep(0.05)


def checkpoints_until_stopped(config: dict) -> None:
    """A directory checkpoint every report, forever, each rank in step with the other (a collective
    a report); the test stops the run from the driver. Writes running<rank> after 2 reports."""
    import tempfile

    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    step = 0
    while True:
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "owner.txt"), "w") as f:
            f.write(f"step {step}")
        raytf.report({"step": step}, checkpoint=raytf.Checkpoint.from_directory(directory))
        if step == 2:
            _write(config["out_dir"], f"running{ctx.world_rank}", {"pid": os.getpid()})
        step += 1
        time.sleep(0.05)


def gated_filesystem(gate: str) -> Any:
    """The local filesystem, except that a checkpoint file written while the file ``gate`` exists
    waits until it is gone (``<gate>.blocked`` says one waits): an upload held in flight."""
    import fsspec
    import pyarrow.fs as pafs

    class Gated(pafs.FSSpecHandler):
        def open_output_stream(self, path: str, metadata: Any) -> Any:
            if path.endswith("owner.txt") and os.path.exists(gate):
                open(gate + ".blocked", "w").close()
                while os.path.exists(gate):
                    time.sleep(0.05)
            return super().open_output_stream(path, metadata)

    return pafs.PyFileSystem(Gated(fsspec.filesystem("file")))


def fail_on_rank(config: dict) -> None:
    """Rank ``config['rank']`` raises after one report; the others wait in a collective.

    The report carries a 1 MiB state checkpoint: with ``upload="sync"`` it returns on every rank
    once the checkpoint is committed and kept in host memory on the chief's node, and a collective
    comes between it and the raise."""
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    raytf.report({"epoch": 0}, checkpoint=raytf.Checkpoint.from_state(table=tf.Variable(tf.zeros([1 << 18]))))
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    if ctx.world_rank == config["rank"]:
        raise ValueError(f"bad batch on rank {ctx.world_rank}")
    strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)
    time.sleep(600)


def _process_started_at() -> float:
    """When this process was created (Linux: /proc), in time.time() seconds."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, after the command's ")"
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


def exit_after_warm_up(config: dict) -> None:
    """Attempt 0: one report (the driver starts CPU workers' standbys then; with
    ``standbys_at_start``, GPU workers', none: they start with the workers); rank 1 waits until the
    ``warm_standbys`` standbys are up (the driver makes them once the ranks have answered for the
    shards they read), notes the time and kills its own process. With ``kill_standby`` (an
    attempt), that attempt does the same after its report, but kills the first standby made for it
    instead of waiting (it dies before it is needed). Every attempt writes, per rank, its pid, when
    its process was created, its actor's name, and the ``id`` values of each dataset's shard it
    read, its node and GPUs (attempt<a>_rank<r>.json). With ``lose_node`` (an attempt), that
    attempt reports, rank 1 waits until the standbys made for it are up and writes hold<a>.json
    with its node, and both ranks wait to be stopped (the test takes that node away). The attempt
    after the last loss trains small_train."""
    ctx = raytf.get_context()
    ids = {}
    for name in config.get("datasets", []):
        shard = raytf.get_dataset_shard(name, batch_size=4, features="id")
        ids[name] = sorted(int(v) for batch in shard for v in batch.numpy())
    import ray

    _write(config["out_dir"], f"attempt{ctx.attempt}_rank{ctx.world_rank}.json",
           {"pid": os.getpid(), "process_started": _process_started_at(), "ids": ids,
            "actor": ray.get_runtime_context().get_actor_name(), "node_id": ray.get_runtime_context().get_node_id(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()], "forkserver": os.environ.get("RAYTF_FORKSERVER")})
    kill_standby = config.get("kill_standby")
    if ctx.attempt == config.get("lose_node"):
        raytf.report({"warming_up": 1})  # the driver keeps the shards read and makes standbys
        if ctx.world_rank == 1:
            first = config["warm_standbys"] * ctx.attempt + 1
            _wait_until_up([f"raytf:{ctx.run_name}:standby:{n}" for n in range(first, first + config["warm_standbys"])])
            _write(config["out_dir"], f"hold{ctx.attempt}.json", {"node_id": ray.get_runtime_context().get_node_id()})
        time.sleep(600)  # until the group is stopped: the test takes rank 1's node away
    if ctx.attempt == 0 or ctx.attempt == kill_standby:
        if not config.get("standbys_at_start"):
            raytf.report({"warming_up": 1})  # a report: the driver starts the standbys now
        if ctx.world_rank == 1:
            if ctx.attempt == kill_standby:  # one standby dies before it is needed
                _kill_actor(f"raytf:{ctx.run_name}:standby:{config.get('warm_standbys', 0) * ctx.attempt + 1}")
            else:
                _wait_until_up([f"raytf:{ctx.run_name}:standby:{n}" for n in range(1, config["warm_standbys"] + 1)])
            if config.get("devices_in_standby"):  # standby 1's TensorFlow lists its devices: it cannot take GPUs
                standby = _actor(f"raytf:{ctx.run_name}:standby:1", time.monotonic() + 60)
                ray.get(standby.__ray_call__.remote(_list_devices), timeout=120)
            _write(config["out_dir"], f"killed{ctx.attempt}.json", {"time": time.time()})
            os._exit(1)
        time.sleep(600)  # rank 0 waits to be stopped with the group
    small_train(config)


def _list_devices(actor) -> int:
    """Run in an actor (``__ray_call__``): TensorFlow lists the process's devices, as a module that
    does so when imported would."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices())


def _actor(name: str, deadline: float):
    """The actor ``name``, once it exists."""
    import ray

    while True:
        try:
            return ray.get_actor(name)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _wait_until_up(names: list, timeout_s: float = 120.0) -> None:
    """Return once each actor named exists and its process answers (a standby: up, and warming or warm)."""
    import ray

    deadline = time.monotonic() + timeout_s
    ray.get([_actor(name, deadline).__ray_ready__.remote() for name in names], timeout=timeout_s)


def _wait_for_commit(run_path: str, epoch: int, timeout_s: float = 60.0) -> None:
    """Wait until the run's checkpoint index (on a local disk) names a checkpoint of ``epoch``."""
    index = os.path.join(run_path, "checkpoints", "index.json")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(index) as f:
                if any(c.get("epoch") == epoch for c in json.load(f)["checkpoints"]):
                    return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"no checkpoint of epoch {epoch} was committed in {timeout_s:g} s")


def _kill_actor(name: str, timeout_s: float = 60.0) -> None:
    """Wait for the actor ``name`` to exist, kill it, and return once Ray knows it dead."""
    import ray

    deadline = time.monotonic() + timeout_s
    actor = _actor(name, deadline)
    ray.kill(actor, no_restart=True)
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=deadline - time.monotonic())
        except ray.exceptions.RayActorError:
            return
    raise TimeoutError(f"{name} still answers after ray.kill")


def shard_epochs(config: dict) -> None:
    """For each request in config['requests'], two epochs of this worker's shard:
    batch sizes, the ``id`` column's values in order, and the element spec."""
    import tensorflow as tf

    ctx = raytf.get_context()
    out = {}
    for key, request in config["requests"].items():
        dataset = raytf.get_dataset_shard(**request)
        out[key] = {"spec": repr(dataset.element_spec), "epochs": []}
        for _ in range(config.get("epochs", 2)):
            sizes, ids = [], []
            for element in dataset:
                features = element[0] if request.get("label") else element
                first = features if isinstance(features, tf.Tensor) else features[sorted(features)[0]]
                sizes.append(int(first.shape[0]))
                if isinstance(features, dict) and "id" in features:
                    ids.extend(int(v) for v in features["id"].numpy().reshape(-1))
            out[key]["epochs"].append({"sizes": sizes, "ids": ids})
    _write(config["out_dir"], f"rank{ctx.world_rank}.json", out)


def in_turn(config: dict) -> None:
    """Each ``(workload's name, its config)`` of ``config["parts"]`` in turn, in the same workers: several
    checks of one test file share a run (test_data.py)."""
    workloads = {"shard_epochs": shard_epochs, "train_from_shards": train_from_shards, "bad_requests": bad_requests}
    for name, part in config["parts"]:
        workloads[name](part)


def bad_requests(config: dict) -> None:
    """Each bad request in turn; records the message of the error each raises; then, given
    ``config["unhandled"]``, once every rank has recorded its messages (and reported what it
    trained before), rank 0 makes that request without catching its error while the others wait in
    a collective. The run's error is then always rank 0's, after its reports and files: a rank that
    raised at once would end the run while a slower rank was still in an earlier part."""
    import tensorflow as tf

    ctx = raytf.get_context()
    messages = {}
    for key, request in config["requests"].items():
        try:
            raytf.get_dataset_shard(**request)
            messages[key] = None
        except raytf.DatasetShardError as error:
            messages[key] = str(error)
    _write(config["out_dir"], f"rank{ctx.world_rank}.json", messages)
    if config.get("unhandled"):
        strategy = raytf.strategy()

        def barrier():
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)

        barrier()  # every rank is past its earlier parts and has written its messages
        if ctx.world_rank == 0:
            raytf.get_dataset_shard(**config["unhandled"])
        barrier()  # never completes: rank 0's error ends the run


def train_from_shards(config: dict) -> None:
    """The small MLP, trained from this worker's shard of the 'train' dataset; given
    ``config["sources"]`` (dataset name -> its features, dim and cache), one MLP per dataset in
    turn, in the same processes, each report naming its dataset (``source``)."""
    for name, source in (config.get("sources") or {"train": config}).items():
        _train_mlp_from_shard(name, source, config.get("epochs", 4), "sources" in config)


def _train_mlp_from_shard(name: str, config: dict, epochs: int, tagged: bool) -> None:
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    dataset = raytf.get_dataset_shard(
        name, batch_size=32, features=config["features"], label="y", shuffle=True, seed=3,
        cache=config.get("cache", True),
    )
    distributed = strategy.distribute_datasets_from_function(lambda _: dataset)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((config["dim"],)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)]
        )
        optimizer = tf.keras.optimizers.Adam(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def to_matrix(x):
        return x if not isinstance(x, dict) else tf.stack([x[k] for k in config["features"]], axis=1)

    @tf.function
    def train_step(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(to_matrix(x))), global_batch_size=32 * ctx.world_size)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    for epoch in range(epochs):
        losses = [float(train_step(batch)) for batch in distributed]
        raytf.report({"epoch": epoch, "loss": sum(losses) / len(losses), "steps": len(losses),
                      **({"source": name} if tagged else {})})


def _die_mid_upload(directory: str, checkpoints: str) -> None:
    """Make the coming upload slow (64 MB to copy and checksum) and exit as soon as it has
    begun writing: long before the driver could have recorded it in the index."""
    import threading

    with open(os.path.join(directory, "zz-padding.bin"), "wb") as padding:
        padding.truncate(64 << 20)  # sparse on disk, 64 MB to read and write

    def kill_when_staging_appears():
        while not any(name.startswith(".staging-") for name in os.listdir(checkpoints)):
            time.sleep(0.001)
        os._exit(1)

    threading.Thread(target=kill_when_staging_appears, daemon=True).start()


def checkpointed_train(config: dict) -> None:
    """The small MLP with a tf.train.Checkpoint each epoch; resumes from raytf.get_checkpoint().

    ``kill_after``: on attempt 0 the chief exits the instant the checkpoint of that epoch was
    committed (with ``upload="sync"``, the instant its report returned).
    """
    import tempfile

    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    x, y = make_data(512, seed=100 + ctx.world_rank)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    dist = strategy.distribute_datasets_from_function(lambda _: data)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)]
        )
        optimizer = tf.keras.optimizers.Adam(0.01)
        # Create the optimizer's slots now: a restore into variables that do not
        # exist yet is deferred, and would read the files after as_directory() is gone.
        optimizer.build(model.trainable_variables)
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(batch):
        def step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(labels, model(features)), global_batch_size=64)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    start = 0
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory:
            state.read(os.path.join(directory, "state")).assert_existing_objects_matched()
        start = resumed.epoch + 1
    for epoch in range(start, config["epochs"]):
        losses = [float(train_step(batch)) for batch in dist]
        directory = tempfile.mkdtemp()
        state.write(os.path.join(directory, "state"))  # every rank saves; only the chief's is kept
        if ctx.world_rank == 0 and ctx.attempt == 0 and epoch == config.get("kill_during_save"):
            _die_mid_upload(directory, os.path.join(ctx.run_path, "checkpoints"))
        raytf.report(
            {"epoch": epoch, "loss": sum(losses) / len(losses), "resumed_at": start},
            checkpoint=raytf.Checkpoint.from_directory(directory),
        )
        if ctx.world_rank == 0 and ctx.attempt == 0 and epoch == config.get("kill_after"):
            # Once committed: with upload="sync" that is when report returned (finish_uploads waits
            # for nothing); with the asynchronous default, when the background upload's commit came.
            from raytf._internal.worker import session as _session

            _session.current("report").finish_uploads()
            os._exit(1)
        shutil.rmtree(directory)  # as report returned: with asynchronous uploads, raytf uploads its own copy


def lose_rank_1_every_way(config: dict) -> None:
    """Rank 1 is lost once each way a worker goes. On attempt 0 it never joins: its config holds
    a StallOnce (``stall``), whose unpickling hangs. On attempt 1 it stops its own process
    (SIGSTOP: alive, but silent); on attempt 2 rank 0 fails with the error a collective raises when
    a peer is unreachable; on attempt 3 rank 1 records its actor's name in ``rank1_attempt3.json``
    and reports until the test kills the actor with ``ray.kill`` (a process that exits or is
    killed any other way dies the same way to the driver: test_scale.py, test_keras.py). Whatever
    else runs trains small_train."""
    import signal

    import ray
    import tensorflow as tf

    ctx = raytf.get_context()
    if ctx.attempt == 2 and ctx.world_rank == 0:
        raytf.report({"epoch": -1})
        raise tf.errors.UnavailableError(None, None, "Collective ops is aborted by: peer 1 is unreachable")
    if ctx.world_rank == 1 and ctx.attempt in (1, 3):
        raytf.report({"epoch": -1})
        if ctx.attempt == 3:
            _write(config["out_dir"], "rank1_attempt3.json", {"actor_name": ray.get_runtime_context().get_actor_name()})
            for step in range(600):  # until the test's ray.kill (at most a minute)
                raytf.report({"epoch": -1, "step": step})
                time.sleep(0.1)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGSTOP)
    small_train(config)


def mlp_features(batch):
    """Ray Data batch -> the small MLP's inputs: 32 features and 4 classes from each row's id."""
    import numpy as np

    w = np.random.default_rng(0).standard_normal((32, 4)).astype("float32")
    x = np.stack([np.random.default_rng(int(i)).standard_normal(32).astype("float32") for i in batch["id"]])
    return {"x": x, "y": np.argmax(x @ w, axis=1).astype("int64")}


def resumable_train(config: dict) -> None:
    """The small MLP on this worker's shard of "train", written the way raytf's docs advise.

    Deterministic (seeded, op determinism on, a seeded per-epoch shuffle); one
    ``Checkpoint.from_state`` per epoch (CheckpointConfig decides which are
    kept); ``raytf.preemption_requested()`` every ``check_every`` steps, which
    saves at the current step and returns. On resume it restores the model
    and optimizer and goes on from the epoch after the last completed one:
    after a mid-epoch checkpoint the shard's first pass is the rest of that
    epoch (raytf counted the batches the loop took), so nothing is skipped.
    Metrics name ``epoch`` the last *completed* epoch and ``step`` the global step.

    Test hooks, on attempt 0 only (or each attempt of ``hook_attempts``): ``mark_step`` (the
    attempt's step, counted from where it resumed: write running<rank>.json, on a later attempt
    running<rank>_attempt<n>.json, with the pid and node; with ``hold_after_mark``, then wait
    there), ``step_sleep`` (seconds per step), ``kill`` ({rank, step}: that rank exits at that step).
    """
    import numpy as np
    import ray
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    tf.keras.utils.set_random_seed(config.get("seed", 0))
    tf.config.experimental.enable_op_determinism()
    global_batch = config.get("global_batch", 32)
    dataset = raytf.get_dataset_shard(
        "train", global_batch_size=global_batch, features="x", label="y", shuffle=True, seed=5,
        drop_remainder=True,
    )
    per_worker = global_batch // ctx.world_size
    distributed = strategy.distribute_datasets_from_function(lambda _: dataset)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)]
        )
        optimizer = tf.keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=batch), axis=None)

    step, start_epoch, resumed_at = 0, 0, None
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        resumed.restore_state(model=model, optimizer=optimizer)
        step, start_epoch, resumed_at = resumed.step, resumed.epoch + 1, resumed.step
    first_attempt = ctx.attempt in config.get("hook_attempts", [0])
    mark_step = None if config.get("mark_step") is None else (resumed_at or 0) + config["mark_step"]
    for epoch in range(start_epoch, config["epochs"]):
        losses = []
        for batch in distributed:
            losses.append(float(train_step(batch)))
            step += 1
            if first_attempt and step == mark_step:
                name = f"running{ctx.world_rank}.json" if ctx.attempt == 0 else \
                    f"running{ctx.world_rank}_attempt{ctx.attempt}.json"
                _write(config["out_dir"], name, {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()})
                if config.get("hold_after_mark"):
                    time.sleep(300)  # until the test takes this worker's node away
            if first_attempt and config.get("step_sleep"):
                time.sleep(config["step_sleep"])
            kill = config.get("kill")
            if first_attempt and kill and kill["rank"] == ctx.world_rank and kill["step"] == step:
                os._exit(1)
            if step % config.get("check_every", 4) == 0 and raytf.preemption_requested():
                raytf.report(
                    {"epoch": epoch - 1, "step": step, "preempted_at": step, "resumed_at": resumed_at},
                    checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer),
                )
                return
        raytf.report(
            {"epoch": epoch, "step": step, "loss": float(np.mean(losses)), "resumed_at": resumed_at,
             "world_size": ctx.world_size, "per_worker_batch": per_worker},
            checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer),
        )
    if ctx.world_rank == 0:
        np.savez(os.path.join(config["out_dir"], "weights.npz"), *[v.numpy() for v in model.trainable_variables])


class StallOnce:
    """Unpickles normally, except the first time on rank ``rank``: there it hangs, as a
    worker stuck importing a module or reaching a dead filesystem would, before it
    ever joins the group."""

    def __init__(self, marker: str, rank: int):
        self.marker, self.rank = marker, rank

    def __reduce__(self):
        return (_unpickle_stall, (self.marker, self.rank))


def _unpickle_stall(marker: str, rank: int) -> "StallOnce":
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("index") == rank and not os.path.exists(marker):
        open(marker, "w").close()
        time.sleep(600)
    return StallOnce(marker, rank)


def keras_train(config: dict) -> None:
    """The small MLP through one of raytf's Keras paths, reporting with ReportCallback.

    ``path``: "keras3" (raytf.keras.fit) or "tf_keras" (tf-keras's own model.fit
    on raytf.keras.distribute, resumed with raytf.keras.restore). On attempt 0:
    rank 1 exits right after epoch ``kill_after_epoch`` was reported; each
    batch end sleeps ``step_sleep``; batch end ``mark_batch`` writes
    running<rank>.json with the pid. Writes
    rank<r>.json: the Keras version, dtypes, the optimizer class and the history.
    """
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    train = raytf.get_dataset_shard("train", batch_size=32, features="x", label="y", shuffle=True, seed=1,
                                    drop_remainder=True)
    val = raytf.get_dataset_shard("val", batch_size=64, features="x", label="y")
    with raytf.strategy().scope():
        model = keras.Sequential(
            [keras.Input((32,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4),
             keras.layers.Activation("linear", dtype="float32")]  # logits in float32 under mixed precision
        )
        model.compile(optimizer=keras.optimizers.Adam(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])

    class Hooks(keras.callbacks.Callback):
        batch_ends = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batch_ends += 1
            if ctx.attempt == 0 and config.get("step_sleep"):
                time.sleep(config["step_sleep"])
            if ctx.attempt == 0 and self.batch_ends == config.get("mark_batch"):
                _write(config["out_dir"], f"running{ctx.world_rank}.json", {"pid": os.getpid()})

        def on_epoch_end(self, epoch, logs=None):
            if ctx.attempt == 0 and ctx.world_rank == 1 and epoch == config.get("kill_after_epoch"):
                _wait_for_commit(ctx.run_path, epoch)  # rank 0's report (and its checkpoint's commit) comes first
                os._exit(1)

    report = raytf.keras.ReportCallback(preemption_check_every=config.get("check_every", 20))
    callbacks = [report, Hooks()]
    if config["path"] == "keras3":
        history = raytf.keras.fit(model, train, epochs=config["epochs"], validation_data=val, callbacks=callbacks,
                                  steps_per_execution=config.get("steps_per_execution", 1))
    else:
        history = model.fit(
            raytf.keras.distribute(train.repeat()), steps_per_epoch=int(train.cardinality()),
            validation_data=raytf.keras.distribute(val.repeat()), validation_steps=int(val.cardinality()),
            epochs=config["epochs"], initial_epoch=raytf.keras.restore(model), callbacks=callbacks, verbose=0,
        )
    version = _keras_version(keras)
    _write(config["out_dir"], f"rank{ctx.world_rank}.json", {
        "keras_version": version,
        "history": {k: [float(x) for x in v] for k, v in history.history.items()},
        "compute_dtype": model.layers[0].compute_dtype,
        "variable_dtype": model.layers[0].variable_dtype if hasattr(model.layers[0], "variable_dtype") else model.layers[0].dtype,
        "optimizer": type(model.optimizer).__name__,
        "attempt": ctx.attempt,
        "iterations": int(model.optimizer.iterations.numpy()),
    })


def keras_train_then_callbacks_and_gradient_accumulation(config: dict) -> None:
    """keras_train on Keras 3, then (in the attempt that finished it) keras_callbacks_and_metrics
    and gradient_accumulation in the same workers, writing to ``out_dir``/checks: three checks
    that need nothing of each other but the strategy, for one group's start."""
    keras_train(config)
    checks = {**config, "out_dir": os.path.join(config["out_dir"], "checks")}
    os.makedirs(checks["out_dir"], exist_ok=True)
    keras_callbacks_and_metrics(checks)
    gradient_accumulation(checks)


def keras_train_then_gradient_accumulation(config: dict) -> None:
    """keras_train, then (in the attempt that finished it) gradient_accumulation, in the same
    workers: two checks of one Keras path for one group's start."""
    keras_train(config)
    gradient_accumulation(config)


def keras_callbacks_and_metrics(config: dict) -> None:
    """Keras 3 through raytf.keras.fit on data whose labels are this worker's rank.

    A metric of the mean label is 0 on rank 0 and 1 on rank 1 locally; aggregated
    over both workers it is 0.5. EarlyStopping (patience 0 on a metric that
    never improves) must stop both ranks after the second epoch; the learning
    rate schedule halves the rate each epoch.
    """
    import numpy as np
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    x = np.random.default_rng(ctx.world_rank).standard_normal((256, 8)).astype("float32")
    y = np.full((256,), ctx.world_rank, dtype="int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

    def mean_label(y_true, y_pred):
        return tf.cast(tf.reshape(y_true, [-1]), tf.float32)

    with raytf.strategy().scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[keras.metrics.MeanMetricWrapper(mean_label, name="mean_label")])
    rates = []

    class Rates(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))

    # initial_epoch=0: a model of its own, not the one a resumed attempt's checkpoint holds.
    history = raytf.keras.fit(model, data, epochs=10, initial_epoch=0, validation_data=data, callbacks=[
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 * 0.5 ** epoch),
        keras.callbacks.EarlyStopping(monitor="mean_label", mode="max", patience=0),
        Rates(),
    ])
    _write(config["out_dir"], f"rank{ctx.world_rank}.json", {
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
        "rates": rates,
    })


def gradient_accumulation(config: dict) -> None:
    """Three copies of one model on the same rows, 64 per worker per update: one takes each
    batch of 64 whole, one accumulates it over 4 micro-batches of 16 (``micro_batches=4``), one
    takes batches of 16 and all-reduces and applies every 4th step (``steps=4``). Writes the
    models' weights and optimizer step counts after ``steps`` updates."""
    import numpy as np
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    keras.utils.set_random_seed(7)
    x = np.random.default_rng(10 + ctx.world_rank).standard_normal((64 * config["steps"], 8)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64, drop_remainder=True)

    def build():
        with raytf.strategy().scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(2)])
            model.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    whole, parts, deferred = build(), build(), build()
    initial = whole.get_weights()
    parts.set_weights(initial)
    deferred.set_weights(initial)
    raytf.keras.accumulate_gradients(parts, 4)
    raytf.keras.accumulate_gradients(deferred, steps=4)
    # The deferred model takes the same rows as batches of 16, four steps per update.
    small = tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)
    for model, batches, steps in ((whole, data, config["steps"]), (parts, data, config["steps"]),
                                  (deferred, small, 4 * config["steps"])):
        if config["path"] == "keras3":
            raytf.keras.fit(model, batches, epochs=1, initial_epoch=0)  # a model of its own: nothing to restore
        else:
            model.fit(raytf.keras.distribute(batches.repeat()), steps_per_epoch=steps, epochs=1, verbose=0)
    if ctx.world_rank == 0:
        for name, model in (("whole", whole), ("parts", parts), ("deferred", deferred)):
            np.savez(os.path.join(config["out_dir"], f"{name}.npz"), *model.get_weights())
        _write(config["out_dir"], "moved.json", {
            "moved": float(np.abs(whole.get_weights()[0] - initial[0]).max()),
            "updates": {name: int(model.optimizer.iterations.numpy())
                        for name, model in (("whole", whole), ("parts", parts), ("deferred", deferred))},
        })


def local_sgd_update(config: dict) -> None:
    """A linear model trained with ``raytf.keras.local_sgd(steps=3)`` and plain SGD for ``steps``
    steps, each worker on rows of its own (worker r's targets are offset by r, so the workers'
    gradients differ), through the run's Keras path: tf-keras ``model.fit``, or
    ``raytf.keras.fit`` for Keras 3, with ``ReportCallback`` (and, in tf-keras, one validation
    batch). Each rank writes ``<name>-rank<r>.json``: its rows, the initial weights, the weights
    its fit saw after every step and when validation began, the final weights and the
    optimizer's iterations."""
    import numpy as np
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    steps, batch = config["steps"], 8
    rng = np.random.default_rng(30 + ctx.world_rank)
    x = rng.standard_normal((steps * batch, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [3.0], [0.5]], "float32") + 1.0 + ctx.world_rank).astype("float32")
    keras.utils.set_random_seed(0)  # the same initial weights in every run compared
    with raytf.strategy().scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    raytf.keras.local_sgd(model, steps=3)
    initial = [w.tolist() for w in model.get_weights()]
    seen = []

    at_validation = []

    class Seen(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append([w.tolist() for w in self.model.get_weights()])

        def on_test_begin(self, logs=None):  # tf-keras's fit calls it before validating
            at_validation.append([w.tolist() for w in self.model.get_weights()])

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
    callbacks = [Seen(), raytf.keras.ReportCallback()]
    if _keras_version(keras).startswith("3."):
        raytf.keras.fit(model, data, epochs=1, callbacks=callbacks)
    else:
        model.fit(raytf.keras.distribute(data.repeat()), steps_per_epoch=steps, epochs=1, verbose=0,
                  callbacks=callbacks, validation_data=raytf.keras.distribute(data.take(1)), validation_steps=1)
    _write(config["out_dir"], f"{config['name']}-rank{ctx.world_rank}.json", {
        "x": x.tolist(), "y": y.tolist(), "initial": initial, "seen": seen, "at_validation": at_validation,
        "final": [w.tolist() for w in model.get_weights()],
        "iterations": int(model.optimizer.iterations.numpy()),
    })


def _keras_version(keras) -> str:
    """The version of the Keras package ``tf.keras`` is here (tf-keras's lazy loader has no __version__)."""
    import importlib

    return importlib.import_module(keras.Sequential.__module__.split(".")[0]).__version__


def _row_counting_model(keras, strategy, dim):
    """A tf-keras model whose train_step adds each batch's rows to a per-worker counter."""
    import tensorflow as tf

    class Counting(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(4)
            self.rows = tf.Variable(0, dtype=tf.int64, trainable=False,
                                    synchronization=tf.VariableSynchronization.ON_READ,
                                    aggregation=tf.VariableAggregation.SUM)

        def call(self, x):
            return self.out(self.hidden(x))

        def train_step(self, data):
            x, _ = data
            self.rows.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
            return super().train_step(data)

    with strategy.scope():
        model = Counting()
        model.build((None, dim))
        model.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def local_rows(strategy, model) -> int:
    """This worker's own count (not the sum over workers that reading the variable gives)."""
    return int(sum(int(v.numpy()) for v in strategy.experimental_local_results(model.rows)))


def shard_to_tf_keras_fit(config: dict) -> None:
    """A shard handed straight to tf-keras's model.fit, as Ray Train code does; counts the rows trained."""
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    shard = raytf.get_dataset_shard("train", batch_size=64, features="x", label="y")
    model = _row_counting_model(tf.keras, strategy, 32)
    model.fit(shard, epochs=config["epochs"], verbose=0)
    _write(config["out_dir"], f"{config.get('prefix', '')}rank{ctx.world_rank}.json", {
        "rows_trained": local_rows(strategy, model),
        "shard_rows": int(sum(int(tf.shape(x)[0]) for x, _ in shard)),
    })


def hidden_shards_to_tf_keras_fit(config: dict) -> None:
    """A shard hidden inside ``Dataset.interleave`` and ``flat_map``, then read through a Python
    generator, each handed to tf-keras's model.fit for one epoch: rows trained per wrapping, or
    the error raytf raised."""
    import tensorflow as tf

    from raytf.errors import DatasetShardError

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    shard = raytf.get_dataset_shard("train", batch_size=64, features="x", label="y")

    def generator():
        yield from shard.as_numpy_iterator()

    wrapped = {
        "interleave": tf.data.Dataset.range(1).interleave(lambda _: shard.map(lambda x, y: (x, y))),
        "flat_map": tf.data.Dataset.range(1).flat_map(lambda _: shard),
        "generator": tf.data.Dataset.from_generator(generator, output_signature=shard.element_spec),
    }
    out = {}
    for name, dataset in wrapped.items():
        model = _row_counting_model(tf.keras, strategy, 32)
        try:
            model.fit(dataset, epochs=1, verbose=0)
            out[name] = local_rows(strategy, model)
        except DatasetShardError as error:
            out[name] = str(error)
    _write(config["out_dir"], f"{config.get('prefix', '')}rank{ctx.world_rank}.json", out)


def per_rank_checkpoints(config: dict) -> None:
    """Ray Train's report, as code moved to raytf.train makes it, with ``checkpoint_upload_mode=
    ASYNC``: epoch 0, rank 1 alone passes a checkpoint; epoch 1, every rank passes files of its
    own. Then, on the retry after a kill of rank 1 once epoch 1's merged checkpoint is committed,
    each rank reads back what it holds."""
    import tempfile

    from raytf import train

    ctx = train.get_context()
    rank = ctx.get_world_rank()
    restored = train.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as d:
            files = sorted(os.listdir(d))
            contents = {f: open(os.path.join(d, f)).read() for f in files if not f.startswith(".")}
        _write(config["out_dir"], f"restored{rank}.json", {"files": files, "contents": contents,
                                                            "epoch": restored.epoch})
        train.report({"epoch": 2, "resumed": 1})
        return
    for epoch in range(2):
        checkpoint = None
        if epoch == 1 or rank == 1:
            directory = tempfile.mkdtemp()
            with open(os.path.join(directory, f"rank{rank}.txt"), "w") as f:
                f.write(f"rank {rank} epoch {epoch}")
            checkpoint = train.Checkpoint.from_directory(directory)
        train.report({"epoch": epoch, "rank": rank}, checkpoint=checkpoint, checkpoint_upload_mode="ASYNC")
    if rank == 1:
        from raytf._internal.worker import session as _session

        _session.current("report").finish_uploads()  # the kill comes once epoch 1's checkpoint is committed
        os._exit(1)  # the retry resumes from the merged checkpoint
    time.sleep(600)


def ray_train_style(config: dict) -> None:
    """Written as Ray Train's examples are: its own MultiWorkerMirroredStrategy, the shard
    straight to model.fit, fit called once per epoch, a report callback."""
    import tensorflow as tf

    import raytf.keras

    ctx = raytf.get_context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    shard = raytf.get_dataset_shard("train", batch_size=64, features="x", label="y", shuffle=True, seed=0)
    model = _row_counting_model(tf.keras, strategy, 32)
    for _ in range(config["epochs"]):
        model.fit(shard, epochs=1, verbose=0, callbacks=[raytf.keras.ReportCallback(preemption_check_every=5)])
    _write(config["out_dir"], f"{config.get('prefix', '')}rank{ctx.world_rank}.json", {
        "same_strategy": strategy is raytf.strategy(),
        "rows_trained": local_rows(strategy, model),
    })


def tf_keras_fit_each_way(config: dict) -> None:
    """In one run's processes, each with a model of its own: ray_train_style (its report callback
    makes the run's history), then shard_to_tf_keras_fit and hidden_shards_to_tf_keras_fit, each
    writing ``<way>-rank<r>.json``. ``epochs``: {way: epochs}."""
    for way, fn in (("ray_train", ray_train_style), ("straight", shard_to_tf_keras_fit),
                    ("hidden", hidden_shards_to_tf_keras_fit)):
        fn({**config, "epochs": config["epochs"].get(way), "prefix": f"{way}-"})


def one_rank_stops(config: dict) -> None:
    """Both ranks join one collective; then rank 1 returns (or sleeps) while rank 0 enters another.
    ``how``: "return", "sleep", or a list of them, one per attempt."""
    import tensorflow as tf

    ctx = raytf.get_context()
    how = config["how"][ctx.attempt] if isinstance(config["how"], list) else config["how"]
    strategy = raytf.strategy()

    def all_reduce():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)), axis=None)

    all_reduce()
    raytf.report({"epoch": 0})
    if ctx.world_rank == 1:
        if how == "return":
            return
        time.sleep(600)
    all_reduce()


def slow_directory_checkpoints(config: dict) -> None:
    """One plain-file checkpoint per epoch, ``epoch_s`` apart, resumed from the latest; no TensorFlow.

    Each checkpoint's file names the driver process that ran it. Writes
    running<rank>.json once the first checkpoint of this driver is committed.
    """
    import tempfile

    ctx = raytf.get_context()
    start = 0
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        start = resumed.epoch + 1
    for epoch in range(start, config["epochs"]):
        time.sleep(config.get("epoch_s", 0.0))
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "owner.txt"), "w") as f:
            f.write(f"{config.get('owner', '')} epoch {epoch}")
        raytf.report({"epoch": epoch, "resumed_at": start}, checkpoint=raytf.Checkpoint.from_directory(directory))
        if epoch == start:
            from raytf._internal.worker import session as _session

            _session.current("report").finish_uploads()  # the upload is asynchronous: its commit first
            _write(config["out_dir"], f"running{ctx.world_rank}.json", {"pid": os.getpid()})


# Parameter-server training (raytf.ParameterServerTrainer): train_fn runs on the chief.


def _row_accounts(rows: int, per_pass: int):
    """Variables (made under the strategy's scope: on the ps) counting how often each pass of each
    worker's stream trained each of ``rows`` rows (``seen[pass, id]``, the pass from the steps that
    worker's stream trained before, ``per_pass`` batches each), which worker's piece each row is
    in, and each worker's trained steps; and ``account(ids)``, a step's counting of its batch."""
    import tensorflow as tf

    accounts = {"seen": tf.Variable(tf.zeros([128, rows], tf.int32)), "owner": tf.Variable(tf.fill([rows], -1)),
                "worker_steps": tf.Variable(tf.zeros([8], tf.int64))}

    def account(ids):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        trained_pass = tf.cast(accounts["worker_steps"][worker] // per_pass, tf.int32)
        n = tf.shape(ids)[0]
        accounts["seen"].scatter_nd_add(tf.stack([tf.fill([n], trained_pass), tf.cast(ids, tf.int32)], 1),
                                        tf.ones([n], tf.int32))
        accounts["owner"].scatter_nd_update(tf.cast(ids, tf.int32)[:, None], tf.fill([n], tf.cast(worker, tf.int32)))
        accounts["worker_steps"].scatter_nd_add([[worker]], tf.constant([1], tf.int64))

    return accounts, account


def ps_custom_loop(config: dict) -> None:
    """A Keras 3 (or tf-keras) MLP trained with the coordinator's schedule/join on dataset "train"
    (columns x, y); a checkpoint each epoch; resumes from raytf.get_checkpoint().

    ``mark_epochs``: on attempt 0, mark-<epoch>.json is written once each of these epochs' steps are
    scheduled, for a test to act on while they run; the checkpoint of the epoch before is committed
    by then (its state is written in the background, beside the next epoch's steps). With
    ``mark_any_attempt``, by whichever attempt schedules the epoch first.

    ``dataset_fn``: the shard is made inside the dataset function the coordinator traces (with a
    ``map``), not handed to it.

    ``count_rows`` (rows in the dataset; its "id" column numbers them): the step also counts, on
    the ps, how often each pass of each worker's stream trained each row (``seen[pass, id]``, the
    pass from the steps that worker's stream trained before, ``per_pass`` batches each), which
    worker's piece each row is in, and each worker's trained steps; rows.json has them at the end.
    """
    import numpy as np
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    coordinator = raytf.coordinator()
    assert tf.distribute.coordinator.ClusterCoordinator(strategy) is coordinator
    counting = config.get("count_rows")

    def shard():
        return raytf.get_dataset_shard("train", batch_size=config.get("batch", 32),
                                       features=["x", "id"] if counting else "x", label="y", shuffle=True, seed=0)

    if config.get("dataset_fn"):  # the shard made inside a dataset function the coordinator traces
        iterator = iter(coordinator.create_per_worker_dataset(lambda: shard().map(lambda x, y: (x, y))))
        on_chief = None
    else:
        template = shard()
        iterator = iter(coordinator.create_per_worker_dataset(template))
        try:
            next(iter(template))  # the template, read on the chief: a clear error
            on_chief = "no error"
        except tf.errors.InvalidArgumentError as error:
            on_chief = error.message
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(4)])
        optimizer = tf.keras.optimizers.SGD(config.get("lr", 0.1))
        optimizer.build(model.trainable_variables)
        rows = tf.Variable(0, dtype=tf.int64)  # assign_add on the ps: exact, unlike Keras 3's iterations
        accounts, account = _row_accounts(counting, config.get("per_pass")) if counting else ({}, None)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(iterator):
        def step(x, y):
            if counting:
                x, ids = x["x"], x["id"]
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            rows.assign_add(tf.shape(x, out_type=tf.int64)[0])
            if counting:  # once the model has the step's update, as a row counts once it is trained
                with tf.control_dependencies([tf.identity(v) for v in model.trainable_variables]):
                    account(ids)
            return loss

        x, y = next(iterator)
        return strategy.run(step, args=(x, y))

    start = 0
    resumed = raytf.get_checkpoint()
    if resumed is not None:
        resumed.restore_state(model=model, optimizer=optimizer, rows=rows, **accounts)
        start = resumed.epoch + 1
    steps = config.get("steps", 20)

    def marks(epoch: int) -> bool:
        if epoch not in config.get("mark_epochs", ()):
            return False
        if config.get("mark_any_attempt"):
            return not os.path.exists(os.path.join(config["out_dir"], f"mark-{epoch}.json"))
        return ctx.attempt == 0

    for epoch in range(start, config["epochs"]):
        scheduled = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
        if marks(epoch):
            _write(config["out_dir"], f"mark-{epoch}.json", {"epoch": epoch, "pid": os.getpid(),
                                                           "cluster": json.loads(os.environ["TF_CONFIG"])["cluster"]})
        coordinator.join()
        loss = float(np.mean([float(s.fetch()) for s in scheduled]))
        raytf.report(
            {"epoch": epoch, "loss": loss, "iterations": int(optimizer.iterations.numpy()),
             "rows": int(rows.numpy()), "scheduled": (epoch + 1) * steps, "resumed_at": start},
            checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer, rows=rows, **accounts),
        )
        if epoch + 1 < config["epochs"] and marks(epoch + 1):
            _wait_for_commit(ctx.run_path, epoch)
    if counting:  # and raytf's committed positions, beside the workload's own step counts
        committed = getattr(iterator, "_raytf_positions", None)
        _write(config["out_dir"], "rows.json", {**{k: v.numpy().tolist() for k, v in accounts.items()},
                                                "committed": committed.values() if committed else None})
    held_out_x, held_out_y = make_data(512, seed=99)
    _write(config["out_dir"], "chief.json", {
        "eval_loss": float(loss_fn(held_out_y, model(held_out_x))),
        "pid": os.getpid(), "template_on_chief": on_chief,
        "task_type": ctx.task_type, "tf_config": json.loads(os.environ["TF_CONFIG"]),
        "num_ps": strategy.extended._num_ps if hasattr(strategy.extended, "_num_ps") else None,
        "variable_devices": sorted({getattr(v, "value", v).device for v in model.trainable_variables}),
    })


# The points of a counted parameter-server step where ps_gated_steps stops it, in the order the step
# reaches them, each with the task that runs it there.
GATES = {
    "before_batch": "worker",  # the previous step committed, this one has taken nothing
    "before_hold": "worker",  # the batch taken, an update's input still being made: the hold not open
    "between_updates": "ps",  # the hold open, `early`, `trained` and `late` made, `after` not
    "before_commit": "ps",  # every update but `done` (the last) made, the batch not yet committed
}


def ps_gated_steps(config: dict) -> None:
    """One parameter-server worker's counted steps, each making five updates on the parameter
    servers (``early``, ``trained``: how often each row was trained, ``late``, ``after``, ``done``)
    and stopping, when a test asks, at one point of the step (GATES), on the task that runs it
    there: the step writes ``at-<point>``, then writes to the FIFO ``gate-<point>``, which blocks
    until the test opens it for reading. The chief writes the counters and the committed position
    before the step, where it stopped (read while it waits: stopped-<point>.json), and after it
    finished (the test kills the worker meanwhile, then opens the gate; the coordinator runs the
    step again): gated.json, with how often each row was trained."""
    import tensorflow as tf

    out = config["out_dir"]
    strategy, coordinator = raytf.strategy(), raytf.coordinator()
    shard = raytf.get_dataset_shard("train", batch_size=32, features="x", label="id")
    iterator = iter(coordinator.create_per_worker_dataset(shard))
    with strategy.scope():
        early, late, after, done = (tf.Variable(0, dtype=tf.int64) for _ in range(4))
        trained = tf.Variable(tf.zeros([config["rows"]], tf.int64))
    passed = os.path.join(out, "no-gate")
    open(passed, "w").close()
    devices = {"worker": "/job:worker/replica:0/task:0/device:CPU:0", "ps": "/job:ps/replica:0/task:0/device:CPU:0"}
    points = list(GATES)

    def stop_at(index, gates, markers, after_ops=()):
        """0, once the step could write ``gates[index]``: a file at once, a FIFO once the test opens
        it for reading. Made on the task GATES names, after ``after_ops``; a plain op, as a step's
        own work is (no loop: TensorFlow does not go on with a loop once the worker is gone)."""
        with tf.device(devices[GATES[points[index]]]):
            with tf.control_dependencies(list(after_ops)):
                marked = tf.io.write_file(markers[index], "stopped")
            with tf.control_dependencies([marked]):
                passed = tf.io.write_file(gates[index], "passed")
            with tf.control_dependencies([passed]):
                return tf.zeros([], tf.int64)

    @tf.function
    def step(iterator, gates, markers):
        zero = stop_at(0, gates, markers)  # on the worker, before the batch is taken
        with tf.control_dependencies([zero]):
            x, ids = next(iterator)
        slow = stop_at(1, gates, markers) + tf.cast(tf.reduce_sum(x) * 0, tf.int64)  # `late`'s input
        made = [early.assign_add(1, read_value=False),
                trained.scatter_nd_add(tf.reshape(ids, [-1, 1]), tf.ones_like(ids)),
                late.assign_add(1 + slow, read_value=False)]
        # After those updates, on a parameter server: `after`'s input.
        made.append(after.assign_add(1 + stop_at(2, gates, markers, made), read_value=False))
        done.assign_add(1 + stop_at(3, gates, markers, made), read_value=False)  # the last update
        return ids[0]

    def state():
        return {"early": int(early.numpy()), "late": int(late.numpy()), "after": int(after.numpy()),
                "done": int(done.numpy()), "committed": iterator._raytf_positions.values()[0]}

    free = tf.constant([passed] * len(points))
    unused = os.path.join(out, "not-stopped")
    coordinator.schedule(step, args=(iterator, free, tf.constant([unused] * len(points))))
    coordinator.join()
    gated = {}
    for index, point in enumerate(points):
        fifo = os.path.join(out, f"gate-{point}")
        os.mkfifo(fifo)
        gates = tf.constant([fifo if i == index else passed for i in range(len(points))])
        markers = tf.constant([os.path.join(out, f"at-{point}") if i == index else unused for i in range(len(points))])
        before = state()
        coordinator.schedule(step, args=(iterator, gates, markers))
        while not os.path.exists(os.path.join(out, f"at-{point}")):
            time.sleep(0.05)
        stopped = state()
        _write(out, f"stopped-{point}.json", stopped)  # the test kills the worker, then opens the gate
        coordinator.join()
        gated[point] = {"before": before, "stopped": stopped, "after": state()}
    coordinator.schedule(step, args=(iterator, free, tf.constant([unused] * len(points))))
    coordinator.join()
    _write(out, "gated.json", {"points": gated, "trained": trained.numpy().tolist(), "last": state()})


def ps_evaluate(checkpoint, config: dict) -> dict:
    """The evaluator's evaluate_fn: loads the checkpoint into the same model and scores fixed data."""
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"),
                                 tf.keras.layers.Dense(4)])
    optimizer = tf.keras.optimizers.SGD(config.get("lr", 0.1))
    optimizer.build(model.trainable_variables)
    checkpoint.restore_state(model=model, optimizer=optimizer, rows=tf.Variable(0, dtype=tf.int64))
    x, y = make_data(256, seed=7)
    loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y, model(x))
    return {"eval_loss": float(loss), "eval_pid": os.getpid(), "eval_task": raytf_task()}


def raytf_task() -> str:
    return json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("type", "")


def mwms_reference_loop(config: dict) -> None:
    """ps_custom_loop's model, optimizer and data under raytf.Trainer's MultiWorkerMirroredStrategy,
    over as many rows: the synchronous reference a parameter-server run is compared with.

    ``replicas``: the synchronous workers the run stands for (default: its own). Fewer workers
    taking as many rows a step make the same updates: one worker of 2 x 32 rows a step averages
    the gradient of the same 64 rows that 2 workers of 32 do."""
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    replicas = config.get("replicas", ctx.world_size)
    shard = raytf.get_dataset_shard("train", batch_size=config.get("batch", 32) * replicas // ctx.world_size,
                                    features="x", label="y", shuffle=True, seed=0)
    batches = iter(strategy.distribute_datasets_from_function(lambda _: shard.repeat()))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"),
                                     tf.keras.layers.Dense(4)])
        # One synchronous step averages num_workers batches where the parameter servers apply each
        # batch on its own: the linear scaling rule gives both the same progress per row.
        optimizer = tf.keras.optimizers.SGD(config.get("lr", 0.1) * replicas)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(batch):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(y, model(x, training=True))) / strategy.num_replicas_in_sync
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        strategy.run(step, args=batch)

    for _ in range(config["epochs"] * config.get("steps", 20) // replicas):  # the same rows in all
        train_step(next(batches))
    held_out_x, held_out_y = make_data(512, seed=99)
    raytf.report({"eval_loss": float(loss_fn(held_out_y, model(held_out_x)))})


def ps_keras_fit(config: dict) -> None:
    """tf-keras model.fit under the chief's ParameterServerStrategy, on raytf's shard as it is.

    ``count_rows``/``per_pass``: as ps_custom_loop's (rows.json), counted by the model's train_step
    once the step's update is made; ``mark_epochs``: on attempt 0, mark-<epoch>.json once each of
    these epochs begins."""
    import tensorflow as tf

    strategy = raytf.strategy()
    counting = config.get("count_rows")
    shard = raytf.get_dataset_shard("train", batch_size=32, features=["x", "id"] if counting else "x", label="y",
                                    shuffle=True, seed=0)

    class Model(tf.keras.Sequential):
        def train_step(self, data):
            if not counting:
                return super().train_step(data)
            (x, y), ids = (data[0]["x"], data[1]), data[0]["id"]
            logs = super().train_step((x, y))
            with tf.control_dependencies([tf.identity(v) for v in self.trainable_variables]):
                account(ids)
            return logs

    class Marks(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if raytf.get_context().attempt == 0 and epoch in config.get("mark_epochs", ()):
                _write(config["out_dir"], f"mark-{epoch}.json", {"epoch": epoch})

    with strategy.scope():
        model = Model([tf.keras.Input((32,)), tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(4)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), steps_per_execution=config.get("spe", 1),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        accounts, account = _row_accounts(counting, config.get("per_pass")) if counting else ({}, None)
    history = model.fit(shard, epochs=config["epochs"], steps_per_epoch=config["steps"], verbose=0,
                        callbacks=[raytf.keras.ReportCallback(checkpoint=True), Marks()])
    if counting:
        _write(config["out_dir"], "rows.json", {k: v.numpy().tolist() for k, v in accounts.items()})
    held_out_x, held_out_y = make_data(512, seed=99)
    _write(config["out_dir"], "keras.json", {
        "keras": _keras_version(tf.keras), "losses": history.history["loss"],
        "eval_loss": float(model.evaluate(held_out_x, held_out_y, verbose=0)) if config.get("evaluate") else None,
        "iterations": int(model.optimizer.iterations.numpy()),
    })


def communication_update(config: dict) -> None:
    """The gradient all-reduce under the run's TensorflowConfig, three ways, on fixed per-rank data.

    1. Three SGD steps of a seeded MLP with many small variables through
       ``optimizer.apply_gradients`` (the Keras optimizer's own all-reduce).
    2. Three SGD steps of a linear model on raw ``tf.Variable``s summed with
       ``raytf.all_reduce_gradients``.
    3. With ``fit_epochs``: a seeded MLP trained through the run's Keras path
       (``raytf.keras.fit`` or tf-keras ``model.fit``) on 2,048 rows per worker.
    4. With ``local_sgd`` (a name): :func:`local_sgd_update` under that name, in the same
       processes (the run's options are the same; a run of its own would start a group again).
    5. With ``also_fused``: 1. and 2. again, the strategy's all-reduces fused into one
       (``bytes_per_pack=0``), rank 0's weights in ``<name>-fused.npz``.

    Rank 0 saves 1's and 2's weights (``<name>.npz``) and writes ``<name>.json``: the
    strategy's ``bytes_per_pack``, 3's epoch losses, the variables' dtypes, and the sum of
    the error-feedback residuals raytf kept for 2's variables.
    """
    import numpy as np
    import tensorflow as tf

    import raytf.keras
    from raytf._internal.worker import compression

    keras = tf.keras
    ctx = raytf.get_context()
    strategy = raytf.strategy()
    x, y = make_data(64, seed=10 + ctx.world_rank)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    global_batch = 64 * ctx.world_size

    def three_steps():
        """1. and 2. from the same seeds: (model, optimizer, w, b, the first kernel before training)."""
        with strategy.scope():
            init = keras.initializers.GlorotUniform(seed=0)
            model = keras.Sequential([keras.Input((32,))] + [
                keras.layers.Dense(16, activation="relu", kernel_initializer=init) for _ in range(6)
            ] + [keras.layers.Dense(4, kernel_initializer=init)])
            optimizer = keras.optimizers.SGD(0.1)
            w = tf.Variable(np.random.default_rng(1).standard_normal((32, 4)).astype("float32") * 0.1,
                            aggregation=tf.VariableAggregation.MEAN)
            b = tf.Variable(tf.zeros(4), aggregation=tf.VariableAggregation.MEAN)

        @tf.function
        def step(x, y):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=global_batch)
                optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

            strategy.run(replica, args=(x, y))

        @tf.function
        def manual_step(x, y):
            def replica(x, y):
                with tf.GradientTape() as tape:
                    loss = tf.nn.compute_average_loss(loss_fn(y, x @ w + b), global_batch_size=global_batch)
                grads = raytf.all_reduce_gradients(tape.gradient(loss, [w, b]), [w, b])
                w.assign_sub(0.5 * grads[0])
                b.assign_sub(0.5 * grads[1])

            strategy.run(replica, args=(x, y))

        initial = model.trainable_variables[0].numpy().copy()
        for _ in range(3):
            step(tf.constant(x), tf.constant(y))
            manual_step(tf.constant(x), tf.constant(y))
        return model, optimizer, w, b, initial

    def save_weights(name, model, w, b, initial):
        np.savez(os.path.join(config["out_dir"], f"{name}.npz"),
                 *[v.numpy() for v in model.trainable_variables], w.numpy(), b.numpy(), initial=initial)

    model, optimizer, w, b, initial = three_steps()
    if config.get("also_fused"):
        # 1. and 2. again in these processes with the strategy's options switched to one fused
        # all-reduce (bytes_per_pack=0), read when the steps are traced: <name>-fused.npz.
        options = strategy.extended._communication_options
        strategy.extended._communication_options = type(options)(
            bytes_per_pack=0, timeout_seconds=options.timeout_seconds, implementation=options.implementation)
        try:
            fused = three_steps()
        finally:
            strategy.extended._communication_options = options
        if ctx.world_rank == 0:
            save_weights(f"{config['name']}-fused", fused[0], *fused[2:])
    residual = sum(float(tf.reduce_sum(tf.abs(r.values[0] if hasattr(r, "values") else r)))
                   for table in compression._residuals.values() for r in table.values())
    losses = []
    if config.get("fit_epochs"):
        tf.keras.utils.set_random_seed(3)
        fx, fy = make_data(2048, seed=20 + ctx.world_rank)
        data = tf.data.Dataset.from_tensor_slices((fx, fy)).batch(32, drop_remainder=True)
        with strategy.scope():
            init = keras.initializers.GlorotUniform(seed=0)
            net = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu",
                                                                           kernel_initializer=init),
                                    keras.layers.Dense(4, kernel_initializer=init)])
            net.compile(optimizer=keras.optimizers.Adam(0.003),
                        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if _keras_version(keras).startswith("3."):
            history = raytf.keras.fit(net, data, epochs=config["fit_epochs"])
        else:
            history = net.fit(raytf.keras.distribute(data.repeat()), steps_per_epoch=2048 // 32,
                              epochs=config["fit_epochs"], verbose=0)
        losses = [float(v) for v in history.history["loss"]]
    if ctx.world_rank == 0:
        options = strategy.extended._communication_options
        save_weights(config["name"], model, w, b, initial)
        _write(config["out_dir"], f"{config['name']}.json", {
            "bytes_per_pack": options.bytes_per_pack, "losses": losses, "residual": residual,
            "dtypes": sorted({tf.as_dtype(v.dtype).name for v in list(model.trainable_variables) + list(optimizer.variables)
                              if tf.as_dtype(v.dtype).is_floating}),
        })
    if config.get("local_sgd"):
        local_sgd_update({**config, "name": config["local_sgd"]})


def gpu_train(config: dict) -> None:
    """On GPU workers (tests/gpu): an all-reduce of 2^20 floats per rank through the strategy's
    collectives, then W1's MLP trained with tf-keras model.fit for 2 epochs, reporting its loss.
    Writes what the worker saw (gpu_attempt<a>_rank<r>.json). With ``die_after_s``, the last rank
    of the first attempt waits that long (for warm standbys to get ready) and kills its process."""
    import numpy as np
    import ray
    import tensorflow as tf

    ctx = raytf.get_context()
    strategy = raytf.strategy()

    with strategy.scope():
        ones = tf.Variable(tf.ones([1 << 20]))  # on the worker's GPU (a constant would be folded on the host)

    @tf.function
    def all_reduce():
        replica = tf.distribute.get_replica_context()
        return replica.all_reduce(tf.distribute.ReduceOp.SUM, ones * tf.cast(ctx.world_rank + 1, tf.float32))

    reduced = strategy.experimental_local_results(strategy.run(all_reduce))[0]
    rng = np.random.default_rng(ctx.world_rank)
    x = rng.standard_normal((4096, 784)).astype("float32")
    y = np.argmax(x @ np.random.default_rng(0).standard_normal((784, 10)), axis=1)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(128, drop_remainder=True)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((784,)), tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    _write(config["out_dir"], f"gpu_attempt{ctx.attempt}_rank{ctx.world_rank}.json", {
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "ray_gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "actor": ray.get_runtime_context().get_actor_name(),
        "implementation": strategy.extended._communication_options.implementation.name,
        "all_reduce_device": reduced.device,
        "all_reduce": [float(reduced[0]), float(reduced[-1])],
        "kernel_device": model.trainable_variables[0].device,
        "worker_devices": list(strategy.extended.worker_devices),
        "logical_gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
    })
    if ctx.attempt == 0 and config.get("die_after_s") and ctx.world_rank == ctx.world_size - 1:
        time.sleep(config["die_after_s"])
        os._exit(1)
    for epoch in range(2):
        history = model.fit(strategy.distribute_datasets_from_function(lambda _: data.repeat()), epochs=1,
                            steps_per_epoch=4096 // 128, verbose=0)
        raytf.report({"epoch": epoch, "loss": float(history.history["loss"][-1])})


def counted_rows(batch: dict) -> dict:
    """Rows for counted_keras_train: ``x`` is the row's id, then 4 features; ``y`` a class of 2."""
    import numpy as np

    ids = batch["id"].astype("float32")
    features = np.stack([np.sin(ids * k) for k in (0.1, 0.2, 0.3, 0.4)], axis=1)
    return {"x": np.concatenate([ids[:, None], features], axis=1).astype("float32"),
            "y": (features[:, 0] > 0).astype("int64")}


def _counted_log(config: dict, ctx: Any, start: int) -> Any:
    """counted_keras_train's step log, its first line written: the attempt's start."""
    import ray

    log = open(os.path.join(config["out_dir"], f"steps-{config['driver']}-{ctx.attempt}-{ctx.world_rank}.jsonl"), "a")
    log.write(json.dumps({"start": start, "world_size": ctx.world_size,
                          "node_id": ray.get_runtime_context().get_node_id()}) + "\n")
    log.flush()
    return log


def _counted_hooks(config: dict, ctx: Any, state: dict, at: dict) -> None:
    """counted_keras_train's test hooks after a step; ``at`` is {epoch, batch} (the batches of this pass)."""
    import ray

    marks, kills = config.get("mark") or [], config.get("kill") or []
    # A mark is {epoch, batch} in attempt 0, or {attempt, epoch, batch}; its file names the attempt past 0.
    mark = next(({k: v for k, v in m.items() if k != "attempt"} for m in (marks if isinstance(marks, list) else [marks])
                 if m.get("attempt", 0) == ctx.attempt), None)
    if mark and (at == mark or state.get("marked")):
        if at == mark:
            running = f"running-{config['driver']}-{ctx.world_rank}" + (f"-a{ctx.attempt}" if ctx.attempt else "")
            import sys

            _write(config["out_dir"], f"{running}.json",
                   {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                    "test_only_loaded": sorted(name for name in TEST_ONLY if name in sys.modules)})
            state["marked"] = True
            hold = config.get("hold_until_preempted")
            if hold is True or (isinstance(hold, list) and ctx.attempt in hold):  # True, or the attempts to hold in
                # Every rank waits at this step until the run is asked to stop (the test drains a
                # node, or adds one to grow onto), asking together (preemption_requested is an
                # all-reduce; a count, not a clock, bounds it): the preemption lands here however
                # long the node takes to join on a loaded machine.
                for _ in range(1500):
                    if raytf.preemption_requested():
                        break
                    time.sleep(0.2)
        time.sleep(config.get("step_sleep", 0))
    if {**at, "rank": ctx.world_rank, "attempt": ctx.attempt} in (kills if isinstance(kills, list) else [kills]):
        os._exit(1)
    terms = config.get("term") or []
    if {**at, "rank": ctx.world_rank, "attempt": ctx.attempt} in (terms if isinstance(terms, list) else [terms]):
        os.kill(os.getpid(), signal.SIGTERM)
        # Python runs a signal's handler on the main thread, which in a Ray actor runs only when an
        # actor call comes (the driver's next poll); this step waits for it (a count bounds it), so
        # the preemption is this worker's at the next check whatever the machine's load.
        from raytf._internal.worker.session import current

        session = current("the term hook")
        for _ in range(1500):
            if session._preempt_requested():
                break
            time.sleep(0.02)


def counted_custom_loop(config: dict) -> None:
    """counted_keras_train's rows, step log and test hooks, trained by a custom loop the way the
    docs write one: the strategy's distributed iterator in a Python ``for``, a checkpoint at
    each epoch's end and where a preemption asks for one (checked every 2 steps), and on resume
    the epoch after the last completed one, nothing skipped (raytf hands the rest of an
    interrupted epoch as the shard's first pass)."""
    import tensorflow as tf

    keras = tf.keras
    ctx = raytf.get_context()
    strategy = raytf.strategy()
    # ``global_batch``: the rows a step trains across the group, whatever its size (an elastic group's
    # workers each take their part); else ``batch`` rows a worker.
    if "global_batch" in config:
        batch = config["global_batch"] // ctx.world_size
        train = raytf.get_dataset_shard("train", global_batch_size=config["global_batch"], features="x", label="y",
                                        shuffle=True)
    else:
        batch = config["batch"]
        train = raytf.get_dataset_shard("train", batch_size=batch, features="x", label="y", shuffle=True)
    distributed = strategy.distribute_datasets_from_function(lambda _: train)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    first_epoch = 0
    if (resumed := raytf.get_checkpoint()) is not None:
        if config.get("per_rank_files"):
            _restore_per_rank_files(config, ctx, resumed, model, optimizer)
        else:
            resumed.restore_state(model=model, optimizer=optimizer)
        first_epoch = resumed.epoch + 1
    iteration = int(optimizer.iterations.numpy())
    log = _counted_log(config, ctx, iteration)
    state: dict = {}

    def report(metrics):
        if config.get("per_rank_files"):
            raytf.report(metrics, checkpoint=_per_rank_files(ctx, model, optimizer, metrics), ranks="all")
        else:
            raytf.report(metrics, checkpoint=raytf.Checkpoint.from_state(model=model, optimizer=optimizer))

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x[:, 1:])),
                                                  global_batch_size=batch * ctx.world_size)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        strategy.run(step, args=(x, y))

    for epoch in range(first_epoch, config["epochs"]):
        for batch, (x, y) in enumerate(distributed, start=1):
            train_step(x, y)
            ids = strategy.experimental_local_results(x)[0][:, 0]
            log.write(json.dumps({"it": iteration, "epoch": epoch, "ids": [int(i) for i in ids.numpy()]}) + "\n")
            log.flush()
            iteration += 1
            _counted_hooks(config, ctx, state, {"epoch": epoch, "batch": batch})
            if batch % 2 == 0 and raytf.preemption_requested():
                report({"epoch": epoch - 1, "step": iteration})
                return
        report({"epoch": epoch, "step": iteration})


def _per_rank_files(ctx: Any, model: Any, optimizer: Any, metrics: dict) -> Any:
    """counted_custom_loop's checkpoint with ``per_rank_files``, for a collective report: every rank's
    own ``rank-<r>.json`` (who wrote it, in which group), and the chief's weights and step."""
    import tempfile

    import numpy as np

    directory = tempfile.mkdtemp()
    _write(directory, f"rank-{ctx.world_rank}.json",
           {"rank": ctx.world_rank, "world_size": ctx.world_size, "attempt": ctx.attempt, **metrics})
    if ctx.world_rank == 0:
        np.savez(os.path.join(directory, "weights.npz"), *[v.numpy() for v in model.weights],
                 iterations=int(optimizer.iterations.numpy()))
    return raytf.Checkpoint.from_directory(directory)


def _restore_per_rank_files(config: dict, ctx: Any, resumed: Any, model: Any, optimizer: Any) -> None:
    """Every rank restores the chief's weights from the merged checkpoint and records the ranks'
    files it found there, to ``restored-<driver>-<attempt>-<rank>.json``."""
    import numpy as np

    with resumed.as_directory() as directory:
        with np.load(os.path.join(directory, "weights.npz")) as saved:
            for i, variable in enumerate(model.weights):
                variable.assign(saved[f"arr_{i}"])
            optimizer.iterations.assign(int(saved["iterations"]))
        found = [json.loads(open(os.path.join(directory, name)).read())
                 for name in sorted(os.listdir(directory)) if name.startswith("rank-")]
    _write(config["out_dir"], f"restored-{config['driver']}-{ctx.attempt}-{ctx.world_rank}.json", {"files": found})


def counted_keras_train(config: dict) -> None:
    """Keras through ``raytf.keras.fit`` with ``ReportCallback``, the way the docs train, on
    rows whose first feature is their id. Every training step writes the ids it trained (a
    ``py_function`` inside the model's call, so only batches a step really took), with the
    optimizer's iteration and the epoch, to ``steps-<driver>-<attempt>-<rank>.jsonl``; the
    first line is the attempt's start (the restored iteration, the group's size, the node). Test
    hooks: ``mark`` ({epoch, batch}, attempt 0): each rank writes running-<driver>-<rank>.json
    with its pid and node (with ``hold_until_preempted``, then waits there until the run is asked
    to stop), then each of its steps sleeps ``step_sleep``; ``kill`` ({attempt,
    rank, epoch, batch}): exit; ``term`` (the same, or a list of them): SIGTERM to itself (a preemption).
    ``tf_keras_fit``: tf-keras's own ``model.fit`` (``TensorflowConfig(keras="tf_keras")``)."""
    import tensorflow as tf

    import raytf.keras

    keras = tf.keras
    ctx = raytf.get_context()
    train = raytf.get_dataset_shard("train", batch_size=config["batch"], features="x", label="y", shuffle=True)
    state = {"epoch": None, "steps": 0, "start": None, "batch_ends": 0}
    log = None

    def record(ids):
        log.write(json.dumps({"it": state["start"] + state["steps"], "epoch": state["epoch"],
                              "ids": [int(i) for i in ids.numpy()]}) + "\n")
        log.flush()
        state["steps"] += 1
        return 0

    class Counted(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(8, activation="relu")
            self.head = keras.layers.Dense(2)

        def call(self, x, training=False):
            if training:
                tf.py_function(record, [x[:, 0]], tf.int64)
            return self.head(self.hidden(x[:, 1:]))

    with raytf.strategy().scope():
        model = Counted()
        model(tf.zeros((1, 5)))  # its weights, for restore
        model.compile(optimizer=keras.optimizers.SGD(0.05), jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    class Hooks(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            nonlocal log
            state["start"] = int(self.model.optimizer.iterations.numpy())
            log = _counted_log(config, ctx, state["start"])

        def on_epoch_begin(self, epoch, logs=None):
            state["epoch"], state["batch_ends"] = epoch, 0

        def on_train_batch_end(self, batch, logs=None):
            state["batch_ends"] += 1
            _counted_hooks(config, ctx, state, {"epoch": state["epoch"], "batch": state["batch_ends"]})

    callbacks = [raytf.keras.ReportCallback(preemption_check_every=2), Hooks()]
    if config.get("tf_keras_fit"):  # tf-keras's own model.fit, resumed at the epoch restore names
        model.fit(train, epochs=config["epochs"], initial_epoch=raytf.keras.restore(model), verbose=0,
                  callbacks=callbacks)
    else:
        raytf.keras.fit(model, train, epochs=config["epochs"], callbacks=callbacks)

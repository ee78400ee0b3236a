"""Worker-side pieces that need no Ray."""

import dataclasses
import errno
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

import raytf
from raytf import RaytfError
from raytf._internal.checkpoint.manager import CheckpointEntry
from raytf._internal.protocol import (
    RankInfo, ResumePoint, RunSpec, SaveEvery, StorageRef, TensorflowSettings, WorkerSpec,
)
from raytf._internal.worker.session import WorkerSession, to_plain
from raytf._internal.worker.tensorflow import reserve_port
from raytf._internal.worker.tensorflow import worker_environment as _worker_environment
from raytf.session import TrainContext
from tests.hidden import hiding


def _bind_fails(family, host, port):
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.bind((host, port))
    except OSError as error:
        return error.errno == errno.EADDRINUSE
    finally:
        probe.close()
    return False


def test_reserved_port_cannot_be_taken_until_released():
    sock = reserve_port()
    port = sock.getsockname()[1]
    # TensorFlow binds the wildcard; another process might bind one address.
    assert _bind_fails(socket.AF_INET, "0.0.0.0", port)
    assert _bind_fails(socket.AF_INET, "127.0.0.1", port)
    sock.close()
    assert not _bind_fails(socket.AF_INET, "0.0.0.0", port)


def test_a_replaced_workers_old_port_is_taken_again_while_its_connections_linger():
    """A killed server's connections stay in TIME_WAIT on its port for a minute; its replacement
    still gets that port, since a parameter-server coordinator waits for the old address."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's servers
    server.bind(("0.0.0.0", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first (its process died): TIME_WAIT on its port
    server.close()
    client.close()
    assert _bind_fails(socket.AF_INET, "0.0.0.0", port)  # a plain bind is refused for a minute
    reserved = reserve_port(port)
    assert reserved.getsockname()[1] == port
    reserved.close()


def spec(**overrides):
    """(the run's spec, one worker's), with ``overrides`` applied to the run's."""
    settings = dict(communication="ring", collective_timeout_s=None, intra_op_threads=3, inter_op_threads=2,
                    use_gpu=False)
    names = {f.name for f in dataclasses.fields(TensorflowSettings)}
    settings.update({k: v for k, v in overrides.items() if k in names})
    values = dict(run_name="r", run_path="/tmp/r", payload=b"", tensorflow=TensorflowSettings(**settings))
    values.update({k: v for k, v in overrides.items() if k not in names})
    worker = WorkerSpec(role="worker", rank=RankInfo(1, 2, 0, 1, 1, 2),
                        tf_config=json.dumps({"task": {"index": 1}}), attempt=0)
    return RunSpec(**values), worker


def worker_environment(specs):
    return _worker_environment(*specs)


def resumed_at(epoch, step):
    entry = CheckpointEntry(name="checkpoint_000003", seq=3, attempt=0, time=0.0, epoch=epoch, step=step)
    return ResumePoint(next_seq=4, path="x", entry=entry)


def test_worker_environment_sets_tf_config_threads_and_hides_gpus_from_cpu_workers():
    env = worker_environment(spec(env={"NCCL_DEBUG": "INFO"}))
    assert json.loads(env["TF_CONFIG"]) == {"task": {"index": 1}}
    assert env["TF_NUM_INTRAOP_THREADS"] == "3" and env["OMP_NUM_THREADS"] == "3"
    assert env["TF_NUM_INTEROP_THREADS"] == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["NCCL_DEBUG"] == "INFO"


def test_gpu_workers_keep_the_gpus_ray_assigned():
    assert "CUDA_VISIBLE_DEVICES" not in worker_environment(spec(use_gpu=True))


def test_metrics_become_plain_python():
    assert to_plain(np.float32(0.5), "x") == 0.5 and type(to_plain(np.float32(0.5), "x")) is float
    assert to_plain(np.int64(3), "x") == 3 and type(to_plain(np.int64(3), "x")) is int
    assert to_plain(np.arange(3), "x") == [0, 1, 2]
    assert to_plain({"a": (np.float64(1.0), "s")}, "x") == {"a": [1.0, "s"]}
    with pytest.raises(raytf.ConfigError, match="metric 'm' is a object"):
        to_plain(object(), "m")


def test_report_numbers_reports_and_rejects_bad_metrics():
    seen = []
    context = TrainContext(0, 2, 0, 2, 0, 1, 3, "run", "/p", "{}")
    session = WorkerSession(context, strategy=None, sink=seen.append)
    session.report({"loss": np.float32(1.5)})
    session.report({"loss": 1.0})
    assert [(r.seq, r.attempt, r.metrics["loss"]) for r in seen] == [(0, 3, 1.5), (1, 3, 1.0)]
    with pytest.raises(raytf.ConfigError, match="must be a dict"):
        session.report([1])
    with pytest.raises(raytf.ConfigError, match="names must be str"):
        session.report({1: 2})


@pytest.mark.parametrize("call", [raytf.get_context, raytf.strategy, lambda: raytf.report({"a": 1})])
def test_worker_api_outside_a_worker_says_where_it_works(call):
    with pytest.raises(RaytfError, match="only inside the train_fn"):
        call()


def test_context_speaks_ray_train():
    context = TrainContext(3, 4, 1, 2, 1, 2, 0, "run", "/p", "{}")
    assert (context.get_world_rank(), context.get_world_size(), context.get_local_rank()) == (3, 4, 1)
    assert (context.get_local_world_size(), context.get_node_rank(), context.get_experiment_name()) == (2, 1, "run")
    assert not context.is_chief


def chief_session(tmp_path, resume=None, **kw):
    import pyarrow.fs as pafs

    seen = []
    context = TrainContext(0, 1, 0, 1, 0, 1, 0, "run", str(tmp_path), "{}")
    session = WorkerSession(
        context, strategy=None, sink=lambda r: (seen.append(r), session.acknowledge(r.seq)),
        resume=resume or ResumePoint(), storage=StorageRef(pafs.LocalFileSystem(), str(tmp_path)), **kw,
    )
    return session, seen


def test_every_n_epochs_saves_only_the_due_checkpoints_counting_from_the_resumed_one(tmp_path):
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "w").write_text("weights")
    checkpoint = raytf.Checkpoint.from_directory(tmp_path / "files")
    session, seen = chief_session(tmp_path, save_every=SaveEvery("epoch", 2))
    for epoch in range(6):
        session.report({"epoch": epoch}, checkpoint=checkpoint)
    assert [r.metrics["epoch"] for r in seen if r.checkpoint] == [1, 3, 5]
    resumed, seen = chief_session(tmp_path, resume=resumed_at(3, 40), save_every=SaveEvery("epoch", 2))
    assert resumed.first_epoch == 4
    for epoch in range(4, 8):
        resumed.report({"epoch": epoch}, checkpoint=checkpoint)
    assert [r.metrics["epoch"] for r in seen if r.checkpoint] == [5, 7]
    with pytest.raises(RaytfError, match="every_n_epochs is set.*needs a number under 'epoch'"):
        resumed.report({"loss": 1.0}, checkpoint=checkpoint)


def test_every_n_steps_and_a_preemption_save_whatever_the_frequency(tmp_path):
    (tmp_path / "files").mkdir()
    checkpoint = raytf.Checkpoint.from_directory(tmp_path / "files")
    session, seen = chief_session(tmp_path, save_every=SaveEvery("step", 100))
    for step in (30, 60, 100, 150, 210):
        session.report({"step": step}, checkpoint=checkpoint)
    assert [r.metrics["step"] for r in seen if r.checkpoint] == [100, 210]
    session.preempted = True
    session.report({"step": 220}, checkpoint=checkpoint)
    assert seen[-1].checkpoint is not None
    with pytest.raises(raytf.ConfigError, match="takes raytf.Checkpoint.from_directory"):
        session.report({"step": 230}, checkpoint=str(tmp_path))


def test_collective_errors_are_told_apart_from_bugs():
    import tensorflow as tf

    from raytf._internal.worker.tensorflow import failure_kind

    assert failure_kind(tf.errors.UnavailableError(None, None, "peer down")) == "collective"
    assert failure_kind(tf.errors.DeadlineExceededError(None, None, "timed out")) == "collective"
    assert failure_kind(tf.errors.InternalError(None, None, "Collective ops is aborted by: ...")) == "collective"
    assert failure_kind(tf.errors.InvalidArgumentError(None, None, "bad shape")) == "exception"
    assert failure_kind(ValueError("bad batch")) == "exception"


def test_the_keras_option_sets_tf_use_legacy_keras_before_tensorflow_loads():
    assert worker_environment(spec(keras="tf_keras"))["TF_USE_LEGACY_KERAS"] == "1"
    assert worker_environment(spec(keras="keras3"))["TF_USE_LEGACY_KERAS"] == "0"
    assert "TF_USE_LEGACY_KERAS" not in worker_environment(spec())


@pytest.mark.parametrize("name", ["attempt", "driver_start", "report_seq", "checkpoint"])
def test_metric_names_raytf_adds_to_the_history_are_refused(name):
    context = TrainContext(0, 2, 0, 2, 0, 1, 0, "run", "/p", "{}")
    session = WorkerSession(context, strategy=None, sink=lambda r: None)
    with pytest.raises(raytf.ConfigError, match=f"the metric name '{name}' is raytf's.*rename the metric"):
        session.report({name: 1})


def test_report_callback_epochs_count_on_across_fit_calls():
    context = TrainContext(0, 1, 0, 1, 0, 1, 0, "run", "/p", "{}")
    fresh = WorkerSession(context, strategy=None, sink=lambda r: None)
    assert [fresh.end_keras_epoch(0) for _ in range(3)] == [0, 1, 2]  # fit(epochs=1) three times
    assert fresh.end_keras_epoch(5) == 5  # fit(initial_epoch=...) numbering is kept
    resumed = WorkerSession(context, strategy=None, sink=lambda r: None,
                            resume=resumed_at(4, 40))
    assert [resumed.end_keras_epoch(0), resumed.end_keras_epoch(6)] == [5, 6]


def test_a_worker_refuses_local_storage_its_node_cannot_see(tmp_path):
    import pyarrow.fs as pafs

    from raytf import ConfigError
    from raytf._internal.lease import RunLease
    from raytf._internal.worker.tensorflow import check_storage_visible

    storage = StorageRef(pafs.LocalFileSystem(), str(tmp_path / "run"))
    lease = RunLease(storage.filesystem, storage.root, "run")
    lease.acquire()
    run, _ = spec(storage=storage, lease_token=lease.token)
    check_storage_visible(run, "10.0.0.7")  # the driver's claim is here
    elsewhere, _ = spec(storage=StorageRef(storage.filesystem, str(tmp_path / "elsewhere")), lease_token=lease.token)
    with pytest.raises(ConfigError, match="local path that this worker's node .10.0.0.7. cannot see"):
        check_storage_visible(elsewhere, "10.0.0.7")
    lease.release()


def test_a_parameter_server_template_is_found_as_it_is_but_not_once_transformed():
    """tfdata_ps: the coordinator rebuilds a template (or tf.distribute's wrapper of one) per worker,
    and names a transformed template as an error instead of running it on the chief."""
    import tensorflow as tf

    from raytf._internal.data.tfdata_ps import TEMPLATE_MARK, derived_from_template, template_of

    template = tf.data.Dataset.range(4)
    setattr(template, TEMPLATE_MARK, "recipe")

    class Wrapped:  # what strategy.experimental_distribute_dataset returns, as far as this goes
        _original_dataset = template

    assert template_of(template) == "recipe" and template_of(Wrapped()) == "recipe"
    assert template_of(template.batch(2)) is None and derived_from_template(template.batch(2).repeat())
    assert not derived_from_template(tf.data.Dataset.range(4).batch(2))


def test_a_standby_takes_its_gpus_only_before_tensorflow_lists_its_devices(tmp_path):
    """adopt_gpus (a warm standby handed a GPU bundle) sets CUDA_VISIBLE_DEVICES while TensorFlow,
    imported, has not listed its devices; afterwards the variable would no longer count, and it
    refuses, naming the cause. In a fresh process: this one may have listed its devices."""
    script = """
import json, os
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import tensorflow as tf
from raytf._internal.worker.tensorflow import adopt_gpus
from raytf.errors import ConfigError
adopt_gpus(["3", "5"])
seen = os.environ["CUDA_VISIBLE_DEVICES"]
tf.config.list_physical_devices()
try:
    adopt_gpus(["1"])
    error = None
except ConfigError as e:  # raytf's error, naming the setting
    error = str(e)
print(json.dumps({"seen": seen, "after": os.environ["CUDA_VISIBLE_DEVICES"], "error": error}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=hiding(tmp_path / "hidden", {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}))
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["seen"] == "3,5"
    assert result["after"] == "3,5"  # untouched by the refused call
    assert "found its devices before it was handed its GPUs (1)" in result["error"]
    assert "FailureConfig.warm_standby" in result["error"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own nice value is Linux's")
def test_a_standby_loads_at_the_lowest_cpu_priority_and_the_caller_keeps_its_own():
    """warm()'s load runs in a thread of nice 19; the thread that later starts training does not
    inherit it, and what the load raised is raised to the caller."""
    import threading

    from raytf._internal.worker.actor import in_background

    def own_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = own_nice()
    seen = []
    in_background(lambda: seen.append((own_nice(), threading.current_thread().name)), "raytf-warm")
    assert seen == [(19, "raytf-warm")] and own_nice() == before

    def fails():
        raise ModuleNotFoundError("train_fn's module")

    with pytest.raises(ModuleNotFoundError, match="train_fn's module"):
        in_background(fails, "raytf-warm")


def test_a_workers_load_runs_no_collection_and_leaves_what_it_loaded_out_of_later_ones():
    """raytf.worker.loading: the collector is paused for the load (importing TensorFlow ran five
    full collections over its own objects), overlapping loads resume it once, when the last ends,
    and what they made is frozen out of later collections; a process that had the collector off
    keeps it off."""
    import gc

    from raytf._internal.worker.loading import paused_collector

    frozen_before = gc.get_freeze_count()
    try:
        with paused_collector():
            # Counted once the collector is paused: an allocation before it may run a collection.
            collections_before = [s["collections"] for s in gc.get_stats()]
            first = [[i] for i in range(100_000)]  # what an import makes: far past the collector's thresholds
            with paused_collector():  # a standby's background load, then its start
                second = [[i] for i in range(100_000)]
            assert not gc.isenabled()  # the first load has not ended
            assert [s["collections"] for s in gc.get_stats()] == collections_before
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(first) + len(second)

        gc.disable()
        try:
            with paused_collector():
                pass
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        gc.unfreeze()


def _faults_by_call_depth(depths: int = 400, calls: int = 200) -> list[int]:
    """For each call depth up to ``depths``, this thread's minor page faults while a function with
    a frame of ~200 slots is called ``calls`` times there. The frames leading down are small (~12
    slots), so below every chunk's end of the data stack there are depths where the big frame does
    not fit in what is left: where CPython frees the chunk it maps for a call when the call returns,
    each of the ``calls`` calls there maps a chunk and faults its first page in."""
    import resource

    def big():
        v0 = v1 = v2 = v3 = v4 = v5 = v6 = v7 = v8 = v9 = v10 = v11 = v12 = v13 = v14 = v15 = v16 = v17 = v18 = v19 = 0  # noqa: F841
        return [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]  # stack depth

    def at(depth: int) -> int:
        if depth:
            return at(depth - 1)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(calls):
            big()
        return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before

    return [at(depth) for depth in range(depths)]


def test_a_worker_thread_on_a_deep_stack_maps_no_data_stack_chunk_as_its_depth_goes_up_and_down():
    """raytf.worker.loading.on_a_deep_stack: below its frame, calls at any depth a worker reaches
    fault no page in, where on CPython 3.11 and 3.12 a thread of its own faulted one in at every
    call at a chunk's end (CPython issue gh-142183): importing TensorFlow crossed 15,000 times."""
    import threading

    from raytf._internal.worker.loading import on_a_deep_stack

    def in_a_thread(target):
        out = []
        thread = threading.Thread(target=lambda: out.append(target()))
        thread.start()
        thread.join()
        return out[0]

    deep = in_a_thread(on_a_deep_stack(_faults_by_call_depth))
    assert max(deep) < 20, deep  # a page or two where a list grew, never one at every call
    if sys.version_info < (3, 13):  # where CPython frees a chunk at once: the measure sees it
        flat = in_a_thread(_faults_by_call_depth)
        assert max(flat) >= 200, flat
    # The function is called as it is: its arguments, its result, its error.
    assert on_a_deep_stack(lambda a, b=0: (a, b))(1, b=2) == (1, 2)
    with pytest.raises(KeyError, match="k"):
        on_a_deep_stack(lambda: {}["k"])()

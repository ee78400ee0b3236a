"""raytf.Trainer on a real two-node Ray cluster with real TensorFlow."""

from __future__ import annotations

import _thread
import dataclasses
import json
import os
import pathlib
import signal
import threading

import pytest

import raytf
from tests import workloads
from tests.integration.conftest import actors, assert_no_leaks, live_placement_groups, live_workers, wait_for

pytestmark = pytest.mark.integration


def read_ranks(out_dir, n):
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(n)]


def trainer(fn, tmp_path, name, **scaling):
    scaling.setdefault("num_workers", 2)
    return raytf.Trainer(
        fn,
        config={"out_dir": str(tmp_path)},
        scaling=raytf.ScalingConfig(**scaling),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0),
        tensorflow=raytf.TensorflowConfig(communication="ring", collective_timeout_s=120),
    )


@pytest.fixture(scope="module")
def pack_run(cluster, tmp_path_factory):
    """small_train on 2 workers packed onto one node, pinned there by a custom resource: (its
    result, its directory). Several tests read this one run."""
    tmp_path = tmp_path_factory.mktemp("pack")
    result = trainer(workloads.small_train, tmp_path, "pack", placement="PACK",
                     resources_per_worker={"node_b": 1}).fit()
    assert_no_leaks()
    return result, tmp_path


def test_two_workers_train_one_model(pack_run):
    result, tmp_path = pack_run

    losses = [entry["loss"] for entry in result.history]
    assert [entry["epoch"] for entry in result.history] == [0, 1, 2, 3]
    assert losses[-1] < 0.5 * losses[0], losses
    assert result.metrics == {"epoch": 3, "loss": losses[-1]}
    assert result.attempts == 1
    assert json.loads((tmp_path / "results" / "pack" / "history.json").read_text())[-1]["loss"] == losses[-1]
    assert result.path == str(tmp_path / "results" / "pack")
    # Where the start-up went, phase by phase, the phases adding up to the whole.
    [startup] = result.startup
    # small_train's loop reports each epoch and tells raytf of no step: the last phase ends at its report.
    assert list(startup) == ["attempt", "placement", "actors", "loading", "connect", "first_report", "total"]
    assert startup["loading"] > 0  # train_fn's modules; TensorFlow came with the process (below)
    phases = sum(v for k, v in startup.items() if k not in ("attempt", "total"))
    assert startup["total"] == pytest.approx(phases, abs=0.06)

    ranks = read_ranks(tmp_path, 2)
    # CPU workers start through their node's fork server (TensorflowConfig.start_method="auto"):
    # both were forked from node_b's, a process that imported TensorFlow before them; NumPy's
    # global generator, copied with the server's memory, was drawn from anew in each.
    [server] = {info["forkserver"] for info in ranks}
    assert server is not None and all(info["ppid"] == int(server) for info in ranks)
    assert b"raytf_forkserver\0--serve\0" in pathlib.Path(f"/proc/{server}/cmdline").read_bytes()
    assert "libtensorflow_framework" in pathlib.Path(f"/proc/{server}/maps").read_text()
    assert ranks[0]["numpy_draw"] != ranks[1]["numpy_draw"]
    workers = ranks[0]["tf_config"]["cluster"]["worker"]
    for rank, info in enumerate(ranks):
        assert info["world_rank"] == rank and info["world_size"] == 2
        assert info["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
        assert info["context_tf_config"] == info["tf_config"]
        assert info["is_mwms"] and info["replicas"] == 2
        assert info["collective_sum"] == 3.0  # 1 + 2: both workers joined the collective
        assert info["implementation"] == "RING" and info["timeout_seconds"] == 120
        # TensorFlow saw the worker's CPU count before it started: 1 thread each.
        assert info["intra_env"] == "1" and info["intra_threads"] == 1 and info["inter_threads"] == 1
        assert info["cuda_visible_devices"] == ""
    assert len(set(workers)) == 2
    # MultiWorkerMirroredStrategy kept the replicas identical.
    assert ranks[0]["weights_sum"] == pytest.approx(ranks[1]["weights_sum"], rel=1e-5)
    # PACK on nodes with 2 CPUs each: both workers share a node, with local ranks 0 and 1.
    assert ranks[0]["node_id"] == ranks[1]["node_id"]
    assert [(i["node_rank"], i["local_rank"], i["local_world_size"]) for i in ranks] == [(0, 0, 2), (0, 1, 2)]


def test_custom_resources_pin_workers_to_a_node(pack_run):
    _, tmp_path = pack_run  # resources_per_worker={"node_b": 1}
    node_b = next(n["NodeID"] for n in __import__("ray").nodes() if n["Alive"] and "node_b" in n["Resources"])
    assert {i["node_id"] for i in read_ranks(tmp_path, 2)} == {node_b}


def test_exception_on_one_rank_is_raised_with_its_rank_and_traceback_and_no_copy_is_left(tmp_path, no_leaks):
    """The failed run committed a checkpoint, which the chief kept in host memory; the run's end
    removes that copy although no worker of its last attempt is left to (its actors were gone
    before the run ended)."""
    from raytf._internal.checkpoint import memory
    from raytf._internal.protocol import StorageRef
    from raytf._internal.storage import RunStorage

    run = trainer(workloads.fail_on_rank, tmp_path, "boom")
    run.config["rank"] = 1
    run.run = dataclasses.replace(run.run, checkpoint_config=raytf.CheckpointConfig(upload="sync"))
    with pytest.raises(raytf.TrainingFailedError) as info:
        run.fit()
    storage = RunStorage(str(tmp_path / "results"), "boom")
    index = json.loads((tmp_path / "results" / "boom" / "checkpoints" / "index.json").read_text())
    assert [c["name"] for c in index["checkpoints"]] == ["checkpoint_000000"]
    ref = StorageRef(storage.filesystem, storage.root)
    assert memory.find(ref, "checkpoint_000000") is None  # committed, kept in memory, then dropped
    assert not any(os.path.exists(d) for d in memory._run_dirs(ref))
    error = info.value
    assert error.rank == 1
    assert error.failure.error_type == "ValueError"
    assert "bad batch on rank 1" in str(error)
    assert "in fail_on_rank" in error.worker_traceback and "raise ValueError" in error.worker_traceback
    assert live_placement_groups() == []


def test_ctrl_c_stops_every_actor_and_removes_the_placement_group(tmp_path, cluster):
    """Ctrl-C stops fit() even when an earlier library left a SIGINT handler that only sets a
    flag (Ray Tune's ``Tuner.fit()`` leaves one installed; with Python's own, which raises
    KeyboardInterrupt anyway, the path is the same: raytf's handler takes the press), and the
    handler is restored after."""
    started = tmp_path / "running0"
    presses = []
    original = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda signum, frame: presses.append(signum))
    inherited_handler = signal.getsignal(signal.SIGINT)

    def press_ctrl_c():
        wait_for(started.exists, timeout_s=120, message="training to start")
        _thread.interrupt_main()

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer(workloads.report_until_stopped, tmp_path, "ctrl-c", num_workers=1).fit()
        assert signal.getsignal(signal.SIGINT) is inherited_handler
    finally:
        signal.signal(signal.SIGINT, original)
    assert presses == []  # raytf's handler, not the inherited one, took the Ctrl-C
    # The driver is still alive, so Ray's end-of-job cleanup has not run: only raytf's did.
    assert live_placement_groups() == []
    wait_for(lambda: not live_workers(), timeout_s=10, message="worker actors to be gone")


def split_coordinators() -> int:
    """Ray Data split coordinators ever made in this cluster: one per streaming_split."""
    return len(actors(("class_name", "=", "SplitCoordinator")))


def test_warm_standby_processes_take_the_ranks_of_the_restarted_group_a_dead_one_a_cold_worker_and_a_lost_node_a_new_split(
        cluster, tmp_path, no_leaks):
    """FailureConfig(warm_standby=True, keep_survivors=False), two workers on nodes of their own, rank 1 lost three
    times. The first retry runs in processes that were started while the first attempt trained
    (the standbys), none of them the first attempt's, and each rank reads the rows its predecessor
    read, kept in the object store, without a new split of the dataset. Before the second loss one
    of the retry's own standbys is killed: the second restart checks the standbys it is handed and
    starts a cold worker where one is dead, at no extra retry. Then rank 1's node is lost, and the
    shard kept there with it: the last retry splits the dataset anew rather than failing on the lost
    copy (rank 0 in the standby on its node, rank 1 cold on a node added in its place). The
    standbys are gone with the run (no_leaks). Each attempt that is lost reports once, and all this
    is prepared from that report on (a loop that tells raytf of nothing: tests/unit/test_group_parts.py)."""
    import ray

    from tests.integration.test_recovery import in_background

    before = split_coordinators()
    nodes = [cluster.add_node(num_cpus=1, resources={"warm": 1}) for _ in range(2)]
    added, lost = list(nodes), None
    try:
        join = in_background(raytf.Trainer(
            workloads.exit_after_warm_up,
            config={"out_dir": str(tmp_path), "warm_standbys": 2, "kill_standby": 1, "lose_node": 2,
                    "datasets": ["train", "whole"]},
            datasets={"train": ray.data.range(64, override_num_blocks=8), "whole": ray.data.range(12)},
            # exactly_once=False: Ray Data's streaming_split, whose shards the standbys' restart keeps (with the
            # default, every restart reads the run's materialized blocks instead: test_exactly_once.py).
            data_config=raytf.DataConfig(datasets_to_split=["train"], exactly_once=False),
            scaling=raytf.ScalingConfig(num_workers=2, resources_per_worker={"warm": 1}),
            run=raytf.RunConfig(name="warm", storage_path=str(tmp_path / "results"), verbose=0,
                                # The standbys alone: a survivor kept would take rank 0's bundle first.
                                failure_config=raytf.FailureConfig(max_failures=3, warm_standby=True,
                                                                   keep_survivors=False)),
        ))
        hold = wait_for(lambda: (tmp_path / "hold2.json").exists() and tmp_path / "hold2.json", 300,
                        "the third attempt to hold")
        lost = json.loads(hold.read_text())["node_id"]
        cluster.remove_node(next(n for n in nodes if n.node_id == lost))
        added.append(cluster.add_node(num_cpus=1, resources={"warm": 1}))
        result = join()
    finally:
        for node in added:
            if node.node_id != lost:
                cluster.remove_node(node)
    assert result.attempts == 4 and [f.kind for f in result.failures] == ["died", "died", "died"]
    assert result.history[-1]["epoch"] == 3

    def info(attempt, rank):
        return json.loads((tmp_path / f"attempt{attempt}_rank{rank}.json").read_text())

    killed = json.loads((tmp_path / "killed0.json").read_text())["time"]
    first = {info(0, r)["pid"] for r in range(2)}
    for rank in range(2):
        retry = info(1, rank)
        assert retry["pid"] not in first
        assert ":standby:" in retry["actor"] and retry["process_started"] < killed  # up before the failure
        assert retry["ids"] == info(0, rank)["ids"]
        assert retry["ids"]["whole"] == list(range(12))
    assert sorted(info(0, 0)["ids"]["train"] + info(0, 1)["ids"]["train"]) == list(range(64))
    # The second retry: one rank in the surviving standby, the other in a new actor in the dead one's place.
    actors = sorted(info(2, r)["actor"] for r in range(2))
    assert sum(":standby:" in a for a in actors) == 1 and any(a.startswith("raytf:warm:2:") for a in actors)
    assert [info(2, r)["ids"] for r in range(2)] == [info(0, r)["ids"] for r in range(2)]  # still the kept shards
    # The last retry: a new split of every row, a standby on the node left, a cold worker on the new one.
    last = [info(3, r) for r in range(2)]
    assert sorted(last[0]["ids"]["train"] + last[1]["ids"]["train"]) == list(range(64))
    assert all(seen["ids"]["whole"] == list(range(12)) for seen in last)
    assert {seen["node_id"] for seen in last} == {n.node_id for n in added if n.node_id != lost}
    assert sorted(":standby:" in seen["actor"] for seen in last) == [False, True]
    assert split_coordinators() - before == 2  # the first attempt's split and the one after the node was lost


def test_warm_standby_is_refused_where_it_cannot_apply():
    warm = raytf.RunConfig(failure_config=raytf.FailureConfig(warm_standby=True))
    with pytest.raises(raytf.ConfigError, match="ParameterServerTrainer has no warm standby"):
        raytf.ParameterServerTrainer(lambda: None, run=warm)


def test_a_worker_lost_each_way_restarts_the_group_until_no_retry_is_left(tmp_path, no_leaks):
    """One run, rank 1 lost once each way a worker goes (workloads.lose_rank_1_every_way), each a
    failure of max_failures=3 and a restart (the lost rank in a new process; a rank that outlived
    the attempt in its own, kept: FailureConfig.keep_survivors): it never joins (its config's
    unpickling hangs, workloads.StallOnce), found by start_timeout_s; it stops (alive and silent,
    found by worker_timeout_s; its process ended though Ray's kill could not end it); then rank 0's
    collective fails as one does when a peer is unreachable: a lost peer, retried although
    retry_on_exception stays False. Last, rank 1 is killed with ``ray.kill``, with no retry left:
    the run fails, naming rank 1's death."""
    import ray

    def kill_rank_1():
        marker = tmp_path / "rank1_attempt3.json"
        wait_for(marker.exists, timeout_s=400, message="rank 1 to start its fourth attempt")
        # Its actor: attempt 3's, or an earlier attempt's process kept for it (FailureConfig.keep_survivors).
        name = json.loads(marker.read_text())["actor_name"]
        assert name.startswith("raytf:lost:")
        ray.kill(ray.get_actor(name))

    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    run = trainer(workloads.lose_rank_1_every_way, tmp_path, "lost")
    run.config["stall"] = workloads.StallOnce(str(tmp_path / "stalled-once"), rank=1)
    run.run = raytf.RunConfig(
        name="lost", storage_path=str(tmp_path / "results"), verbose=0,
        # Rank 0 is ready well before start_timeout_s, even on a 2-core machine under the suite's load
        # (a cold start there is 10-25 s, most of it TensorFlow's import); the stalled rank 1 waits 600 s.
        failure_config=raytf.FailureConfig(max_failures=3, worker_timeout_s=5, start_timeout_s=45),
    )
    with pytest.raises(raytf.TrainingFailedError) as info:
        run.fit()
    killer.join(timeout=10)
    error = info.value
    assert (error.rank, error.failure.kind) == (1, "died")
    assert [(f.rank, f.kind) for f in error.attempts] == [
        (1, "not_started"), (1, "unresponsive"), (0, "collective"), (1, "died")]
    not_started, unresponsive, collective, _ = error.attempts
    assert "start_timeout_s" in not_started.message and "still starting" in not_started.message
    assert (tmp_path / "stalled-once").exists()
    assert "worker_timeout_s" in unresponsive.message
    assert collective.error_type == "UnavailableError"


def test_a_group_that_cannot_be_placed_times_out_with_what_was_asked(cluster, tmp_path, no_leaks):
    # Each worker fits on a node, but three STRICT_SPREAD workers need three nodes.
    run = trainer(workloads.small_train, tmp_path, "unplaceable", num_workers=3, placement="STRICT_SPREAD",
                  placement_timeout_s=3)
    with pytest.raises(raytf.PlacementTimeoutError) as info:
        run.fit()
    message = str(info.value)
    assert "within 3 s" in message and "3 x {CPU: 1}" in message and "STRICT_SPREAD" in message
    assert "2 node(s)" in message
    assert live_placement_groups() == []


def test_more_gpus_than_any_node_is_rejected_before_anything_starts(cluster, tmp_path):
    pgs_before = len(__import__("ray").util.placement_group_table())
    with pytest.raises(raytf.ConfigError, match="gpus_per_worker=1, but the largest node has 0 GPU"):
        trainer(workloads.small_train, tmp_path, "gpu", gpus_per_worker=1).fit()
    assert len(__import__("ray").util.placement_group_table()) == pgs_before


SIGTERM_DRIVER = """
import sys, ray, raytf
from ray import cloudpickle
from tests import workloads
cloudpickle.register_pickle_by_value(workloads)
ray.init(address=sys.argv[1])
out_dir = sys.argv[2]
try:
    raytf.Trainer(workloads.checkpoints_until_stopped, config={"out_dir": out_dir},
                  scaling=raytf.ScalingConfig(num_workers=2),
                  run=raytf.RunConfig(name="sigterm", storage_path=out_dir + "/results", verbose=0,
                                      storage_filesystem=workloads.gated_filesystem(out_dir + "/gate"))).fit()
except SystemExit as exit_:
    print("fit ended by SystemExit", exit_.code, flush=True)
sys.stdin.read()  # stay connected until the test has looked
"""


def test_sigterm_to_the_driver_stops_training_first_then_commits_the_upload_in_flight(cluster, tmp_path):
    """``ray job stop`` sends the driver SIGTERM while the chief's checkpoint is on its way to
    storage (held there by the test): training stops at once (the other rank is gone, the chief
    takes no further report), the checkpoint in flight is committed and nothing after it, then
    every actor and the placement group go, and no copy of the run's checkpoints stays in memory."""
    import os
    import signal
    import subprocess
    import sys

    from raytf._internal.checkpoint import memory
    from raytf._internal.protocol import StorageRef

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_DRIVER, cluster.address, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
        env={**os.environ, "PYTHONPATH": os.path.dirname(repo)},
    )
    gate = tmp_path / "gate"
    try:
        wait_for((tmp_path / "running0").exists, timeout_s=120, message="training to start")
        assert len(live_placement_groups()) == 1
        gate.touch()  # the next checkpoint's upload waits
        wait_for((tmp_path / "gate.blocked").exists, timeout_s=60, message="an upload to be in flight")
        index = tmp_path / "results" / "sigterm" / "checkpoints" / "index.json"
        before = [c["step"] for c in json.loads(index.read_text())["checkpoints"]]
        driver.send_signal(signal.SIGTERM)
        wait_for(lambda: "waiting up to" in (tmp_path / "driver.log").read_text(), timeout_s=60,
                 message="the driver to wait for the upload")
        wait_for(lambda: len(live_workers()) == 1, timeout_s=30, message="the other rank to be stopped")
        assert [c["step"] for c in json.loads(index.read_text())["checkpoints"]] == before  # still in flight
        gate.unlink()
        assert driver.stdout.readline().strip() == f"fit ended by SystemExit {128 + signal.SIGTERM}"
        # The one in flight was committed, and none after it: training had stopped.
        after = [c["step"] for c in json.loads(index.read_text())["checkpoints"]]
        assert after == before + [before[-1] + 1], (before, after)
        # The driver is still connected, so this is raytf's teardown, not Ray's end-of-job cleanup.
        assert live_placement_groups() == []
        wait_for(lambda: not live_workers(), timeout_s=10, message="worker actors to be gone")
        root = str(tmp_path / "results" / "sigterm")
        assert not any(os.path.exists(d) for d in memory._run_dirs(StorageRef(workloads.gated_filesystem(""), root)))
    finally:
        if gate.exists():
            gate.unlink()
        driver.stdin.close()
        driver.wait(timeout=60)
        log.close()


def test_reported_metrics_reach_tensorboard_event_files_in_the_run_directory(pack_run):
    import os

    import tensorflow as tf

    result, tmp_path = pack_run
    directory = tmp_path / "results" / "pack" / "tensorboard"
    [name] = os.listdir(directory)
    scalars = [
        (event.step, value.tag, value.simple_value)
        for event in tf.compat.v1.train.summary_iterator(str(directory / name))
        for value in event.summary.value
    ]
    # small_train reports no step: each report's number in the run is its step.
    assert [(step, tag) for step, tag, _ in scalars if tag == "loss"] == [(0, "loss"), (1, "loss"), (2, "loss"), (3, "loss")]
    assert [v for _, tag, v in scalars if tag == "loss"] == pytest.approx([h["loss"] for h in result.history])



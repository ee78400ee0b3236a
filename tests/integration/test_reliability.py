"""What would lose data or hang on a real cluster: a second driver on a run, shards given
straight to tf-keras, a train_fn with its own strategy, and ranks that stop taking part."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import raytf
from tests import workloads
from tests.integration.conftest import assert_no_leaks, wait_for

pytestmark = pytest.mark.integration

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARD_ROWS = 1984  # per worker: 3968 rows split across 2


def row_data():
    import ray

    return ray.data.range(2 * SHARD_ROWS, override_num_blocks=4).map_batches(
        workloads.mlp_features, batch_size=None
    ).materialize()


def read_ranks(out_dir, n=2, prefix=""):
    return [json.loads((out_dir / f"{prefix}rank{r}.json").read_text()) for r in range(n)]


def tf_keras_trainer(fn, tmp_path, name, epochs, **run):
    return raytf.Trainer(
        fn, config={"out_dir": str(tmp_path), "epochs": epochs},
        datasets={"train": row_data()},
        scaling=raytf.ScalingConfig(num_workers=2),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0, **run),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),
    )


@pytest.fixture(scope="module")
def tf_keras_fits(cluster, tmp_path_factory):
    """One tf-keras run of workloads.tf_keras_fit_each_way (Ray Train's style for 3 epochs, a shard
    straight to fit for 2, a shard hidden in other datasets for 1): (its result, its directory)."""
    tmp_path = tmp_path_factory.mktemp("tf-keras-fits")
    result = tf_keras_trainer(workloads.tf_keras_fit_each_way, tmp_path, "tf-keras-fits",
                              epochs={"ray_train": 3, "straight": 2, "hidden": 1}).fit()
    assert_no_leaks()
    return result, tmp_path


def test_a_shard_given_straight_to_tf_keras_fit_trains_on_every_row(tf_keras_fits):
    _, tmp_path = tf_keras_fits
    for info in read_ranks(tmp_path, prefix="straight-"):
        assert info["shard_rows"] == SHARD_ROWS
        # Every row of the worker's shard, every epoch: not the first half of each batch.
        assert info["rows_trained"] == 2 * SHARD_ROWS


def test_a_train_fn_written_for_ray_train_trains_with_its_own_strategy(tf_keras_fits):
    result, tmp_path = tf_keras_fits
    for info in read_ranks(tmp_path, prefix="ray_train-"):
        assert info["same_strategy"]  # MultiWorkerMirroredStrategy() inside train_fn is raytf's
        assert info["rows_trained"] == 3 * SHARD_ROWS
    # fit() was called once per epoch; the epochs reported are the run's, not Keras's 0 each time.
    assert [h["epoch"] for h in result.history] == [0, 1, 2]
    assert result.checkpoint.epoch == 2


def test_a_shard_inside_interleave_or_flat_map_trains_every_row_and_one_read_through_python_is_refused(
        tf_keras_fits):
    _, tmp_path = tf_keras_fits
    for seen in read_ranks(tmp_path, prefix="hidden-"):
        # Every row of the worker's shard in the epoch: not half of each batch.
        assert seen["interleave"] == SHARD_ROWS and seen["flat_map"] == SHARD_ROWS
        assert "reads through Python" in seen["generator"] and "raytf.keras.distribute(dataset)" in seen["generator"]


def one_rank_stops(tmp_path, name, how, failure_config, tensorflow=None):
    return raytf.Trainer(
        workloads.one_rank_stops, config={"how": how},
        scaling=raytf.ScalingConfig(num_workers=2),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=failure_config),
        tensorflow=tensorflow,
    )


def test_an_idle_rank_is_named_and_retried_and_a_rank_that_returns_early_ends_the_run(tmp_path, no_leaks):
    """Attempt 0: rank 1 sleeps while rank 0 waits in a collective; the hang detector names the idle
    rank, not the one waiting for it, and the attempt is retried. Attempt 1: rank 1 returns while
    rank 0 waits; that is no failure a retry mends: the run ends, naming it."""
    trainer = one_rank_stops(tmp_path, "idle-then-returns", ["sleep", "return"],
                             raytf.FailureConfig(hang_timeout_s=5, max_failures=2))
    with pytest.raises(raytf.TrainingFailedError) as raised:
        trainer.fit()
    stalled, returned = raised.value.attempts
    assert (stalled.rank, stalled.kind) == (1, "stalled")
    assert "workloads.py" in stalled.message and "in one_rank_stops" in stalled.message
    assert raised.value.failure == returned and (returned.rank, returned.kind) == (1, "returned_early")
    assert "rank 0 still waits" in returned.message


def test_a_collective_timeout_blames_the_idle_rank(tmp_path, no_leaks):
    trainer = one_rank_stops(
        tmp_path, "idle-collective-timeout", "sleep", raytf.FailureConfig(hang_timeout_s=None),
        tensorflow=raytf.TensorflowConfig(collective_timeout_s=6),
    )
    with pytest.raises(raytf.TrainingFailedError) as raised:
        trainer.fit()
    failure = raised.value.failure
    assert (failure.rank, failure.kind) == (1, "stalled")
    assert "rank 0 waits" in failure.message


DRIVER = """
import sys
sys.path.insert(0, {repo!r})
import ray
from ray import cloudpickle
import raytf
from tests import workloads

cloudpickle.register_pickle_by_value(workloads)
ray.init(address={address!r})  # a namespace of its own, as every plain ray.init() gets
raytf.Trainer(
    workloads.slow_directory_checkpoints,
    config={{"out_dir": {out!r}, "epochs": 1000, "epoch_s": 0.3, "owner": "first"}},
    scaling=raytf.ScalingConfig(num_workers=1),  # the lease is the driver's: one worker shows it
    run=raytf.RunConfig(name="shared", storage_path={storage!r}, verbose=0),
).fit()
"""


def test_a_second_driver_in_another_namespace_is_refused_until_the_first_is_gone(cluster, tmp_path, no_leaks):
    import socket

    storage = tmp_path / "results"
    first_out = tmp_path / "first"
    first_out.mkdir()
    first = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(repo=REPO, address=cluster.address, out=str(first_out),
                                             storage=str(storage))],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: (first_out / "running0.json").exists(), 120, "the first driver to commit a checkpoint")

        def second(epochs):
            return raytf.Trainer(
                workloads.slow_directory_checkpoints,
                config={"out_dir": str(tmp_path), "epochs": epochs, "owner": "second"},
                scaling=raytf.ScalingConfig(num_workers=1),
                run=raytf.RunConfig(name="shared", storage_path=str(storage), verbose=0),
            )

        with pytest.raises(raytf.RunInUseError) as refused:
            second(3).fit()
        message = str(refused.value)
        assert f"host {socket.gethostname()}, pid {first.pid}, started " in message
        first.send_signal(signal.SIGKILL)  # dies without releasing its lease
        first.wait(timeout=30)
        committed = json.loads((storage / "shared" / "checkpoints" / "index.json").read_text())["checkpoints"]
        done = committed[-1]["epoch"] + 1
        result = second(done + 2).fit()  # same machine, process gone: taken over at once
    finally:
        if first.poll() is None:
            first.kill()
    entries = [(h["epoch"], h["driver_start"]) for h in result.history]
    # The whole run: every epoch the first driver committed, then the second's, in order.
    assert [e for e, _ in entries] == list(range(done + 2))
    assert [d for _, d in entries][done:] == [1, 1] and set(d for _, d in entries[:done]) == {0}
    assert result.history[done]["resumed_at"] == done
    with result.checkpoint.as_directory() as directory:
        assert open(os.path.join(directory, "owner.txt")).read() == f"second epoch {done + 1}"


def test_the_lease_holds_on_s3_too(s3_filesystem):
    from raytf._internal.lease import RunLease, holds

    now = [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    root = "raytf-test/leases/run"
    first = RunLease(s3_filesystem, root, "run", ttl_s=30, clock=clock, monotonic=clock)
    first.acquire()
    first._stop.set()  # the driver goes away without a word
    with pytest.raises(raytf.RunInUseError, match="run 'run' is in use by another driver"):
        RunLease(s3_filesystem, root, "run", ttl_s=30, clock=clock, monotonic=clock).acquire()
    now[0] += 31
    assert not holds(s3_filesystem, root, first.token, now=now[0])
    second = RunLease(s3_filesystem, root, "run", ttl_s=30, clock=clock, monotonic=clock)
    second.acquire()
    assert holds(s3_filesystem, root, second.token, now=now[0])
    with pytest.raises(raytf.RunInUseError, match="did not renew"):
        first.check()
    second.release()
    assert not holds(s3_filesystem, root, second.token, now=now[0])

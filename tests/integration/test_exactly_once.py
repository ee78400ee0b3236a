"""Exactly-once epochs (``DataConfig(exactly_once=True)``, the default): every row of an epoch
trains the final model once, through preemptions (a node's drain notice, SIGTERM) and a shrink
(and at eight workers through lost ranks, a lost node and growth: test_scale.py)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import raytf
from tests import workloads
from tests.integration.conftest import wait_for
from tests.integration.test_recovery import in_background

pytestmark = pytest.mark.integration

ROWS, BATCH, EPOCHS = 240, 8, 3


def trained_counts(out_dir, epochs=EPOCHS, rows=ROWS):
    """How often each row of each epoch trained the final model: every step the workers logged,
    less the steps a later attempt rolled back (those at or past the iteration it resumed at)."""
    attempts = {}  # (driver, attempt) -> (restored iteration, world size, nodes, [(iteration, epoch, ids)])
    for path in out_dir.glob("steps-*.jsonl"):
        driver, attempt, _ = (int(v) for v in path.stem.split("-")[1:])
        start, *steps = [json.loads(line) for line in path.read_text().splitlines()]
        _, _, nodes, logged = attempts.setdefault((driver, attempt), (start["start"], start["world_size"], set(), []))
        nodes.add(start["node_id"])
        logged.extend((s["it"], s["epoch"], s["ids"]) for s in steps)
    order = sorted(attempts)
    counts = np.zeros((epochs, rows), dtype=int)
    for i, key in enumerate(order):
        rolled_back_from = attempts[order[i + 1]][0] if i + 1 < len(order) else float("inf")
        for iteration, epoch, ids in attempts[key][3]:
            if iteration < rolled_back_from:
                counts[epoch, ids] += 1
    return counts, {key: attempts[key][:3] for key in order}


def test_tf_keras_model_fit_resumes_each_preemption_at_its_next_untrained_row_mid_epoch_or_at_its_end(
        cluster, tmp_path, no_leaks):
    """tf-keras's own ``model.fit`` with ReportCallback, 2 workers, 4 epochs, rank 1 preempted twice
    (SIGTERM). In epoch 1 at batch 14 of 15: the preemption is taken at the epoch's last step (checked
    every 2), whose checkpoint completed the epoch (before, the resume ran epoch 1 again with epoch
    2's rows: every row of it twice, as a growth at an epoch's end did in the test above). In epoch 2
    at batch 5: the checkpoint of that step records where the epoch stood, and the resumed fit's
    first epoch is the rest of it (before, tf-keras restarted the epoch: its first batches trained
    twice)."""
    import ray

    epochs = 4
    data = ray.data.range(ROWS, override_num_blocks=4).map_batches(workloads.counted_rows, batch_size=None)
    result = raytf.Trainer(
        workloads.counted_keras_train,
        config={"out_dir": str(tmp_path), "batch": BATCH, "epochs": epochs, "driver": 1, "tf_keras_fit": True,
                "term": [{"attempt": 0, "rank": 1, "epoch": 1, "batch": 14},
                         {"attempt": 1, "rank": 1, "epoch": 2, "batch": 5}]},
        datasets={"train": data}, scaling=raytf.ScalingConfig(num_workers=2),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),
        run=raytf.RunConfig(name="once-tf-keras", storage_path=str(tmp_path / "results"), verbose=0),
    ).fit()
    counts, attempts = trained_counts(tmp_path, epochs)
    assert [size for _, size, _ in attempts.values()] == [2, 2, 2]
    assert [f.kind for f in result.failures] == ["preempted", "preempted"]
    per_epoch = ROWS // 2 // BATCH
    assert attempts[(1, 1)][0] == 2 * per_epoch  # preempted at epoch 1's last step: resumed at epoch 2
    assert [h["epoch"] for h in result.history if h["attempt"] == 0] == [0, 1]  # its checkpoint completed epoch 1
    assert 2 * per_epoch + 5 <= attempts[(1, 2)][0] < 3 * per_epoch  # resumed in mid-epoch 2, past its 5th step
    wrong = {(int(e), int(r)): int(counts[e, r]) for e, r in zip(*np.nonzero(counts != 1))}
    assert not wrong, f"(epoch, row): times trained, where not once: {dict(list(wrong.items())[:20])}"


def write_counted_tfrecords(directory, rows, files):
    """counted_rows' rows (``x``: the id, then 4 features; ``y``) as TFRecord files of Examples."""
    import tensorflow as tf

    columns = workloads.counted_rows({"id": np.arange(rows)})
    for part, index in enumerate(np.array_split(np.arange(rows), files)):
        with tf.io.TFRecordWriter(str(directory / f"part-{part}.tfrecord")) as writer:
            for i in index:
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=columns["x"][i])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[columns["y"][i]])),
                })).SerializeToString())


def test_a_custom_loop_over_tfrecord_files_trains_every_row_once_through_a_drain_a_shrink_and_a_sigterm(
        cluster, tmp_path, no_leaks):
    """raytf.data.tfrecord_files, shuffled, 3 files, read by each worker, trained by a custom loop
    (the strategy's iterator in a Python for, nothing skipped on resume): in epoch 1 rank 2's node is
    drained (as an autoscaler drains a spot node before taking it away) and the group checkpoints
    that step and resumes there on 2 workers, where rank 1 gets SIGTERM mid-epoch and the group
    checkpoints and resumes again. Neither preemption is a failure (max_failures=0). Every row of
    every epoch trains the final model once. Without counting the batches the loop took, each
    preemption's checkpoint would record the start of epoch 1 and its first batches would train
    twice. (A kill, which rolls back to the last checkpoint: test_scale.py.)"""
    import ray
    import tensorflow as tf
    from ray._private.state import state
    from ray.core.generated import autoscaler_pb2

    (tmp_path / "data").mkdir()
    write_counted_tfrecords(tmp_path / "data", ROWS, 3)
    nodes = [cluster.add_node(num_cpus=1, resources={"files": 1}) for _ in range(3)]
    data = raytf.data.tfrecord_files(str(tmp_path / "data"), {
        "x": tf.io.FixedLenFeature([5], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}, chunk_rows=16,
        shuffle_rows=64)
    trainer = raytf.Trainer(
        workloads.counted_custom_loop,
        config={"out_dir": str(tmp_path), "batch": BATCH, "epochs": EPOCHS, "driver": 1, "step_sleep": 0.3,
                "mark": {"epoch": 1, "batch": 3}, "term": {"attempt": 1, "rank": 1, "epoch": 1, "batch": 3}},
        datasets={"train": data},
        scaling=raytf.ScalingConfig(num_workers=(2, 3), resources_per_worker={"files": 1}, resize_timeout_s=3),
        run=raytf.RunConfig(name="files", storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(max_failures=0)),
    )
    try:
        join = in_background(trainer)
        running = wait_for(lambda: (tmp_path / "running-1-2.json").exists() and tmp_path / "running-1-2.json", 120,
                           "training")
        node_id = json.loads(running.read_text())["node_id"]
        accepted, why = ray._private.worker.global_worker.gcs_client.drain_node(
            node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
            "spot instance reclaimed", int((time.time() + 60) * 1000),
        )
        assert accepted, why
        wait_for(lambda: node_id in state.get_draining_nodes(), 10, "Ray listing the node as draining")
        result = join()
    finally:
        for node in nodes:
            cluster.remove_node(node)
    counts, attempts = trained_counts(tmp_path)
    assert [size for _, size, _ in attempts.values()] == [3, 2, 2], attempts
    drained, terminated = result.failures
    assert drained.kind == "preempted" and "draining" in drained.message, drained
    assert terminated.kind == "preempted" and "SIGTERM" in terminated.message, terminated
    # Each resumed in mid-epoch 1 at the step the preemption before it saved: the second further on.
    assert ROWS // 3 // BATCH < attempts[(1, 1)][0] < attempts[(1, 2)][0] < ROWS // 3 // BATCH + ROWS // 2 // BATCH
    saved = [h["step"] for h in result.history if h["attempt"] < 2 and h["epoch"] == 0 and h["step"] > ROWS // 3 // BATCH]
    assert saved == [attempts[(1, 1)][0], attempts[(1, 2)][0]], result.history
    wrong = {(int(e), int(r)): int(counts[e, r]) for e, r in zip(*np.nonzero(counts != 1))}
    assert not wrong, f"(epoch, row): times trained, where not once: {dict(list(wrong.items())[:20])}"

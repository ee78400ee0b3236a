"""TensorBoard event files written by the driver, read back by TensorFlow's own reader."""

import os

import pyarrow.fs as pafs

from raytf._internal.driver.tensorboard import EventWriter, crc32c, scalars_of


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def test_only_finite_numbers_are_plotted_and_nested_metrics_get_paths():
    assert scalars_of({"loss": 0.5, "n": 3, "ok": True, "s": "x", "nan": float("nan"), "val": {"acc": 1.0}}) == {
        "loss": 0.5, "n": 3.0, "val/acc": 1.0,
    }


def test_event_files_are_what_tensorflow_reads(tmp_path):
    import tensorflow as tf

    writer = EventWriter(pafs.LocalFileSystem(), str(tmp_path / "run"), driver_start=0)
    writer.add(10, {"loss": 0.5, "acc": 1})
    writer.flush()
    writer.add(20, {"loss": 0.25})
    writer.flush()  # appends
    [name] = os.listdir(tmp_path / "run" / "tensorboard")
    assert name.startswith("events.out.tfevents.")
    events = list(tf.compat.v1.train.summary_iterator(str(tmp_path / "run" / "tensorboard" / name)))
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, {v.tag: v.simple_value for v in e.summary.value}) for e in events[1:]] == [
        (10, {"loss": 0.5, "acc": 1.0}), (20, {"loss": 0.25}),
    ]


def test_a_metric_beyond_float32_is_kept_in_the_history_and_left_out_of_tensorboard(tmp_path, caplog):
    import math

    import tensorflow as tf

    from raytf._internal.driver.history import RunHistory
    from raytf._internal.driver.progress import ProgressDisplay
    from raytf._internal.protocol import Report
    from raytf._internal.storage import RunStorage

    storage = RunStorage(str(tmp_path), "run")
    writer = EventWriter(storage.filesystem, storage.root, driver_start=0)
    history = RunHistory(storage, ProgressDisplay("run", 0), 0, [], events=writer)
    huge = math.exp(100)
    for seq in range(3):  # the second flush is where fit() raised OverflowError
        history.record(Report(rank=0, seq=seq, metrics={"epoch": seq, "step": seq, "loss": 0.5, "score": huge,
                                                        "count": 10**400}, time=0.0))
        history.flush()
    assert [e["score"] for e in storage.read_json("history.json")] == [huge] * 3
    assert "beyond float32's range" in caplog.text
    [name] = os.listdir(tmp_path / "run" / "tensorboard")
    events = list(tf.compat.v1.train.summary_iterator(str(tmp_path / "run" / "tensorboard" / name)))
    assert [{v.tag: v.simple_value for v in e.summary.value} for e in events[1:]] == [
        {"epoch": float(i), "step": float(i), "loss": 0.5} for i in range(3)]

"""Ray Data shards as tf.data on real workers: equal steps, columns, files, errors, checked on one
run (data_run) of every dataset the checks need."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import raytf
from tests import workloads
from tests.integration.conftest import assert_no_leaks

pytestmark = pytest.mark.integration


def ranks(tmp_path):
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def with_label(batch):
    ids = batch["id"]
    return {"id": ids, "f": ids.astype(np.float32) / 100, "y": ids % 4}


def tensors(batch):
    ids = batch["id"]
    return {
        "id": ids,
        "a": ids.astype(np.float32),
        "b": np.stack([ids, ids + 1, ids + 2], axis=1).astype(np.float32),  # fixed-shape tensor column
        "c": (ids % 3).astype(np.int32),
    }


def write_parquet(directory, files=4, rows=512, dim=32):
    directory.mkdir()
    w = np.random.default_rng(0).standard_normal((dim, 4)).astype(np.float32)
    for i in range(files):
        x = np.random.default_rng(i + 1).standard_normal((rows, dim)).astype(np.float32)
        table = pa.table({
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), dim),
            "y": pa.array(np.argmax(x @ w, axis=1).astype(np.int64)),
        })
        pq.write_table(table, directory / f"part-{i}.parquet")


def tfrecord_job():
    """jobs/train_tfrecords.py, imported as a module (its files and readers)."""
    import importlib.util
    import pathlib
    import sys

    jobs = pathlib.Path(__file__).resolve().parents[2] / "jobs"
    spec = importlib.util.spec_from_file_location("train_tfrecords", jobs / "train_tfrecords.py")
    job = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(jobs))
    try:
        spec.loader.exec_module(job)
    finally:
        sys.path.remove(str(jobs))
    return job


# What each part of the run asks its datasets for (the tests below say what each shows).
UNEVEN = {"name": "uneven", "batch_size": 10, "features": ["id", "f"], "label": "y"}
SHARD_REQUESTS = {
    "cached": UNEVEN,
    "cached_drop": {**UNEVEN, "drop_remainder": True},
    "streaming": {**UNEVEN, "cache": False},
    "streaming_drop": {**UNEVEN, "cache": False, "drop_remainder": True},
    "shuffled": {**UNEVEN, "shuffle": True, "seed": 5},
    "streaming_shuffled": {**UNEVEN, "shuffle": True, "seed": 5, "cache": False},
}
COLUMN_REQUESTS = {
    "dict": {"name": "columns", "batch_size": 8, "features": ["id", "a", "b"], "label": "c", "drop_remainder": True},
    "dict_streaming": {"name": "columns", "batch_size": 8, "features": ["id", "a", "b"], "label": "c",
                       "drop_remainder": True, "cache": False},
    "tensor": {"name": "columns", "batch_size": 8, "features": "b"},
    "tensor_streaming": {"name": "columns", "batch_size": 8, "features": "b", "cache": False},
    "whole": {"name": "val", "batch_size": 10, "features": ["id"]},
}
SOURCES = {"parquet": {"features": "x", "dim": 32}, "tfrecord": {"features": "x", "dim": 32},
           "csv": {"features": [f"f{i}" for i in range(8)], "dim": 8, "cache": False}}
BAD_REQUESTS = {
    "unknown_name": {"name": "test", "batch_size": 4},
    "missing_column": {"name": "train", "batch_size": 4, "features": ["id", "nope"], "label": "y"},
    "too_big": {"name": "train", "batch_size": 64, "features": "id"},
    "ragged": {"name": "ragged", "batch_size": 4, "features": "v", "label": "y"},
    "zero_batch": {"name": "train", "batch_size": 0},
    "empty_cached": {"name": "empty", "batch_size": 4, "features": "f", "label": "y"},
    "empty_streaming": {"name": "empty", "batch_size": 4, "features": "f", "label": "y", "cache": False},
}
UNHANDLED = {"name": "train", "batch_size": 4, "features": ["id", "g"], "label": "y"}


@pytest.fixture(scope="module")
def data_run(cluster, tmp_path_factory):
    """One run of two workers over every dataset of this file's tests, its parts in turn
    (workloads.in_turn): workloads.shard_epochs over 1003 rows cut unevenly (``uneven``), tensor
    columns (``columns``) and a dataset not split (``val``); workloads.train_from_shards, one MLP
    per file source; then workloads.bad_requests, which ends the run with its unhandled request.
    -> (its directory, the TrainingFailedError, the run's history.json)."""
    import ray

    root = tmp_path_factory.mktemp("data")
    parts = {part: root / part for part in ("shards", "bad")}  # where each rank writes what it saw
    for directory in parts.values():
        directory.mkdir()
    # The files: Parquet files each worker reads its row groups of; jobs/train_tfrecords.py's
    # tf.train.Examples; a CSV file streamed through Ray Data.
    write_parquet(root / "parquet")
    job = tfrecord_job()
    (root / "tfrecords").mkdir()
    job.write_demo_tfrecords(str(root / "tfrecords"), files=2, rows=1024, dim=32, classes=4)
    first = job.read(str(root / "tfrecords"), 32, "ray-data").take_batch(2, batch_format="numpy")
    assert first["x"].shape == (2, 32) and first["x"].dtype == np.float32 and first["y"].dtype == np.int64
    w = np.random.default_rng(0).standard_normal((8, 4))
    x = np.random.default_rng(1).standard_normal((1200, 8))
    lines = [",".join([f"f{i}" for i in range(8)] + ["y"])]
    lines += [",".join([f"{v:.5f}" for v in row] + [str(int(np.argmax(row @ w)))]) for row in x]
    (root / "data.csv").write_text("\n".join(lines) + "\n")
    datasets = {
        "uneven": ray.data.range(1003, override_num_blocks=7).map_batches(with_label, batch_size=None),
        "columns": ray.data.range(64).map_batches(tensors, batch_size=None),
        "val": ray.data.range(50).map_batches(tensors, batch_size=None),
        "parquet": raytf.data.parquet_files(str(root / "parquet")),
        "tfrecord": job.read(str(root / "tfrecords"), 32),
        "csv": ray.data.read_csv(str(root / "data.csv")),
        "train": ray.data.range(40).map_batches(with_label, batch_size=None),
        "ragged": ray.data.from_items([{"v": [1.0] * (1 + i % 3), "y": i} for i in range(20)]),
        "empty": ray.data.range(40).map_batches(with_label, batch_size=None).filter(lambda row: row["id"] > 1000),
    }
    config = {"parts": [
        ("shard_epochs", {"out_dir": str(parts["shards"]), "requests": {**SHARD_REQUESTS, **COLUMN_REQUESTS}}),
        ("train_from_shards", {"sources": SOURCES}),
        ("bad_requests", {"out_dir": str(parts["bad"]), "requests": BAD_REQUESTS, "unhandled": UNHANDLED}),
    ]}
    with pytest.raises(raytf.TrainingFailedError) as info:
        raytf.Trainer(
            workloads.in_turn, config=config, datasets=datasets,
            data_config=raytf.DataConfig(datasets_to_split=[
                "uneven", "columns", "parquet", "tfrecord", "csv", "train", "empty"]),
            scaling=raytf.ScalingConfig(num_workers=2),
            run=raytf.RunConfig(name="data", storage_path=str(root / "results"), verbose=0),
        ).fit()
    assert_no_leaks()
    history = json.loads((root / "results" / "data" / "history.json").read_text())
    return root, info.value, history


def test_every_worker_runs_the_same_steps_whatever_the_row_count_and_columns_take_the_schemas_shapes(data_run):
    """Every request of workloads.shard_epochs: 1003 rows cut unevenly, tensor columns, and a
    dataset that is not split."""
    r0, r1 = ranks(data_run[0] / "shards")
    for key in SHARD_REQUESTS:
        for e0, e1 in zip(r0[key]["epochs"], r1[key]["epochs"]):
            # The same steps on both ranks; each epoch's 1003 rows cut 502 + 501 (DataConfig(exactly_once=True)),
            # so the last batches differ by one row; with drop_remainder both stop at 50 full batches.
            assert len(e0["sizes"]) == len(e1["sizes"]) and e0["sizes"][:-1] == e1["sizes"][:-1], key
            assert (sum(e0["sizes"]), sum(e1["sizes"])) == ((500, 500) if "drop" in key else (502, 501)), key
            assert not set(e0["ids"]) & set(e1["ids"]), key  # the ranks' rows are disjoint
            if "drop" not in key:
                assert sorted(e0["ids"] + e1["ids"]) == list(range(1003)), key  # every row, once
        sizes = r0[key]["epochs"][0]["sizes"]
        assert sizes == ([10] * 50 if "drop" in key else [10] * 50 + [2]), key
    for key in ("shuffled", "streaming_shuffled"):
        first, second = (e["ids"] for e in r0[key]["epochs"])
        assert first != second, key  # reshuffled each epoch, over the whole dataset
        both = [sorted(r0[key]["epochs"][e]["ids"] + r1[key]["epochs"][e]["ids"]) for e in (0, 1)]
        assert both[0] == both[1] == list(range(1003)), key
    cached = r0["cached"]["epochs"]
    assert cached[0]["ids"] == cached[1]["ids"]  # no shuffle: the same order every epoch
    for key in ("dict", "dict_streaming"):
        spec = r0[key]["spec"]
        assert "'b': TensorSpec(shape=(8, 3), dtype=tf.float32" in spec, (key, spec)
        assert "'a': TensorSpec(shape=(8,), dtype=tf.float32" in spec, spec
        assert spec.endswith("TensorSpec(shape=(8,), dtype=tf.int32, name=None))"), spec  # the label
    for key in ("tensor", "tensor_streaming"):
        assert r0[key]["spec"] == "TensorSpec(shape=(None, 3), dtype=tf.float32, name=None)", key
    # 'val' is not split: every worker sees all 50 rows.
    assert sorted(r0["whole"]["epochs"][0]["ids"]) == sorted(r1["whole"]["epochs"][0]["ids"]) == list(range(50))


def test_training_from_parquet_tfrecord_and_csv_files(data_run):
    """One MLP per source in turn (workloads.train_from_shards): Parquet files each worker reads
    its row groups of; jobs/train_tfrecords.py's files and readers (tf.train.Examples parsed by a
    FixedLenFeature spec into a tensor column through Ray Data (raytf.data.read_tfrecords), and
    trained from with each worker reading its files (raytf.data.tfrecord_files, the job's default),
    shuffled); a CSV file streamed through Ray Data."""
    history = data_run[2]
    for source in SOURCES:
        trained = [h for h in history if h.get("source") == source]
        assert [h["epoch"] for h in trained] == [0, 1, 2, 3], source
        losses = [h["loss"] for h in trained]
        assert losses[-1] < 0.6 * losses[0], (source, losses)
        if source != "csv":
            assert {h["steps"] for h in trained} == {1024 // 32}, source  # 2048 rows / 2 workers / batch 32


def test_bad_requests_name_the_column_or_setting_and_an_unhandled_one_fails_the_run(data_run):
    """Each rank makes every bad request, catching its error, then (once every rank has) rank 0 one
    more without catching it: the run fails with that error's type and message. An empty shard is
    named as such, cached and streamed."""
    root, failure, _ = data_run
    assert failure.failure.error_type == "DatasetShardError"
    assert "column 'g' is not in the dataset" in str(failure)
    for messages in ranks(root / "bad"):
        assert ("no dataset named 'test' was passed to Trainer(datasets=...); passed: columns, csv, empty, "
                "parquet, ragged, tfrecord, train, uneven, val") in messages["unknown_name"]
        assert "column 'nope' is not in the dataset; its columns are id, f, y" in messages["missing_column"]
        assert "batch_size=64 is larger than the worker's shard (20 rows" in messages["too_big"]
        assert "column 'v' is ragged" in messages["ragged"]
        assert "batch_size must be an int >= 1, got 0" in messages["zero_batch"]
        for key in ("empty_cached", "empty_streaming"):
            assert "a worker's shard has no rows: the dataset is empty, or has fewer rows than the 2 workers" in (
                messages[key] or ""), (key, messages[key])


def test_a_lazy_dataset_that_could_never_run_is_refused_before_anything_starts(cluster, tmp_path):
    import ray

    lazy = ray.data.range(100).map_batches(with_label, batch_size=None)
    pgs_before = len(ray.util.placement_group_table())
    # Two workers of 2 CPUs take all 4 CPUs of the test cluster.
    with pytest.raises(raytf.ConfigError, match="must run Ray Data tasks while training.*materialize"):
        raytf.Trainer(
            workloads.shard_epochs, config={}, datasets={"train": lazy},
            scaling=raytf.ScalingConfig(num_workers=2, cpus_per_worker=2),
            run=raytf.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()
    assert len(ray.util.placement_group_table()) == pgs_before


@pytest.mark.parametrize("rows, fragment", [(0, "has 0 row(s), fewer than the 2 workers"), (1, "has 1 row(s)")])
def test_a_materialized_dataset_with_fewer_rows_than_workers_is_refused_before_anything_starts(
        cluster, tmp_path, rows, fragment):
    import ray

    data = ray.data.range(rows).map_batches(with_label, batch_size=None).materialize()
    with pytest.raises(raytf.ConfigError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        raytf.Trainer(
            workloads.shard_epochs, config={}, datasets={"train": data},
            scaling=raytf.ScalingConfig(num_workers=2),
            run=raytf.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()

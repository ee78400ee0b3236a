"""File ingest: rows/s into tf.data from a directory of TFRecord files (and the same rows as
Parquet), raytf's paths against TensorFlow's own pipeline and Ray Data's ``to_tf``, in one
invocation.

    python bench/tfrecord_ingest.py [--files 8] [--rows 8192] [--dim 128] [--batch-size 128]
                                    [--no-ray-data-anchors] [--ray-data-epochs N] [--one-op-thread]
                                    [--repeats N]

Writes ``--files`` files of ``tf.train.Example`` (``x``: ``--dim`` floats, ``y``: an int64) and
the same rows as Parquet files (row groups of 8192), then times full passes (no training; every
path in one process, with TensorFlow's own thread pools as it sizes them, as its guide runs its
pipelines; ``--one-op-thread`` pins its op pools at one thread, as the first runs did) of:

- ``tf_tfrecord_dataset``: ``TFRecordDataset(files)``, ``batch``, ``map(tf.io.parse_example)``,
  ``prefetch``; ``tf_tfrecord_parallel``: TensorFlow's guide's recipe, the same with
  ``num_parallel_reads`` and ``num_parallel_calls`` AUTOTUNE (the anchor is the faster of the
  two); ``tf_tfrecord_shuffled``: the files shuffled, ``interleave`` and a ``shuffle(8192)``
  buffer before the batch (TensorFlow's shuffled recipe);
- ``raytf_tfrecord_files`` / ``raytf_tfrecord_files_shuffled``: ``raytf.data.tfrecord_files``, one
  rank's pipeline (each worker reads its files; ``shuffle=True``: chunks reordered, rows
  permuted in windows of 8192), exactly once by position; ``raytf_count_rows_per_s``: the
  driver's one-time count of the records;
- ``raytf_parquet_files`` / ``_shuffled``: ``raytf.data.parquet_files`` over the Parquet copy;
- ``raytf_planned_cached`` / ``raytf_planned_streaming``: ``raytf.data.read_tfrecords`` with the
  same spec, materialized once, then one rank's planned shard (``cache=True`` / ``False``); the
  one-time read and parse is ``raytf_read_rows_per_s``;
- ``ray_to_tf``: ``ray.data.read_tfrecords(...).to_tf`` (parsed by Ray Data every epoch);
  ``ray_parquet_to_tf``: ``ray.data.read_parquet(...)``, a NumPy ``map_batches`` (``to_tf`` takes
  no fixed-size list column), ``to_tf``.

Prints one JSON line per path (the median of its passes) and the ratios against TensorFlow's
pipeline (shuffled paths against the shuffled recipe); ``--repeats N`` measures every path N
times, round by round, each line and each round's ratios saying its ``repeat``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "jobs"))
from ingest import epochs_per_second as rates  # noqa: E402  (full passes, counted inside TensorFlow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=8192, help="rows per file")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-ray-data-anchors", dest="ray_data_anchors", action="store_false",
                        help="leave out Ray Data's to_tf paths (a few thousand rows/s: minutes at 500k rows)")
    parser.add_argument("--ray-data-epochs", type=int, default=None,
                        help="full passes of Ray Data's to_tf paths (default: --epochs)")
    parser.add_argument("--one-op-thread", action="store_true",
                        help="TensorFlow's op thread pools at one thread each (else TensorFlow's defaults)")
    parser.add_argument("--repeats", type=int, default=1, help="every path this many times, round by round")
    args = parser.parse_args()

    import ray
    import tensorflow as tf

    import train_tfrecords  # jobs/: the writer and the feature spec

    if args.one_op_thread:
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    directory = tempfile.mkdtemp()
    train_tfrecords.write_demo_tfrecords(directory, files=args.files, rows=args.rows, dim=args.dim)
    files = sorted(os.path.join(directory, f) for f in os.listdir(directory))
    spec = {"x": tf.io.FixedLenFeature([args.dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(records):
        parsed = tf.io.parse_example(records, spec)
        return parsed["x"], parsed["y"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet_dir = tempfile.mkdtemp()
    for i, path in enumerate(files):
        columns = [parse(r) for r in tf.data.TFRecordDataset(path).batch(args.rows)][0]
        x = pa.FixedSizeListArray.from_arrays(pa.array(columns[0].numpy().reshape(-1)), args.dim)
        pq.write_table(pa.table({"x": x, "y": columns[1].numpy()}), os.path.join(parquet_dir, f"part-{i}.parquet"),
                       row_group_size=8192)
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(train_tfrecords)
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    for repeat in range(args.repeats):
        round_ = {"repeat": repeat} if args.repeats > 1 else {}
        results = one_round(args, directory, parquet_dir, files, parse)
        medians = {name: statistics.median(values) for name, values in results.items()}
        for name, value in medians.items():
            print(json.dumps({**round_, "path": name, "rows_per_s": round(value), "samples": len(results[name])}),
                  flush=True)
        base, shuffled_base = max(medians["tf_tfrecord_dataset"], medians["tf_tfrecord_parallel"]), \
            medians["tf_tfrecord_shuffled"]
        print(json.dumps({
            **round_,
            "ratios_vs_tf_tfrecord_best": {n: round(v / base, 3) for n, v in medians.items()
                                              if not n.startswith("tf_") and "shuffled" not in n and "per_s" not in n},
            "ratios_vs_tf_tfrecord_shuffled": {n: round(v / shuffled_base, 3) for n, v in medians.items()
                                               if n.endswith("_shuffled") and not n.startswith("tf_")},
            "rows": args.files * args.rows, "dim": args.dim, "batch_size": args.batch_size,
            "tensorflow_threads": "one op thread" if args.one_op_thread else "TensorFlow's defaults"}), flush=True)


def one_round(args, directory: str, parquet_dir: str, files: list, parse) -> dict[str, list[float]]:
    """Every path's rows/s, each over ``args.epochs`` full passes."""
    import ray
    import tensorflow as tf

    import raytf.data
    import train_tfrecords

    from raytf._internal.data import cursor as cursors
    from raytf._internal.data import planned, position, read_blocks, read_files, tfdata
    from raytf._internal.data.formats import plan_files
    from raytf._internal.data.request import ShardRequest
    from raytf._internal.driver.plans import materialize

    results: dict[str, list[float]] = {}
    auto = tf.data.AUTOTUNE
    native = tf.data.TFRecordDataset(files).batch(args.batch_size, drop_remainder=True)
    results["tf_tfrecord_dataset"] = rates(native.map(parse).prefetch(auto), args.epochs)
    native = tf.data.TFRecordDataset(files, num_parallel_reads=auto).batch(args.batch_size, drop_remainder=True)
    results["tf_tfrecord_parallel"] = rates(native.map(parse, num_parallel_calls=auto).prefetch(auto), args.epochs)
    shuffled = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files)).interleave(
        tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=auto).shuffle(8192)
    results["tf_tfrecord_shuffled"] = rates(shuffled.batch(args.batch_size, drop_remainder=True).map(
        parse, num_parallel_calls=auto).prefetch(auto), args.epochs)

    request = ShardRequest("train", args.batch_size, "x", "y", False, None, True)
    for name, source in (("tfrecord", train_tfrecords.read(directory, args.dim)),
                         ("parquet", raytf.data.parquet_files(parquet_dir))):
        start = time.perf_counter()
        plan = plan_files(source)
        if name == "tfrecord":
            results["raytf_count_rows_per_s"] = [plan.rows / (time.perf_counter() - start)]
        for shuffle in (False, True):
            cursor = cursors.FileCursor(plan, "train", plan.rows, position.Position.fresh(0, plan.rows, 1), 0,
                                         shuffle, 0, 1, args.batch_size, True)
            results[f"raytf_{name}_files" + ("_shuffled" if shuffle else "")] = rates(
                tfdata.finish(read_files.file_dataset(plan, cursor, request), cursor), args.epochs)

    start = time.perf_counter()
    blocks = planned.Blocks(planned.PlannedShard("train", *materialize(train_tfrecords.read(directory, args.dim, "ray-data")),
                                                 seed=0))
    blocks.gather(position.positions(((0, blocks.rows),)), ["x", "y"])  # every block read once
    results["raytf_read_rows_per_s"] = [blocks.rows / (time.perf_counter() - start)]
    for cache, name in ((True, "raytf_planned_cached"), (False, "raytf_planned_streaming")):
        cursor = cursors.Cursor("train", blocks.rows, position.Position.fresh(0, blocks.rows, 1), 0, False, 0, 1,
                                args.batch_size, True)
        pipeline = read_blocks.planned_dataset(blocks, cursor, request, cache)
        results[name] = rates(tfdata.finish(pipeline, cursor), args.epochs)
    if args.ray_data_anchors:
        epochs = args.ray_data_epochs or args.epochs
        # to_tf takes no fixed-size list column: a map_batches in NumPy makes it a tensor column first.
        to_tf = ray.data.read_parquet(parquet_dir).map_batches(lambda batch: batch, batch_format="numpy").to_tf(
            "x", "y", batch_size=args.batch_size, drop_last=True)
        results["ray_parquet_to_tf"] = rates(to_tf, epochs)
        try:
            to_tf = ray.data.read_tfrecords(directory).to_tf("x", "y", batch_size=args.batch_size, drop_last=True)
            results["ray_to_tf"] = rates(to_tf, epochs)
        except Exception as error:  # noqa: BLE001 - reported, the other paths still count
            print(json.dumps({"path": "ray_to_tf", "failed": f"{type(error).__name__}: {error}"[:300]}))
    return results


if __name__ == "__main__":
    main()

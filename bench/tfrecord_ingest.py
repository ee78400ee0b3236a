"""TFRecord ingest: rows/s into tf.data from a directory of TFRecord files, raytf against
TensorFlow's own pipeline and Ray Data's ``to_tf``, in one invocation.

    python bench/tfrecord_ingest.py [--files 8] [--rows 8192] [--dim 128] [--batch-size 128]

Writes ``--files`` files of ``tf.train.Example`` (``x``: ``--dim`` floats, ``y``: an int64), then
times full passes (no training, one TensorFlow thread, one reader as one worker has) of:

- ``tf_tfrecord_dataset``: ``tf.data.TFRecordDataset`` over the files, ``batch``, then
  ``tf.io.parse_example`` with the feature spec (TensorFlow's own pipeline, vectorized parse);
- ``raytf_planned_cached`` / ``raytf_planned_streaming``: ``raytf.data.read_tfrecords`` with the
  same spec, materialized once, then one rank's planned shard (``cache=True`` / ``False``); the
  one-time read and parse is ``raytf_read_rows_per_s``;
- ``ray_to_tf``: ``ray.data.read_tfrecords(...).to_tf`` (parsed by Ray Data every epoch).

Prints one JSON line per path and the ratios against TensorFlow's pipeline. The issue's goal for
a direct file path (not built yet) is 0.9x TensorFlow's pipeline; raytf's path here reads the
files once through Ray Data and then serves every epoch from memory.
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
    args = parser.parse_args()

    import ray
    import tensorflow as tf

    import train_tfrecords  # jobs/: the writer and the feature spec

    from raytf._internal.data import planned, position
    from raytf._internal.data.request import ShardRequest
    from raytf._internal.driver.plans import materialize

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    directory = tempfile.mkdtemp()
    train_tfrecords.write_demo_tfrecords(directory, files=args.files, rows=args.rows, dim=args.dim)
    files = sorted(os.path.join(directory, f) for f in os.listdir(directory))
    spec = {"x": tf.io.FixedLenFeature([args.dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    results: dict[str, list[float]] = {}

    native = tf.data.TFRecordDataset(files).batch(args.batch_size, drop_remainder=True).map(
        lambda records: (lambda parsed: (parsed["x"], parsed["y"]))(tf.io.parse_example(records, spec)))
    results["tf_tfrecord_dataset"] = rates(native.prefetch(tf.data.AUTOTUNE), args.epochs)

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(train_tfrecords)
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    start = time.perf_counter()
    blocks = planned.Blocks(planned.PlannedShard("train", *materialize(train_tfrecords.read(directory, args.dim)),
                                                 seed=0))
    blocks.gather(position.positions(((0, blocks.rows),)), ["x", "y"])  # every block read once
    results["raytf_read_rows_per_s"] = [blocks.rows / (time.perf_counter() - start)]
    request = ShardRequest("train", args.batch_size, "x", "y", False, None, True)
    for cache, name in ((True, "raytf_planned_cached"), (False, "raytf_planned_streaming")):
        cursor = planned.Cursor("train", blocks.rows, position.Position.fresh(0, blocks.rows, 1), 0, False, 0, 1,
                                args.batch_size, True)
        results[name] = rates(planned.planned_dataset(blocks, cursor, request, cache), args.epochs)
    try:
        to_tf = ray.data.read_tfrecords(directory).to_tf("x", "y", batch_size=args.batch_size, drop_last=True)
        results["ray_to_tf"] = rates(to_tf, args.epochs)
    except Exception as error:  # noqa: BLE001 - reported, the other paths still count
        print(json.dumps({"path": "ray_to_tf", "failed": f"{type(error).__name__}: {error}"[:300]}))

    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, value in medians.items():
        print(json.dumps({"path": name, "rows_per_s": round(value), "samples": len(results[name])}))
    base = medians["tf_tfrecord_dataset"]
    print(json.dumps({"ratios_vs_tf_tfrecord_dataset": {n: round(v / base, 3) for n, v in medians.items()
                                                         if n not in ("tf_tfrecord_dataset", "raytf_read_rows_per_s")},
                      "rows": args.files * args.rows, "dim": args.dim, "batch_size": args.batch_size}))


if __name__ == "__main__":
    main()

"""Ingest alone: rows/s from a Ray Data shard into tf.data, against
``tf.data.Dataset.from_tensor_slices`` over the same arrays, in one invocation.

    python bench/ingest.py [--batch-size 128] [--epochs 5] [--repeats 3]

Reads W1's 60,000 rows (784 float32 features, int64 label) the ways a raytf worker does,
with one TensorFlow thread: a planned shard (``DataConfig(exactly_once=True)``, the default:
the dataset materialized in order, each pass's rows gathered from the blocks), and one
``streaming_split`` shard (``exactly_once=False``). For each path it times full passes over
the data (no training) and prints one JSON line, then a line of ratios against
``from_tensor_slices``. Target: raytf's cached paths >= 1.0x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import w1  # noqa: E402

os.environ.update(w1.WORKER_ENV)


def epochs_per_second(dataset, epochs: int) -> list[float]:
    """Rows/s of full passes, consumed inside TensorFlow as a training step would be
    (a Python loop over batches would measure Python, not the input pipeline)."""
    import tensorflow as tf

    count = tf.function(lambda: dataset.reduce(tf.constant(0, tf.int64), lambda n, b: n + tf.cast(tf.shape(b[1])[0], tf.int64)))
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        rows = int(count())
        rates.append(rows / (time.perf_counter() - start))
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=w1.WORKER_BATCH)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import numpy as np
    import ray
    import tensorflow as tf

    from raytf._internal.data import columns, read_stream, tfdata
    from raytf._internal.data.shard import ShardRequest

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    ray.init(num_cpus=2, log_to_driver=False, include_dashboard=False)
    dataset = w1.ray_dataset()
    request = ShardRequest("train", args.batch_size, "x", "y", False, None, True)
    results: dict[str, list[float]] = {}

    def record(name: str, rates: list[float], **extra) -> None:
        results.setdefault(name, []).extend(rates)

    from raytf._internal.data import cursor as cursors
    from raytf._internal.data import planned, position, read_blocks
    from raytf._internal.driver.plans import materialize

    blocks = planned.Blocks(planned.PlannedShard("train", *materialize(dataset), seed=0))

    def planned_pass(cache: bool, shuffle: bool):
        """Rank 0 of 1's planned shard, from epoch 0."""
        cursor = cursors.Cursor("train", blocks.rows, position.Position.fresh(0, blocks.rows, 1), 7, shuffle, 0, 1,
                                args.batch_size, True)
        pipeline = read_blocks.planned_dataset(blocks, cursor, dataclasses.replace(request, shuffle=shuffle), cache)
        return tfdata.finish(pipeline, cursor)

    for _ in range(args.repeats):
        # raytf, planned (exactly_once=True): a pass's rows gathered from the blocks once per epoch.
        record("raytf_planned_cached", epochs_per_second(planned_pass(True, False), args.epochs))
        record("raytf_planned_cached_shuffled", epochs_per_second(planned_pass(True, True), args.epochs))
        record("raytf_planned_streaming", epochs_per_second(planned_pass(False, False), args.epochs))

        # raytf, cached: read the shard once, then every epoch runs inside tf.data.
        (shard,) = dataset.streaming_split(1, equal=True)
        start = time.perf_counter()
        arrays = columns.read_shard(shard, "train")
        read_s = time.perf_counter() - start
        rows = len(arrays["y"])
        cached = tfdata.finish(read_stream.dataset_from_arrays(arrays, request, rows, seed=None))
        record("raytf_cached", epochs_per_second(cached, args.epochs))
        shuffled = tfdata.finish(
            read_stream.dataset_from_arrays(arrays, dataclasses.replace(request, shuffle=True), rows, seed=7))
        record("raytf_cached_shuffled", epochs_per_second(shuffled, args.epochs))
        results.setdefault("raytf_cached_read_rows_per_s", []).append(rows / read_s)

        # The anchor: the same arrays, from_tensor_slices(...).batch(...).
        slices = tf.data.Dataset.from_tensor_slices((arrays["x"], arrays["y"])).batch(
            args.batch_size, drop_remainder=True
        )
        record("from_tensor_slices", epochs_per_second(slices, args.epochs))

        # raytf, streaming (cache=False): Ray Data every epoch, many batches per Python crossing.
        (shard,) = dataset.streaming_split(1, equal=True)
        streaming = tfdata.finish(read_stream.streaming_dataset(shard, request, shard.schema(), seed=None))
        record("raytf_streaming", epochs_per_second(streaming, args.epochs))

        # Ray's to_tf: from_generator, one Python crossing per batch.
        (shard,) = dataset.streaming_split(1, equal=True)
        to_tf = shard.to_tf("x", "y", batch_size=args.batch_size, drop_last=True)
        record("ray_to_tf", epochs_per_second(to_tf, args.epochs))
        del arrays, cached, slices

    medians = {name: statistics.median(rates) for name, rates in results.items()}
    for name, value in medians.items():
        print(json.dumps({"path": name, "rows_per_s": round(value), "samples": len(results[name])}))
    base = medians["from_tensor_slices"]
    print(json.dumps({
        "ratios_vs_from_tensor_slices": {
            name: round(value / base, 3)
            for name, value in medians.items()
            if name not in ("from_tensor_slices", "raytf_cached_read_rows_per_s")
        },
        "batch_size": args.batch_size,
        "rows": int(np.sum([len(b["y"]) for b in dataset.iter_batches(batch_size=None, batch_format="numpy")])),
    }))


if __name__ == "__main__":
    main()

"""Files larger than memory: a directory of TFRecord files twice Ray's object store, and larger
than a worker's memory, trained from through ``raytf.data.tfrecord_files``.

    python bench/large_files.py [--gib 4] [--object-store-gib 2] [--dim 1024] [--epochs 1]
                                [--ray-data | --only-ray-data] [--no-cache] [--repeats 3]

Writes ``--gib`` GiB of ``tf.train.Example`` files (``x``: ``--dim`` floats, ``y``: a class),
starts Ray with an object store of ``--object-store-gib`` GiB, and trains a linear classifier on
2 workers of 1 CPU through ``tfrecord_files`` (each worker reads its chunks of the files itself,
shuffled by chunk and window), with a custom loop. Every worker reports its peak resident memory
(``VmHWM``) and the rows it trained. Prints one JSON line: the dataset's size, the object store's,
each worker's peak memory, the rows trained per epoch against the dataset's, and rows/s; then
the same for the Ray Data path (``raytf.data.read_tfrecords``, materialized into the object
store once per run, so Ray spills what does not fit to disk) with ``--ray-data``, its shards
cached as tensors (the default) or, with ``--no-cache``, gathered from the blocks a few dozen
batches at a time. ``--repeats N`` trains each path N times over the same files, round by round
(each line says its ``repeat``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "jobs"))

GIB = 1 << 30


def write(directory: str, gib: float, dim: int, files: int) -> int:
    """``gib`` GiB of Examples in ``files`` files; returns the rows written. Each file repeats one
    block of generated rows with other labels, so writing costs serialization, not generation."""
    import numpy as np
    import tensorflow as tf

    per_row = 4 * dim + 40  # the floats and the proto's framing, about
    rows = int(gib * GIB / per_row)
    rng = np.random.default_rng(0)
    block = rng.standard_normal((4096, dim)).astype("float32")
    serialized = [tf.train.Example(features=tf.train.Features(feature={
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(row[0] > 0)])),
    })).SerializeToString() for row in block]
    per_file = -(-rows // files)
    written = 0
    for f in range(files):
        with tf.io.TFRecordWriter(os.path.join(directory, f"part-{f:04d}.tfrecord")) as writer:
            for i in range(min(per_file, rows - written)):
                writer.write(serialized[(written + i) % len(serialized)])
        written += min(per_file, rows - written)
    return written


def train(config: dict) -> None:
    import tensorflow as tf

    import raytf

    ctx = raytf.get_context()
    strategy = raytf.strategy()
    data = raytf.get_dataset_shard("train", batch_size=config["batch"], features="x", label="y", shuffle=True,
                                   cache=config["cache"])
    distributed = strategy.distribute_datasets_from_function(lambda _: data)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((config["dim"],)), tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.SGD(0.01)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=config["batch"] * 2)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return tf.shape(y)[0]

        return strategy.run(replica, args=(x, y))

    for epoch in range(config["epochs"]):
        rows, start = 0, time.perf_counter()
        for x, y in distributed:
            rows += int(step(x, y))
        seconds = time.perf_counter() - start
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024
        with open(os.path.join(config["out"], f"rank{ctx.world_rank}.json"), "w") as f:  # one machine
            json.dump({"rows": rows, "seconds": seconds, "peak_mb": peak}, f)
        raytf.report({"epoch": epoch})


def run(path: str, reader: str, args: argparse.Namespace, storage: str, rows: int, size: int) -> dict:
    import ray
    import tensorflow as tf

    import raytf

    features = {"x": tf.io.FixedLenFeature([args.dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    source = raytf.data.tfrecord_files(path, features) if reader == "files" else \
        raytf.data.read_tfrecords(path, features=features)
    out = tempfile.mkdtemp(prefix="raytf-large-ranks-")
    started = time.perf_counter()
    raytf.Trainer(
        train, config={"batch": args.batch_size, "dim": args.dim, "epochs": args.epochs, "out": out,
                       "cache": args.cache},
        datasets={"train": source},
        scaling=raytf.ScalingConfig(num_workers=2, cpus_per_worker=1),
        run=raytf.RunConfig(name=f"large-{reader}", storage_path=storage, verbose=0),
    ).fit()
    wall = time.perf_counter() - started
    stats = ray._private.internal_api.memory_summary(stats_only=True)  # noqa: SLF001 - spill figures
    spilled = [line.strip() for line in stats.splitlines() if "Spilled" in line]
    ranks = []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    trained = sum(r["rows"] for r in ranks)
    seconds = max(r["seconds"] for r in ranks)
    return {"reader": reader, "cache": args.cache if reader == "ray-data" else None, "dataset_gib": round(size / GIB, 2), "dataset_rows": rows,
            "object_store_gib": args.object_store_gib, "epochs": args.epochs,
            "rows_trained_last_epoch": trained, "rows_per_s": round(trained / seconds),
            "worker_peak_rss_mb": [round(r["peak_mb"]) for r in ranks],
            "fit_wall_s": round(wall, 1), "object_store_spilled": spilled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--object-store-gib", type=float, default=2.0)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256, help="per worker")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--ray-data", action="store_true", help="also the Ray Data path (read_tfrecords)")
    parser.add_argument("--only-ray-data", action="store_true", help="the Ray Data path alone")
    parser.add_argument("--no-cache", dest="cache", action="store_false",
                        help="the Ray Data path with get_dataset_shard(cache=False): batches gathered from the blocks")
    parser.add_argument("--data", help="a directory of files written by an earlier run (kept)")
    parser.add_argument("--repeats", type=int, default=1, help="each path this many times, round by round")
    args = parser.parse_args()

    import ray

    scratch = tempfile.mkdtemp(prefix="raytf-large-")
    path = args.data or os.path.join(scratch, "data")
    try:
        if args.data is None:
            os.makedirs(path)
            start = time.perf_counter()
            rows = write(path, args.gib, args.dim, args.files)
            print(json.dumps({"written_rows": rows, "write_s": round(time.perf_counter() - start, 1)}), flush=True)
        size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        from raytf._internal.data.formats import plan_files

        import raytf.data
        import tensorflow as tf

        rows = plan_files(raytf.data.tfrecord_files(path, {
            "x": tf.io.FixedLenFeature([args.dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)})).rows
        ray.init(num_cpus=3, object_store_memory=int(args.object_store_gib * GIB), include_dashboard=False,
                 log_to_driver=False)
        readers = ([] if args.only_ray_data else ["files"]) + (["ray-data"] if args.ray_data or args.only_ray_data
                                                               else [])
        for repeat in range(args.repeats):
            for reader in readers:
                result = run(path, reader, args, os.path.join(scratch, "results", str(repeat)), rows, size)
                print(json.dumps({**result, "repeat": repeat}), flush=True)
    finally:
        if args.data is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

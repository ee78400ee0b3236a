"""Train a classifier from a directory of TFRecord files of ``tf.train.Example``, parsed by a
TensorFlow feature spec: read by each worker directly (``raytf.data.tfrecord_files``), or
through Ray Data (``--reader ray-data``: ``raytf.data.read_tfrecords``).

    python jobs/train_tfrecords.py --data /path/to/tfrecords --dim 784
    python jobs/train_tfrecords.py                      # writes a generated directory first

Each Example holds ``x`` (``--dim`` floats) and ``y`` (an int64 class id), read as
``{"x": tf.io.FixedLenFeature([dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}``.
With no --data, the job first writes 4 files of generated rows to a temporary directory, so it
runs anywhere. Training is train_files.py's custom loop, a checkpoint per epoch; every row
trains once per epoch whatever happens to the workers (both readers record the data position
in every checkpoint).
"""

from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402  (flags and Ray start-up, shared by the jobs)
import train_files  # noqa: E402  (the training loop)

import raytf  # noqa: E402


def write_demo_tfrecords(directory: str, files: int = 4, rows: int = 4096, dim: int = 784, classes: int = 10) -> None:
    """``files`` TFRecord files of ``rows`` Examples each: ``x`` (``dim`` floats), ``y`` (a class id)."""
    import numpy as np
    import tensorflow as tf

    w = np.random.default_rng(0).standard_normal((dim, classes)).astype("float32")
    for i in range(files):
        x = np.random.default_rng(i + 1).standard_normal((rows, dim)).astype("float32")
        y = np.argmax(x @ w, axis=1)
        with tf.io.TFRecordWriter(os.path.join(directory, f"part-{i:03d}.tfrecord")) as writer:
            for row, label in zip(x, y):
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                })).SerializeToString())


# --8<-- [start:read]
def read(path: str, dim: int, reader: str = "files"):
    """The files as a dataset for ``Trainer(datasets=...)``: each worker reads its files with
    TensorFlow's reader (``files``), or Ray Data reads them into its object store (``ray-data``)."""
    import tensorflow as tf

    features = {"x": tf.io.FixedLenFeature([dim], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
    if reader == "files":
        return raytf.data.tfrecord_files(path, features)
    return raytf.data.read_tfrecords(path, features=features)
# --8<-- [end:read]


def build_parser():
    p = common.parser(__doc__.splitlines()[0], epochs=3, batch_size=256)
    p.add_argument("--data", help="a directory (or file) of TFRecord files (default: generated)")
    p.add_argument("--dim", type=int, default=784, help="floats per row in feature x")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--reader", choices=("files", "ray-data"), default="files",
                   help="files: each worker reads its files directly (larger than memory, exactly once by file and "
                        "record); ray-data: through Ray Data's object store")
    return p


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    common.connect(train_files)
    with tempfile.TemporaryDirectory() as scratch:
        path = args.data
        if path is None:
            path = scratch
            write_demo_tfrecords(path, dim=args.dim, classes=args.classes)
        result = raytf.Trainer(
            train_files.train_fn,
            config={"features": ["x"], "label": "y", "classes": args.classes, "epochs": args.epochs,
                    "batch_size": args.batch_size, "lr": args.lr},
            datasets={"train": read(path, args.dim, args.reader)},
            scaling=common.scaling(args),
            run=common.run_config(args),
        ).fit()
    common.print_result(result)


if __name__ == "__main__":
    main()

"""What every job in jobs/ shares: the flags a user changes on a cluster, Ray start-up, W1's data.

Every job runs unchanged in three places:

    python jobs/train_mlp.py                            # starts a local Ray of its own
    RAY_ADDRESS=ray://head:10001 python jobs/train_mlp.py   # a running cluster
    ray job submit --working-dir jobs -- python train_mlp.py --num-workers 4 --gpus-per-worker 1

``--name`` names the run: submitting a job again with the same name (and
storage) resumes it from its latest checkpoint. ``--storage-path`` defaults to
``$RAYTF_STORAGE_PATH`` (the configs in cluster/ set it to the cloud's object
store) or ``~/raytf_results``.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import raytf


def parser(description: str, *, epochs: int, batch_size: int, num_workers: int = 2,
           cpus_per_worker: float = 1, gpus_per_worker: float = 0) -> argparse.ArgumentParser:
    """The flags every job takes, with this job's defaults."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--num-workers", type=int, default=num_workers, help="training workers (Ray actors)")
    p.add_argument("--gpus-per-worker", type=float, default=gpus_per_worker)
    p.add_argument("--cpus-per-worker", type=float, default=cpus_per_worker)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--batch-size", type=int, default=batch_size, help="global batch size")
    p.add_argument("--storage-path", default=None,
                   help="local directory or s3:// / gs:// URI (default: $RAYTF_STORAGE_PATH or ~/raytf_results)")
    p.add_argument("--name", default=None, help="run name; the same name resumes the run")
    p.add_argument("--max-failures", type=int, default=3,
                   help="lost workers or nodes survived (each restart resumes from the latest checkpoint)")
    p.add_argument("--warm-standby", choices=("auto", "on", "off"), default="auto",
                   help="a process per worker that loads TensorFlow ahead of a restart (FailureConfig.warm_standby; "
                        "auto: for GPU workers)")
    return p


# --8<-- [start:configs]
def scaling(args: argparse.Namespace) -> raytf.ScalingConfig:
    return raytf.ScalingConfig(
        num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
    )


def run_config(args: argparse.Namespace, **kwargs: Any) -> raytf.RunConfig:
    warm_standby = {"auto": "auto", "on": True, "off": False}[args.warm_standby]
    return raytf.RunConfig(name=args.name, storage_path=args.storage_path,
                           failure_config=raytf.FailureConfig(max_failures=args.max_failures, warm_standby=warm_standby),
                           **kwargs)
# --8<-- [end:configs]


def parameter_server_flags(p: argparse.ArgumentParser, *, num_ps: int = 1) -> None:
    """The flags of the parameter-server jobs (--num-workers is the workers')."""
    p.add_argument("--num-ps", type=int, default=num_ps, help="parameter servers (Ray actors)")
    # The chief, the ps and the evaluator mostly wait: a quarter CPU each fits the group on two cores.
    p.add_argument("--cpus-per-ps", type=float, default=0.25)
    p.add_argument("--cpus-per-chief", type=float, default=0.25)


def parameter_server_scaling(args: argparse.Namespace, evaluators: int = 0) -> raytf.ParameterServerScaling:
    return raytf.ParameterServerScaling(
        num_workers=args.num_workers, num_ps=args.num_ps, num_evaluators=evaluators,
        cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
        cpus_per_ps=args.cpus_per_ps, cpus_per_chief=args.cpus_per_chief, cpus_per_evaluator=0.25,
    )


def connect(*modules: Any) -> None:
    """Connect to Ray (``RAY_ADDRESS``, as `ray job submit` sets it, or a new local Ray), quietly.

    ``modules`` (this folder's, which workers cannot import) travel to the
    workers by value.
    """
    import ray
    from ray import cloudpickle
    from ray.data import DataContext

    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    if not ray.is_initialized():
        ray.init(logging_level=logging.WARNING)
    context = DataContext.get_current()  # datasets made from here on carry it to the workers
    context.enable_progress_bars = False  # raytf's progress display is the one
    context.print_on_execution_start = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its routine notices, on this driver


def print_result(result: raytf.Result) -> None:
    print(json.dumps({"final_metrics": result.metrics, "path": result.path}, indent=1))


def w1_block(batch: dict, offset: int = 0) -> dict:
    """W1 rows: x ~ N(0, 1) in 784 dimensions, seeded by the block's first row id;
    y = argmax(x @ W), W fixed by seed 0."""
    import numpy as np

    ids = batch["id"] + offset
    w = np.random.default_rng(0).standard_normal((784, 10)).astype("float32")
    x = np.random.default_rng(int(ids[0])).standard_normal((len(ids), 784)).astype("float32")
    return {"x": x, "y": np.argmax(x @ w, axis=1).astype("int64")}


def w1_dataset(rows: int, offset: int = 0, blocks: int = 16):
    """W1 (raytf's benchmark workload) as a Ray Dataset: generated, no download."""
    import ray

    return ray.data.range(rows, override_num_blocks=blocks).map_batches(
        w1_block, batch_size=None, fn_kwargs={"offset": offset}
    )

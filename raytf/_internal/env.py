"""Every environment variable raytf reads or sets, with its default, in one place."""

from __future__ import annotations

import math
import os

from raytf.errors import ConfigError

# Read on the driver.
POLL_INTERVAL_S = "RAYTF_POLL_INTERVAL_S"  # how often the driver polls workers
SHUTDOWN_TIMEOUT_S = "RAYTF_SHUTDOWN_TIMEOUT_S"  # wait for killed actors to be gone
FAILURE_GRACE_S = "RAYTF_FAILURE_GRACE_S"  # after an exception, how long to look for a dead peer
STORAGE_PATH = "RAYTF_STORAGE_PATH"  # RunConfig.storage_path when none is given
DEFAULT_STORAGE_PATH = "~/raytf_results"
LEASE_TTL_S = "RAYTF_LEASE_TTL_S"  # a dead driver's lease on its run expires after this long

# Set in each worker before TensorFlow is imported.
TF_CONFIG = "TF_CONFIG"  # the cluster and this worker's task, built from its rank
TF_NUM_INTRAOP_THREADS = "TF_NUM_INTRAOP_THREADS"  # TensorflowConfig.intra_op_threads (default: the worker's CPUs)
TF_NUM_INTEROP_THREADS = "TF_NUM_INTEROP_THREADS"  # TensorflowConfig.inter_op_threads (default: the worker's CPUs)
OMP_NUM_THREADS = "OMP_NUM_THREADS"  # the intra-op threads, for oneDNN
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # the GPUs Ray assigned the worker; empty on CPU workers
TF_CPP_MIN_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"  # from TensorflowConfig.log_level
TF_USE_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"  # "1": tf.keras is tf-keras 2 (TensorflowConfig.keras)
GRPC_FAIL_FAST = "GRPC_FAIL_FAST"  # "use_caller" on parameter-server roles: a call to a lost task fails at once
# "true": TensorFlow's host allocator is BFC, which keeps the memory it frees for the next tensor of
# its size (worker/tensorflow.py: every asynchronous checkpoint's host copy reuses it). Its limit:
# this node's memory (TensorFlow's own default is 64 GiB).
TF_CPU_ALLOCATOR_USE_BFC = "TF_CPU_ALLOCATOR_USE_BFC"
TF_CPU_BFC_MEM_LIMIT_IN_MB = "TF_CPU_BFC_MEM_LIMIT_IN_MB"
# "1": ReportCallback has host memory of the state's sizes filled once before the first asynchronous
# checkpoint (checkpoint/state.py: prewarm). Off by default: it helps only where TensorFlow's host
# allocator keeps the memory it frees, which differs from one machine and allocator to the next.
PREWARM_HOST_COPIES = "RAYTF_PREWARM_HOST_COPIES"  # set it through TensorflowConfig.worker_env

# Set by a node's fork server (raytf_forkserver.py) in each worker it forks: the server's process id.
# Such a worker's TensorFlow was imported before it started, under the run's start environment.
FORKSERVER = "RAYTF_FORKSERVER"
# The fork servers' folder (sockets, locks, logs); default $TMPDIR/raytf-forkserver-<uid>.
FORKSERVER_DIR = "RAYTF_FORKSERVER_DIR"

# Set for a script run by raytf launch, besides the worker's variables above.
RUN_DIR = "RAYTF_RUN_DIR"  # the run's directory in its storage
CHECKPOINT_DIR = "RAYTF_CHECKPOINT_DIR"  # shared by every rank and restart: BackupAndRestore(backup_dir=...)
RANK = "RAYTF_RANK"  # the script's world rank
WORLD_SIZE = "RAYTF_WORLD_SIZE"  # how many ranks run the script
ATTEMPT = "RAYTF_ATTEMPT"  # 0 for the first attempt, then 1, 2, ... after each restart

_DEFAULTS = {POLL_INTERVAL_S: 0.1, SHUTDOWN_TIMEOUT_S: 30.0, FAILURE_GRACE_S: 3.0, LEASE_TTL_S: 60.0}


def get_float(name: str) -> float:
    """The float value of a raytf driver setting, or its default.

    As strict as the configs: a finite number of seconds above zero, else a
    ConfigError naming the variable (``nan`` would make the driver wait
    forever on a failing rank, or renew its lease in a busy loop).
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return _DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"environment variable {name} must be a finite number of seconds > 0, got {raw!r}; "
            f"set it to a number such as {_DEFAULTS[name]:g} (its default), or unset it"
        )
    return value


def check() -> None:
    """Every raytf setting read from the environment, checked before any actor starts."""
    for name in _DEFAULTS:
        get_float(name)

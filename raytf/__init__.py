"""raytf: distributed TensorFlow training on a Ray cluster.

One Ray actor per worker, placed through a placement group; each runs the
user's ``train_fn`` under ``tf.distribute.MultiWorkerMirroredStrategy`` with a
TF_CONFIG built from its rank. Importing raytf imports neither TensorFlow nor
Ray, so a worker can set TensorFlow's environment before TensorFlow loads.
"""

from raytf._version import __version__  # noqa: F401 - raytf.__version__
from raytf.checkpoint import Checkpoint
from raytf.config import CheckpointConfig, DataConfig, FailureConfig, RunConfig, ScalingConfig, TensorflowConfig
from raytf.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    DatasetShardError,
    FailureKind,
    HookError,
    PlacementTimeoutError,
    RaytfError,
    RunInUseError,
    StorageError,
    TrainingFailedError,
    WorkerFailure,
    WorkerStartError,
)
from raytf.launch import launch
from raytf.parameter_server import ParameterServerScaling, ParameterServerTrainer
from raytf.policies import (
    DefaultFailurePolicy,
    DefaultScalingPolicy,
    FailureDecision,
    FailureHistory,
    FailurePolicy,
    PlacementTry,
    ScalingPolicy,
)
from raytf.result import Result
from raytf.session import (
    TrainContext,
    all_reduce_gradients,
    coordinator,
    get_checkpoint,
    get_context,
    get_dataset_shard,
    preemption_requested,
    report,
    strategy,
)
from raytf.trainer import Trainer
from raytf import data  # noqa: F401 - raytf.data.read_tfrecords

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointError",
    "ConfigError",
    "DataConfig",
    "DataError",
    "DatasetShardError",
    "DefaultFailurePolicy",
    "DefaultScalingPolicy",
    "FailureConfig",
    "FailureDecision",
    "FailureHistory",
    "FailureKind",
    "FailurePolicy",
    "HookError",
    "ParameterServerScaling",
    "ParameterServerTrainer",
    "PlacementTimeoutError",
    "PlacementTry",
    "RaytfError",
    "Result",
    "RunConfig",
    "RunInUseError",
    "StorageError",
    "ScalingConfig",
    "ScalingPolicy",
    "TensorflowConfig",
    "TrainContext",
    "Trainer",
    "TrainingFailedError",
    "WorkerFailure",
    "WorkerStartError",
    "all_reduce_gradients",
    "coordinator",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "launch",
    "preemption_requested",
    "report",
    "strategy",
]

"""Ray Train's TensorFlow API on raytf: Ray Train code moves by changing its imports.

    from ray.train import ScalingConfig, RunConfig, Checkpoint, report, get_context   ->  from raytf.train import ...
    from ray.train.tensorflow import TensorflowTrainer, prepare_dataset_shard        ->  from raytf.train import ...
    from ray.train.tensorflow.keras import ReportCheckpointCallback                  ->  from raytf.train.keras import ...

Each name is a thin layer over raytf's own API (``raytf.Trainer``,
``raytf.ScalingConfig``, ``raytf.report``, ...); what has no counterpart is a
clear error that says what to write instead. Two things differ from Ray Train,
both for the better: ``get_dataset_shard(name).to_tf(...)`` is backed by
raytf's shards (read once, every epoch in tf.data; handed to ``model.fit`` it
is distributed per worker, not cut into slices), and Keras 3's ``model.fit``
works (Ray Train fails with "PerReplica" errors; raytf runs it with
``raytf.keras.fit``). Like Ray Train, ``TensorflowTrainer`` gives workers
tf-keras unless ``tensorflow_config`` says otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import pyarrow.fs as pafs

import raytf
from raytf.checkpoint import Checkpoint
from raytf.errors import ConfigError
from raytf.result import Result
from raytf.session import get_checkpoint, get_context

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "DataConfig",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "TensorflowConfig",
    "TensorflowTrainer",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "prepare_dataset_shard",
    "report",
]


def _refuse(setting: str, instead: str) -> ConfigError:
    return ConfigError(f"raytf.train: {setting} has no counterpart in raytf; {instead}")


@dataclass
class ScalingConfig:
    """Ray Train's ScalingConfig. ``resources_per_worker`` may hold "CPU" and "GPU" (1 CPU, and 1 GPU
    with ``use_gpu``, when it does not); ``num_workers=(min, max)`` is elastic, as in raytf."""

    num_workers: Union[int, tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[dict[str, float]] = None
    placement_strategy: str = "PACK"
    trainer_resources: Optional[dict[str, float]] = None
    accelerator_type: Optional[str] = None

    def _to_raytf(self) -> raytf.ScalingConfig:
        if self.trainer_resources:
            raise _refuse(
                "ScalingConfig.trainer_resources",
                "raytf's driver runs in the process that calls fit() and reserves nothing: remove it",
            )
        resources = dict(self.resources_per_worker or {})
        cpus = resources.pop("CPU", 1)
        gpus = resources.pop("GPU", 1 if self.use_gpu else 0)
        if gpus and not self.use_gpu:
            raise ConfigError(
                f"ScalingConfig(use_gpu=False) but resources_per_worker asks for {gpus} GPU: set use_gpu=True"
            )
        if self.accelerator_type:
            resources[f"accelerator_type:{self.accelerator_type}"] = 0.001  # as Ray Train asks for it
        return raytf.ScalingConfig(
            num_workers=self.num_workers,
            cpus_per_worker=cpus,
            gpus_per_worker=gpus,
            resources_per_worker=resources,
            placement=self.placement_strategy,
        )


@dataclass
class FailureConfig:
    """Ray Train's FailureConfig: ``max_failures`` (``-1``: always retry) and
    ``max_preemption_failures`` (``-1``, Ray Train's default: no limit; raytf's own default is 100)."""

    max_failures: int = 0
    max_preemption_failures: int = -1

    def _to_raytf(self) -> raytf.FailureConfig:
        return raytf.FailureConfig(max_failures=self.max_failures, max_preemptions=self.max_preemption_failures)


@dataclass
class CheckpointConfig:
    """Ray Train's CheckpointConfig: which reported checkpoints to keep."""

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"

    def _to_raytf(self) -> raytf.CheckpointConfig:
        return raytf.CheckpointConfig(
            num_to_keep=self.num_to_keep,
            score_attribute=self.checkpoint_score_attribute,
            mode=self.checkpoint_score_order,
        )


@dataclass
class RunConfig:
    """Ray Train's RunConfig. ``worker_runtime_env`` may set ``env_vars`` (they become
    ``TensorflowConfig.worker_env``); ``callbacks`` have no counterpart."""

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Any = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    callbacks: Optional[list] = None
    worker_runtime_env: Optional[dict] = None

    def _to_raytf(self) -> raytf.RunConfig:
        if self.callbacks:
            raise _refuse(
                "RunConfig.callbacks",
                "read result.history (every report) after fit(), or report from train_fn what a callback would log",
            )
        return raytf.RunConfig(
            name=self.name,
            storage_path=self.storage_path,
            storage_filesystem=self.storage_filesystem,
            failure_config=(self.failure_config or FailureConfig())._to_raytf(),
            checkpoint_config=(self.checkpoint_config or CheckpointConfig())._to_raytf(),
        )

    def _worker_env(self) -> dict[str, str]:
        runtime_env = dict(self.worker_runtime_env or {})
        env = runtime_env.pop("env_vars", {}) or {}
        if runtime_env:
            raise _refuse(
                f"RunConfig.worker_runtime_env keys {sorted(runtime_env)}",
                "give the job a runtime_env (`ray job submit --runtime-env-json`, or ray.init(runtime_env=...)); "
                "raytf's workers inherit it, and env_vars go to TensorflowConfig.worker_env",
            )
        return dict(env)


@dataclass
class DataConfig:
    """Ray Train's DataConfig: which datasets are split across the workers."""

    datasets_to_split: Union[str, Sequence[str]] = "all"

    def _to_raytf(self) -> raytf.DataConfig:
        return raytf.DataConfig(datasets_to_split=self.datasets_to_split)


def _from_ray_train(value: Any, ours: type, setting: str) -> Any:
    """``value`` as raytf.train's ``ours``: itself, or Ray Train's class of the same name (code half
    moved to raytf still builds ``ray.train.ScalingConfig``), field by field. A Ray Train field
    raytf.train lacks must be left at its default; one set otherwise is refused by name."""
    if value is None or isinstance(value, ours):
        return value
    if type(value).__name__ != ours.__name__ or not type(value).__module__.startswith("ray."):
        raise ConfigError(
            f"raytf.train: {setting} must be a raytf.train.{ours.__name__} (or Ray Train's), got {type(value).__name__}"
        )
    if ours is DataConfig:  # not a dataclass in Ray Train
        from raytf._internal import hooks
        from raytf._internal.hooks import ray as ray_hooks

        hooks.require("ray.train_data_config")
        return DataConfig(datasets_to_split=ray_hooks.train_datasets_to_split(value))
    known = {f.name for f in dataclasses.fields(ours)}
    reference = type(value)()  # its defaults, as its __post_init__ fills them in
    for field in dataclasses.fields(type(value)):
        default = getattr(reference, field.name)
        if field.name not in known and getattr(value, field.name) != default:
            raise _refuse(
                f"ray.train.{ours.__name__}({field.name}=...)", f"leave it at its default ({default!r}), or remove it"
            )
    fields = {name: getattr(value, name) for name in known if hasattr(value, name)}
    if ours is RunConfig:
        fields["failure_config"] = _from_ray_train(
            fields.get("failure_config"), FailureConfig, "RunConfig.failure_config"
        )
        fields["checkpoint_config"] = _from_ray_train(
            fields.get("checkpoint_config"), CheckpointConfig, "RunConfig.checkpoint_config"
        )
    return ours(**fields)


def TensorflowConfig(**kwargs: Any) -> raytf.TensorflowConfig:  # noqa: N802 - Ray Train's name for a config
    """raytf.TensorflowConfig, with tf-keras as Ray Train's workers have it unless ``keras`` says otherwise."""
    kwargs.setdefault("keras", "tf_keras")
    return raytf.TensorflowConfig(**kwargs)


class TensorflowTrainer:
    """Ray Train's TensorflowTrainer, running on raytf: ``fit()`` returns a raytf.Result."""

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: Optional[dict] = None,
        tensorflow_config: Optional[raytf.TensorflowConfig] = None,
        scaling_config: Optional[ScalingConfig] = None,
        run_config: Optional[RunConfig] = None,
        datasets: Optional[dict[str, Any]] = None,
        dataset_config: Optional[DataConfig] = None,
        metadata: Optional[dict] = None,
        resume_from_checkpoint: Optional[Checkpoint] = None,
    ):
        if resume_from_checkpoint is not None:
            raise _refuse(
                "TensorflowTrainer(resume_from_checkpoint=...)",
                "run again with the same RunConfig(name=..., storage_path=...): raytf resumes a run "
                "from its latest committed checkpoint",
            )
        if metadata:
            raise _refuse("TensorflowTrainer(metadata=...)", "pass what train_fn needs in train_loop_config")
        run_config = _from_ray_train(run_config, RunConfig, "TensorflowTrainer(run_config=...)") or RunConfig()
        run_config = dataclasses.replace(
            run_config,
            failure_config=_from_ray_train(run_config.failure_config, FailureConfig, "RunConfig.failure_config"),
            checkpoint_config=_from_ray_train(
                run_config.checkpoint_config, CheckpointConfig, "RunConfig.checkpoint_config"
            ),
        )
        scaling_config = _from_ray_train(scaling_config, ScalingConfig, "TensorflowTrainer(scaling_config=...)")
        dataset_config = _from_ray_train(dataset_config, DataConfig, "TensorflowTrainer(dataset_config=...)")
        tensorflow = tensorflow_config or TensorflowConfig()
        env = run_config._worker_env()
        if env:
            tensorflow = raytf.TensorflowConfig(
                **{**tensorflow.__dict__, "worker_env": {**tensorflow.worker_env, **env}}
            )
        self._trainer = raytf.Trainer(
            train_loop_per_worker,
            config=train_loop_config,
            scaling=(scaling_config or ScalingConfig())._to_raytf(),
            run=run_config._to_raytf(),
            tensorflow=tensorflow,
            datasets=datasets,
            data_config=(dataset_config or DataConfig())._to_raytf(),
        )

    def fit(self) -> Result:
        return self._trainer.fit()


def report(
    metrics: dict[str, Any],
    checkpoint: Optional[Checkpoint] = None,
    checkpoint_dir_name: Optional[str] = None,
    checkpoint_upload_mode: Any = "SYNC",
    delete_local_checkpoint_after_upload: Optional[bool] = None,
) -> None:
    """``ray.train.report``: a collective report, as in Ray Train. Every rank calls it; a
    checkpoint any rank passes is committed, with every rank's files merged into one directory
    (``raytf.report(..., ranks="all")``). ``checkpoint_dir_name`` aside: raytf names checkpoints.

    ``checkpoint_upload_mode`` (Ray Train's ``CheckpointUploadMode`` or its name), for this report
    whatever ``CheckpointConfig.upload`` says: ``SYNC`` returns once the merged checkpoint is
    committed; ``ASYNC`` once this rank's files are in host memory, the upload and the commit going
    on in the background as for ``raytf.report`` (one checkpoint in flight; a failure raised by
    the next report), and, as in Ray Train, it then deletes the local directory unless
    ``delete_local_checkpoint_after_upload=False``. ``NO_UPLOAD`` is refused."""
    from raytf._internal.protocol import CheckpointUpload
    from raytf._internal.worker import session as _session

    mode = str(getattr(checkpoint_upload_mode, "name", checkpoint_upload_mode)).upper()
    if mode not in ("SYNC", "ASYNC"):
        raise _refuse(
            f"report(checkpoint_upload_mode={mode})",
            "pass SYNC or ASYNC; raytf commits every reported checkpoint to the run's storage",
        )
    _session.current("train.report").report(metrics, checkpoint, "all", upload=CheckpointUpload[mode])
    delete = mode == "ASYNC" if delete_local_checkpoint_after_upload is None else delete_local_checkpoint_after_upload
    if delete and checkpoint is not None and isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        import shutil

        shutil.rmtree(checkpoint.path, ignore_errors=True)


class DatasetShard:
    """What ``get_dataset_shard(name)`` returns: Ray's DataIterator methods, backed by raytf's shards."""

    def __init__(self, name: str):
        self._name = name

    def to_tf(
        self,
        feature_columns: Union[str, list[str]],
        label_columns: Union[str, list[str], None] = None,
        *,
        batch_size: int = 1,
        drop_last: bool = False,
        local_shuffle_buffer_size: Optional[int] = None,
        local_shuffle_seed: Optional[int] = None,
        prefetch_batches: int = 1,
        feature_type_spec: Any = None,
        label_type_spec: Any = None,
        additional_columns: Any = None,
    ) -> Any:
        """This worker's shard as a ``tf.data.Dataset`` of (features, label) batches of ``batch_size`` rows.

        The shard is read once and every epoch runs in tf.data; a shuffle
        buffer means a full reshuffle every epoch, seeded by ``local_shuffle_seed``.
        """
        if feature_type_spec is not None or label_type_spec is not None or additional_columns is not None:
            raise _refuse(
                "to_tf(feature_type_spec / label_type_spec / additional_columns)",
                "raytf takes dtypes and shapes from the data: cast or add columns in Ray Data first",
            )
        if isinstance(label_columns, (list, tuple)):
            if len(label_columns) != 1:
                raise _refuse(
                    f"to_tf(label_columns={label_columns!r})",
                    "give one label column (stack several into one in Ray Data)",
                )
            label_columns = label_columns[0]
        return raytf.get_dataset_shard(
            self._name,
            batch_size=batch_size,
            features=feature_columns,
            label=label_columns,
            drop_remainder=drop_last,
            shuffle=local_shuffle_buffer_size is not None,
            seed=local_shuffle_seed,
        )

    def iter_tf_batches(
        self,
        *,
        batch_size: int = 256,
        dtypes: Any = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: Optional[int] = None,
        local_shuffle_seed: Optional[int] = None,
        prefetch_batches: int = 1,
        device: Any = None,
    ) -> Iterator[dict[str, Any]]:
        """This worker's shard as dicts of column name to a batch tensor. Each batch handed out counts
        as trained for the data position a checkpoint records (every row once per epoch)."""
        import tensorflow as tf

        from raytf._internal.data.cursor import cursor_of

        dataset = raytf.get_dataset_shard(
            self._name,
            batch_size=batch_size,
            drop_remainder=drop_last,
            shuffle=local_shuffle_buffer_size is not None,
            seed=local_shuffle_seed,
        )
        cursor = cursor_of(dataset)
        for batch in dataset:
            if cursor is not None:
                cursor.took(1)
            if dtypes is not None:
                batch = {k: tf.cast(v, dtypes[k] if isinstance(dtypes, Mapping) else dtypes) for k, v in batch.items()}
            yield batch

    def iter_batches(
        self, *, batch_size: int = 256, drop_last: bool = False, **kwargs: Any
    ) -> Iterator[dict[str, Any]]:
        """This worker's shard as dicts of column name to a NumPy batch."""
        for batch in self.iter_tf_batches(batch_size=batch_size, drop_last=drop_last, **kwargs):
            yield {k: v.numpy() for k, v in batch.items()}


def get_dataset_shard(dataset_name: Optional[str] = None) -> DatasetShard:
    """This worker's shard of ``TensorflowTrainer(datasets={name: ...})`` (the only one when no name)."""
    if dataset_name is None:
        from raytf._internal.worker.session import current

        names = current("train.get_dataset_shard").dataset_names()
        if len(names) != 1:
            raise ConfigError(f"raytf.train.get_dataset_shard(): name one of the datasets {sorted(names)}")
        dataset_name = names[0]
    return DatasetShard(dataset_name)


def prepare_dataset_shard(tf_dataset: Any) -> Any:
    """A per-worker ``tf.data.Dataset`` made ready for the strategy: TensorFlow's own sharding off
    (the data is sharded already), and distributed per worker when handed to ``model.fit``."""
    import tensorflow as tf

    from raytf._internal.worker.strategy import mark_shard

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return mark_shard(tf_dataset.with_options(options))

"""raytf.train's configs map onto raytf's, and what cannot map says what to write instead."""

import pytest

import raytf
from raytf import ConfigError
from raytf import train


def test_scaling_maps_use_gpu_and_resources_per_worker():
    assert train.ScalingConfig(num_workers=4)._to_raytf()._bundle() == {"CPU": 1.0}
    gpu = train.ScalingConfig(num_workers=2, use_gpu=True)._to_raytf()
    assert (gpu.num_workers, gpu.cpus_per_worker, gpu.gpus_per_worker) == (2, 1, 1)
    custom = train.ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 4, "GPU": 2, "ssd": 1},
                                 placement_strategy="SPREAD", accelerator_type="A100")._to_raytf()
    assert custom._bundle() == {"CPU": 4.0, "GPU": 2.0, "ssd": 1.0, "accelerator_type:A100": 0.001}
    assert custom.placement == "SPREAD"
    assert train.ScalingConfig(num_workers=(2, 4))._to_raytf().elastic


@pytest.mark.parametrize("make, fragment", [
    (lambda: train.ScalingConfig(resources_per_worker={"GPU": 1})._to_raytf(), "set use_gpu=True"),
    (lambda: train.ScalingConfig(trainer_resources={"CPU": 1})._to_raytf(), "trainer_resources has no counterpart"),
    (lambda: train.RunConfig(callbacks=[object()])._to_raytf(), "RunConfig.callbacks has no counterpart"),
    (lambda: train.RunConfig(worker_runtime_env={"pip": ["x"]})._worker_env(), "worker_runtime_env keys ['pip']"),
    (lambda: train.TensorflowTrainer(lambda: None, resume_from_checkpoint=raytf.Checkpoint("/x")),
     "same RunConfig(name=..., storage_path=...)"),
    (lambda: train.report({"loss": 1.0}, checkpoint_upload_mode="NO_UPLOAD"),
     "checkpoint_upload_mode=NO_UPLOAD) has no counterpart"),
])
def test_what_cannot_map_says_what_to_write_instead(make, fragment):
    with pytest.raises(ConfigError) as info:
        make()
    assert fragment in str(info.value)


def test_run_failure_and_checkpoint_configs_map():
    run = train.RunConfig(name="r", storage_path="/tmp/x", failure_config=train.FailureConfig(max_failures=3),
                          checkpoint_config=train.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc",
                                                                   checkpoint_score_order="min"))._to_raytf()
    assert (run.name, run.storage_path, run.failure_config.max_failures) == ("r", "/tmp/x", 3)
    assert (run.checkpoint_config.num_to_keep, run.checkpoint_config.score_attribute,
            run.checkpoint_config.mode) == (2, "acc", "min")
    assert train.RunConfig(worker_runtime_env={"env_vars": {"A": "1"}})._worker_env() == {"A": "1"}


def test_the_trainer_gives_workers_tf_keras_as_ray_train_does():
    trainer = train.TensorflowTrainer(lambda: None, run_config=train.RunConfig(
        worker_runtime_env={"env_vars": {"NCCL_DEBUG": "INFO"}}))
    assert trainer._trainer.tensorflow.keras == "tf_keras"
    assert trainer._trainer.tensorflow.worker_env == {"NCCL_DEBUG": "INFO"}
    assert train.TensorflowConfig(keras="keras3").keras == "keras3"


def test_report_checkpoint_callback_takes_only_epoch_ends():
    import raytf.keras
    from raytf.train.keras import ReportCheckpointCallback

    raytf.keras.ReportCallback()  # made first in the process, it once stood in for every subclass after it
    assert type(ReportCheckpointCallback()).__mro__[1] is ReportCheckpointCallback
    with pytest.raises(ConfigError, match="reports and checkpoints at epoch ends"):
        ReportCheckpointCallback(report_metrics_on="train_batch_end")


def test_ray_trains_own_configs_are_taken_as_they_are():
    import ray.train

    trainer = train.TensorflowTrainer(
        lambda: None,
        scaling_config=ray.train.ScalingConfig(num_workers=3, resources_per_worker={"CPU": 2}),
        run_config=ray.train.RunConfig(
            name="half-moved", storage_path="/tmp/half-moved", failure_config=ray.train.FailureConfig(max_failures=2),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")),
        dataset_config=ray.train.DataConfig(datasets_to_split=[]),
    )._trainer
    assert (trainer.scaling.num_workers, trainer.scaling.cpus_per_worker) == (3, 2)
    assert (trainer.run.name, trainer.run.storage_path, trainer.run.failure_config.max_failures) == (
        "half-moved", "/tmp/half-moved", 2)
    assert (trainer.run.checkpoint_config.num_to_keep, trainer.run.checkpoint_config.score_attribute) == (1, "acc")
    assert list(trainer.data_config.datasets_to_split) == []
    # raytf.train's RunConfig holding Ray Train's FailureConfig works too.
    mixed = train.TensorflowTrainer(lambda: None, run_config=train.RunConfig(
        failure_config=ray.train.FailureConfig(max_failures=-1)))._trainer
    assert mixed.run.failure_config.max_failures == -1


def test_a_ray_train_setting_raytf_has_no_counterpart_for_is_named():
    import inspect

    import ray.train

    # Ray Train V2 has controller_failure_limit (and from Ray 2.51 max_preemption_failures); V1 (the
    # default on the oldest Ray raytf supports) has fail_fast instead, and no preemption budget.
    ray_only = "controller_failure_limit" if "controller_failure_limit" in inspect.signature(
        ray.train.FailureConfig).parameters else "fail_fast"
    with pytest.raises(ConfigError, match=rf"ray.train.FailureConfig\({ray_only}=...\) has no counterpart"):
        train.TensorflowTrainer(lambda: None, run_config=ray.train.RunConfig(
            failure_config=ray.train.FailureConfig(**{ray_only: 3 if ray_only == "controller_failure_limit" else True})))
    if "max_preemption_failures" in inspect.signature(ray.train.FailureConfig).parameters:  # Ray 2.51 on
        bounded = train.TensorflowTrainer(lambda: None, run_config=ray.train.RunConfig(
            failure_config=ray.train.FailureConfig(max_preemption_failures=3)))._trainer
        assert bounded.run.failure_config.max_preemptions == 3
    with pytest.raises(ConfigError, match=r"scaling_config=...\) must be a raytf.train.ScalingConfig"):
        train.TensorflowTrainer(lambda: None, scaling_config=ray.train.RunConfig())


def test_checkpoints_hand_over_the_users_files_and_metadata_as_ray_train_does(tmp_path):
    import os

    import pyarrow.fs as pafs

    from raytf._internal.checkpoint.files import MANIFEST, upload

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.keras").write_text("weights")
    (tmp_path / "mine" / "sub").mkdir()
    (tmp_path / "mine" / "sub" / "notes.txt").write_text("epoch 3")
    stored = upload(raytf.Checkpoint.from_directory(tmp_path / "mine"), pafs.LocalFileSystem(), str(tmp_path / "run"),
                    "checkpoint_000000")
    checkpoint = train.Checkpoint(stored, metadata={"epoch": 3, "step": 30, "metrics": {"loss": 0.5}})
    assert os.path.exists(os.path.join(stored, MANIFEST))
    local = checkpoint.to_directory()  # no path: a new temporary directory
    try:
        files = sorted(os.path.relpath(os.path.join(d, f), local) for d, _, fs in os.walk(local) for f in fs)
        assert files == ["model.keras", os.path.join("sub", "notes.txt")]  # no raytf manifest
        assert open(os.path.join(local, "sub", "notes.txt")).read() == "epoch 3"
    finally:
        import shutil

        shutil.rmtree(local)
    assert checkpoint.get_metadata() == {"epoch": 3, "step": 30, "metrics": {"loss": 0.5}}

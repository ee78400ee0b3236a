import pytest

import raytf
from raytf import CheckpointConfig, ConfigError, FailureConfig, RunConfig, ScalingConfig, TensorflowConfig


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_workers": 0}, "num_workers must be >= 1, got 0"),
        ({"num_workers": 1.5}, "num_workers must be an int"),
        ({"num_workers": True}, "num_workers must be an int"),
        ({"cpus_per_worker": -1}, "cpus_per_worker must be >= 0"),
        ({"gpus_per_worker": -0.5}, "gpus_per_worker must be >= 0"),
        ({"gpus_per_worker": 1.5}, "whole number"),
        ({"resources_per_worker": {"tpu": -1}}, "resources_per_worker['tpu'] must be >= 0"),
        ({"resources_per_worker": {"GPU": 1}}, "gpus_per_worker instead"),
        ({"placement": "SCATTER"}, "placement must be one of PACK, SPREAD, STRICT_PACK, STRICT_SPREAD"),
        ({"cpus_per_worker": 0}, "reserves nothing per worker"),
        ({"placement_timeout_s": 0}, "placement_timeout_s must be > 0"),
        ({"num_workers": (3, 2)}, "needs min <= max, got (3, 2)"),
        ({"num_workers": (0, 2)}, "num_workers[0] (min) must be >= 1"),
        ({"num_workers": (1, 2, 3)}, "an int or a (min, max) pair"),
        ({"num_workers": (1, 2), "resize_timeout_s": 0}, "resize_timeout_s must be > 0"),
    ],
)
def test_bad_scaling_names_the_setting(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        ScalingConfig(**kwargs)
    assert fragment in str(info.value)


def test_scaling_bundle_and_normalised_placement():
    scaling = ScalingConfig(num_workers=2, cpus_per_worker=2, resources_per_worker={"ssd": 1}, placement="strict_spread")
    assert scaling.placement == "STRICT_SPREAD"
    assert scaling._bundle() == {"CPU": 2.0, "ssd": 1.0}  # no zero GPU entry: Ray rejects those
    assert ScalingConfig(cpus_per_worker=0, gpus_per_worker=1)._bundle() == {"GPU": 1.0}


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", ".hidden", "", "x" * 200, 7])
def test_run_names_that_could_escape_the_storage_root_are_rejected(name):
    with pytest.raises(ConfigError, match="RunConfig.name"):
        RunConfig(name=name)


def test_good_run_config():
    assert RunConfig(name="demo-1.2_b").name == "demo-1.2_b"
    with pytest.raises(ConfigError, match="storage_path"):
        RunConfig(storage_path="")


@pytest.mark.parametrize("value", [-2, 1.0, "3", None, True])
def test_bad_max_failures(value):
    with pytest.raises(ConfigError, match="FailureConfig.max_failures"):
        FailureConfig(max_failures=value)


def test_elastic_scaling_bounds():
    fixed, elastic = ScalingConfig(num_workers=3), ScalingConfig(num_workers=[2, 4])
    assert (fixed.elastic, fixed.min_workers, fixed.max_workers) == (False, 3, 3)
    assert (elastic.elastic, elastic.num_workers, elastic.min_workers, elastic.max_workers) == (True, (2, 4), 2, 4)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_to_keep": 0}, "num_to_keep must be >= 1"),
        ({"every_n_epochs": 0}, "every_n_epochs must be >= 1"),
        ({"every_n_steps": 2.5}, "every_n_steps must be an int"),
        ({"every_n_epochs": 1, "every_n_steps": 100}, "every_n_epochs or every_n_steps, not both"),
        ({"mode": "best"}, "mode must be 'max' or 'min'"),
    ],
)
def test_bad_checkpoint_config(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        CheckpointConfig(**kwargs)
    assert fragment in str(info.value)


def test_start_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="FailureConfig.start_timeout_s must be > 0"):
        FailureConfig(start_timeout_s=0)


def test_communication_defaults_follow_the_hardware():
    cpu, gpu = ScalingConfig(), ScalingConfig(gpus_per_worker=1)
    assert TensorflowConfig()._resolve_communication(cpu) == "ring"
    assert TensorflowConfig()._resolve_communication(gpu) == "nccl"
    assert TensorflowConfig(communication="RING")._resolve_communication(gpu) == "ring"
    with pytest.raises(ConfigError, match="communication='nccl' needs GPUs"):
        TensorflowConfig(communication="nccl")._resolve_communication(cpu)
    with pytest.raises(ConfigError, match="communication must be one of auto, ring, nccl"):
        TensorflowConfig(communication="mpi")


def test_bfloat16_compression_is_refused_on_gpu_workers_with_the_fix_named():
    """TensorFlow's GPU collectives refuse DT_BFLOAT16 (seen on an H100, NCCL and RING alike); the
    run is refused before it starts, pointing at float16."""
    gpu = ScalingConfig(gpus_per_worker=1)
    for communication in ("auto", "nccl", "ring"):
        with pytest.raises(ConfigError, match="gradient_compression='bfloat16' cannot run on GPU workers.*'float16'"):
            TensorflowConfig(communication=communication, gradient_compression="bfloat16")._resolve_communication(gpu)
    assert TensorflowConfig(gradient_compression="float16", error_feedback=True)._resolve_communication(gpu) == "nccl"
    assert TensorflowConfig(gradient_compression="bfloat16")._resolve_communication(ScalingConfig()) == "ring"


def test_threads_default_to_the_workers_cpus():
    assert TensorflowConfig()._threads(ScalingConfig(cpus_per_worker=4)) == (4, 4)
    assert TensorflowConfig()._threads(ScalingConfig(cpus_per_worker=0.5)) == (1, 1)
    assert TensorflowConfig(intra_op_threads=2)._threads(ScalingConfig()) == (2, 1)
    with pytest.raises(ConfigError, match="inter_op_threads must be >= 1"):
        TensorflowConfig(inter_op_threads=0)


def test_worker_env_may_not_override_tf_config():
    with pytest.raises(ConfigError, match="must not set TF_CONFIG"):
        TensorflowConfig(worker_env={"TF_CONFIG": "{}"})
    with pytest.raises(ConfigError, match="map str to str"):
        TensorflowConfig(worker_env={"NCCL_DEBUG": 1})
    with pytest.raises(ConfigError, match="collective_timeout_s"):
        TensorflowConfig(collective_timeout_s=-1)


def test_keras_and_mixed_precision_options():
    assert TensorflowConfig(keras="tf-keras").keras == "tf_keras"
    with pytest.raises(ConfigError, match="keras must be one of auto, keras3, tf_keras, got 'keras2'"):
        TensorflowConfig(keras="keras2")
    with pytest.raises(ConfigError, match="mixed_precision must be None, 'mixed_float16' or 'mixed_bfloat16'"):
        TensorflowConfig(mixed_precision="float16")
    with pytest.raises(ConfigError, match="keep only keras="):
        TensorflowConfig(keras="tf_keras", worker_env={"TF_USE_LEGACY_KERAS": "1"})


INF = float("inf")


@pytest.mark.parametrize(
    "make, fragment",
    [
        (lambda: ScalingConfig(cpus_per_worker=INF), "cpus_per_worker must be a finite number"),
        (lambda: ScalingConfig(gpus_per_worker=INF), "gpus_per_worker must be a finite number"),
        (lambda: ScalingConfig(resources_per_worker={"tpu": INF}), "resources_per_worker['tpu'] must be a finite"),
        (lambda: ScalingConfig(placement_timeout_s=INF), "placement_timeout_s must be a finite number, got inf; pass None"),
        (lambda: ScalingConfig(num_workers=(1, 2), resize_timeout_s=INF), "resize_timeout_s must be a finite"),
        (lambda: ScalingConfig(num_workers=10**12), "num_workers must be <= 100000"),
        (lambda: ScalingConfig(num_workers=(1, 10**12)), "num_workers[1] (max) must be <= 100000"),
        (lambda: ScalingConfig(resources_per_worker=["tpu"]), "resources_per_worker must be a dict, got list"),
        (lambda: ScalingConfig(check_resources="no"), "check_resources must be True or False, got 'no'"),
        (lambda: FailureConfig(worker_timeout_s=INF), "worker_timeout_s must be a finite number"),
        (lambda: FailureConfig(start_timeout_s=INF), "start_timeout_s must be a finite number"),
        (lambda: FailureConfig(hang_timeout_s=INF), "hang_timeout_s must be a finite number, got inf; pass None"),
        (lambda: FailureConfig(hang_timeout_s=0), "hang_timeout_s must be > 0 seconds or None"),
        (lambda: FailureConfig(retry_on_exception="yes"), "retry_on_exception must be True or False"),
        (lambda: FailureConfig(warm_standby="yes"), 'warm_standby must be True, False or "auto", got \'yes\''),
        (lambda: FailureConfig(warm_standby=1), 'warm_standby must be True, False or "auto", got 1'),
        (lambda: FailureConfig(keep_survivors="yes"), 'keep_survivors must be True, False or "auto", got \'yes\''),
        (lambda: TensorflowConfig(collective_timeout_s=INF), "collective_timeout_s must be a finite number"),
        (lambda: TensorflowConfig(gpu_memory_growth="false"), "gpu_memory_growth must be True or False"),
        (lambda: TensorflowConfig(worker_env="A=1"), "worker_env must be a dict, got str"),
        (lambda: TensorflowConfig(worker_env={"A=B": "1"}), "worker_env: 'A=B' is not an environment variable name"),
        (lambda: TensorflowConfig(worker_env={"": "1"}), "worker_env: '' is not an environment variable name"),
        (lambda: TensorflowConfig(worker_env={"A\0": "1"}), "is not an environment variable name"),
        (lambda: TensorflowConfig(worker_env={"A": "x\0y"}), "worker_env['A'] contains a NUL character"),
    ],
)
def test_infinite_oversized_and_mistyped_settings_are_config_errors(make, fragment):
    with pytest.raises(ConfigError) as info:
        make()
    assert fragment in str(info.value)


def test_warm_standbys_by_default_for_gpu_workers_from_their_start_and_for_cpu_workers_only_when_asked():
    assert FailureConfig().warm_standby == "auto"
    assert FailureConfig()._standbys(gpu_workers=True) == "at_start"
    assert FailureConfig()._standbys(gpu_workers=False) is None
    assert FailureConfig(warm_standby=True)._standbys(gpu_workers=False) == "when_trained"
    assert FailureConfig(warm_standby=True)._standbys(gpu_workers=True) == "at_start"
    assert FailureConfig(warm_standby=False)._standbys(gpu_workers=True) is None
    # Survivors kept: CPU workers by default, GPU workers only when asked.
    assert FailureConfig()._keeps_survivors(gpu_workers=False) and not FailureConfig()._keeps_survivors(gpu_workers=True)
    assert FailureConfig(keep_survivors=True)._keeps_survivors(gpu_workers=True)
    assert not FailureConfig(keep_survivors=False)._keeps_survivors(gpu_workers=False)


def test_none_for_a_mapping_means_empty_as_in_ray_train():
    assert ScalingConfig(resources_per_worker=None).resources_per_worker == {}
    assert TensorflowConfig(worker_env=None).worker_env == {}
    assert FailureConfig(hang_timeout_s=None).hang_timeout_s is None


@pytest.mark.parametrize("name", ["a\n", "run\nname", "a ", "a\0"])
def test_run_names_with_a_trailing_newline_or_control_characters_are_rejected(name):
    with pytest.raises(ConfigError, match="RunConfig.name"):
        RunConfig(name=name)


@pytest.mark.parametrize("variable", ["RAYTF_FAILURE_GRACE_S", "RAYTF_LEASE_TTL_S", "RAYTF_POLL_INTERVAL_S",
                                      "RAYTF_SHUTDOWN_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_every_raytf_seconds_variable_is_checked_as_strictly_as_a_config(monkeypatch, variable, value):
    from raytf._internal import env

    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        env.check()  # what fit() runs before anything starts
    assert variable in str(info.value) and repr(value) in str(info.value)
    monkeypatch.setenv(variable, "2.5")
    env.check()
    assert env.get_float(variable) == 2.5


def test_fit_refuses_a_nan_environment_setting_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setenv("RAYTF_LEASE_TTL_S", "nan")
    trainer = raytf.Trainer(lambda: None, run=raytf.RunConfig(storage_path=str(tmp_path)))
    with pytest.raises(ConfigError, match="RAYTF_LEASE_TTL_S"):
        trainer.fit()
    assert list(tmp_path.iterdir()) == []  # nothing of a run was written


def test_a_parameter_server_trainer_checks_tensorflow_options_against_its_own_scaling():
    gpu_workers = raytf.ParameterServerScaling(num_workers=2, gpus_per_worker=1)
    nccl = raytf.TensorflowConfig(communication="nccl")
    trainer = raytf.ParameterServerTrainer(lambda: None, scaling=gpu_workers, tensorflow=nccl)
    assert trainer.scaling is gpu_workers and trainer.tensorflow._resolve_communication(trainer.scaling) == "nccl"
    with pytest.raises(ConfigError, match="needs GPUs, but ParameterServerScaling has no role"):
        raytf.ParameterServerTrainer(lambda: None, scaling=raytf.ParameterServerScaling(), tensorflow=nccl)
    with pytest.raises(ConfigError, match="must be a raytf.ParameterServerScaling, got ScalingConfig"):
        raytf.ParameterServerTrainer(lambda: None, scaling=raytf.ScalingConfig())


def test_parameter_servers_can_ask_for_custom_resources_of_their_own():
    scaling = raytf.ParameterServerScaling(num_workers=2, num_ps=2, resources_per_worker={"gpu_node": 1},
                                           resources_per_ps={"memory_node": 1}, cpus_per_ps=0.5)
    assert scaling._bundle("ps") == {"CPU": 0.5, "memory_node": 1.0}
    assert scaling._bundle("worker") == {"CPU": 1.0, "gpu_node": 1.0}
    assert scaling._bundle("chief") == {"CPU": 1.0}  # the chief asks for neither
    # A parameter server with no CPU is placed by its custom resource alone.
    assert raytf.ParameterServerScaling(cpus_per_ps=0, resources_per_ps={"memory_node": 1})._bundle("ps") == {
        "memory_node": 1.0}
    with pytest.raises(ConfigError, match=r"resources_per_ps\['GPU'\]: set CPUs and GPUs with cpus_per_ps and gpus_per_ps"):
        raytf.ParameterServerScaling(resources_per_ps={"GPU": 1})
    with pytest.raises(ConfigError, match="resources_per_ps must be a dict, got list"):
        raytf.ParameterServerScaling(resources_per_ps=["memory_node"])

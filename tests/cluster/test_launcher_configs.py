"""cluster/*.yaml, checked offline with Ray's own cluster-launcher validation, and by the rules
raytf's users rely on: drivers only on the head, GPU node types that scale from zero on spot
capacity, object-store checkpoints, commands that name files that exist, room for the jobs."""

from __future__ import annotations

import copy
import glob
import os
import re
import shlex

import pytest
import yaml

from tests.cluster.conftest import CLUSTER, REPO, fits, job_module, job_scripts, repo_path, submitted_jobs

CLOUD = ["aws-gpu.yaml", "gcp-gpu.yaml"]
ALL = CLOUD + ["local-fake-gpu.yaml"]


def load(name):
    with open(os.path.join(CLUSTER, name)) as f:
        return yaml.safe_load(f)


def workers(config):
    return {n: t for n, t in config["available_node_types"].items() if n != config["head_node_type"]}


def commands(config):
    out = []
    for key in ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands"):
        out += config.get(key, [])
    for node_type in config["available_node_types"].values():
        out += node_type.get("worker_setup_commands", [])
    return out


@pytest.mark.parametrize("name", CLOUD)
def test_passes_rays_own_preparation_and_validation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(load(name)))
    validate_config(prepared)
    assert set(prepared["available_node_types"]) == set(load(name)["available_node_types"])


def test_the_local_config_passes_rays_schema_and_names_the_fake_head():
    from ray.autoscaler._private.util import validate_config

    config = load("local-fake-gpu.yaml")
    validate_config(config)  # complete as written: the wheel has no fake-provider defaults to merge
    assert config["provider"]["type"] == "fake_multinode"
    assert config["head_node_type"] == "ray.head.default"  # the fake provider's fixed head name
    # The comment's `ray start` flags match the head's declared resources.
    text = open(os.path.join(CLUSTER, "local-fake-gpu.yaml")).read()
    head = config["available_node_types"]["ray.head.default"]["resources"]
    assert f"--num-cpus {head['CPU']}" in text and f"--num-gpus {head['GPU']}" in text


def test_a_misspelt_key_is_rejected_so_the_validation_is_real():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load("aws-gpu.yaml")
    config["available_node_types"]["gpu_1x"]["min_worker"] = 0
    with pytest.raises(Exception, match="min_worker"):
        validate_config(prepare_config(config))


@pytest.mark.parametrize("name", ALL)
def test_every_node_type_states_its_resources_and_the_head_trains_nothing(name):
    config = load(name)
    for node_type in config["available_node_types"].values():
        assert "resources" in node_type  # else Ray asks the cloud, or guesses
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    assert head.get("GPU", 0) == 0
    if name in CLOUD:
        assert head["CPU"] == 0  # drivers only: no training worker (1+ CPU each) lands there


@pytest.mark.parametrize("name", ALL)
def test_gpu_node_types_with_one_and_several_gpus_scale_from_zero(name):
    config = load(name)
    gpus = sorted(t["resources"].get("GPU", 0) for t in workers(config).values())
    assert 1 in gpus and max(gpus) >= 2
    if name in CLOUD:
        assert max(gpus) >= 4
        assert any(t["resources"].get("GPU", 0) == 0 and t["resources"]["CPU"] > 0 for t in workers(config).values())
    for node_type in workers(config).values():
        assert node_type["min_workers"] == 0 and node_type["max_workers"] >= 1
    assert config["idle_timeout_minutes"] > 0


def test_gpu_nodes_are_spot_or_preemptible_capacity():
    for node_type in workers(load("aws-gpu.yaml")).values():
        if node_type["resources"].get("GPU"):
            assert node_type["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    for node_type in workers(load("gcp-gpu.yaml")).values():
        if node_type["resources"].get("GPU"):
            scheduling = node_type["node_config"]["scheduling"]
            assert scheduling["provisioningModel"] == "SPOT" and scheduling["onHostMaintenance"] == "TERMINATE"
            accelerators = node_type["node_config"]["guestAccelerators"]
            assert sum(a["acceleratorCount"] for a in accelerators) == node_type["resources"]["GPU"]


@pytest.mark.parametrize("name, scheme", [("aws-gpu.yaml", "s3://"), ("gcp-gpu.yaml", "gs://")])
def test_checkpoints_go_to_the_clouds_object_store_on_every_node(name, scheme):
    config = load(name)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        paths = re.findall(r"RAYTF_STORAGE_PATH=(\S+)", " ".join(config[key]))
        assert paths and all(p.startswith(scheme) for p in paths), key


@pytest.mark.parametrize("name", CLOUD)
def test_images_and_installs_give_tensorflow_with_gpu_support_and_raytf(name):
    import tomllib

    from raytf._version import NEWEST

    config = load(name)
    for image in (config["docker"]["image"], config["docker"]["head_image"]):
        assert image.startswith(f"rayproject/ray:{NEWEST['ray']}-py311")  # the newest Ray raytf is tested with
    assert config["docker"]["image"].endswith("-gpu")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    assert any("tensorflow[and-cuda]" in requirement for requirement in extras["gpu"])
    for node_type in workers(config).values():
        if node_type["resources"].get("GPU"):
            assert any("/home/ray/raytf[gpu]" in c for c in node_type["worker_setup_commands"])
    for command in commands(config):
        for extra in re.findall(r"raytf\[([\w,]+)\]", command):
            assert set(extra.split(",")) <= set(extras), command


@pytest.mark.parametrize("name", ALL)
def test_every_file_a_config_names_exists(name):
    config = load(name)
    for remote, local in config.get("file_mounts", {}).items():
        assert os.path.exists(os.path.join(REPO, local)), local
        assert remote == "/home/ray/raytf"
    for command in commands(config):
        for word in shlex.split(command.replace(";", " ")):
            word = word.strip("\"'").split("=", 1)[-1]
            path = re.sub(r"\[[\w,]+\]$", "", word)  # a pip extra
            if path.startswith(("~", "$")):
                continue  # on the node: the launcher writes ~/ray_bootstrap_config.yaml there
            if path.startswith("/home/ray/raytf") or path.endswith((".py", ".yaml")):
                assert os.path.exists(repo_path(path)), word
    for script, args in submitted_jobs(open(os.path.join(CLUSTER, name)).read()):
        assert os.path.exists(os.path.join(REPO, "jobs", script)), script
        job_module(script).build_parser().parse_args(args)  # the flags exist and parse


@pytest.mark.parametrize("name", ALL)
def test_the_node_types_hold_each_jobs_default_scaling_and_the_commands_shown(name, scaling_of):
    config = load(name)
    head = config["available_node_types"][config["head_node_type"]]["resources"]
    asks = [(script, []) for script in job_scripts()]
    asks += [(script, ["--gpus-per-worker", "1"]) for script in job_scripts()]
    asks += submitted_jobs(open(os.path.join(CLUSTER, name)).read())
    if name in CLOUD:
        asks += [("train_keras3.py", ["--num-workers", "1", "--gpus-per-worker", "4", "--cpus-per-worker", "8"])]
    for script, args in asks:
        scaling = scaling_of(script, args)
        bundle = scaling._bundle()
        room = sum(fits(bundle, t["resources"]) * t["max_workers"] for t in workers(config).values())
        assert room >= scaling.max_workers, (name, script, args, bundle)
        if name in CLOUD:
            assert fits(bundle, head) == 0, (script, args)  # never on the head


def test_the_docs_commands_for_clusters_name_jobs_that_take_their_flags():
    pages = [os.path.join(REPO, "README.md")] + glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
    text = "\n".join(open(page).read() for page in pages)
    jobs = submitted_jobs(text)
    assert any("--gpus-per-worker" in args for _, args in jobs)
    for script, args in jobs:
        if script.startswith(("bench/", "jobs/", "tests/")) and not os.path.basename(script).startswith("train_"):
            assert os.path.exists(os.path.join(REPO, script)), script
            continue
        if not os.path.basename(script).startswith("train_"):
            continue  # a user's own script in an example (raytf launch -- python my_script.py)
        script = os.path.basename(script)
        assert os.path.exists(os.path.join(REPO, "jobs", script)), script
        job_module(script).build_parser().parse_args(args)
    for path in re.findall(r"cluster/[\w./-]+\.yaml", text):
        assert os.path.exists(os.path.join(REPO, path)), path


def test_every_job_takes_warm_standby_and_passes_it_to_failure_config():
    for script in job_scripts():
        module = job_module(script)
        for flag, value in (("auto", "auto"), ("on", True), ("off", False)):
            args = module.build_parser().parse_args(["--warm-standby", flag])
            assert module.common.run_config(args).failure_config.warm_standby == value, (script, flag)
        assert module.build_parser().parse_args([]).warm_standby == "auto"
    with pytest.raises(SystemExit):
        job_module("train_mlp.py").build_parser().parse_args(["--warm-standby", "yes"])

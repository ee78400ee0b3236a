"""cluster/kuberay/ against KubeRay's CRD schema (unknown fields rejected), plus the operator's
own rules that the schema does not hold, and the image the manifests run."""

from __future__ import annotations

import copy
import os
import re
import shlex

import pytest
import yaml

from tests.cluster.conftest import CLUSTER, REPO, fits, job_module, repo_path

CRDS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kuberay_crds")
GPU = "nvidia.com/gpu"


def manifest(name):
    with open(os.path.join(CLUSTER, "kuberay", name)) as f:
        return yaml.safe_load(f)


def strict(node):
    """Reject unknown fields wherever the schema lists the known ones (as kubeconform does)."""
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node and not node.get(
                "x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        for value in node.values():
            strict(value)
    elif isinstance(node, list):
        for value in node:
            strict(value)
    return node


def validator(crd_file):
    import jsonschema

    with open(os.path.join(CRDS, crd_file)) as f:
        crd = yaml.safe_load(f)
    [v1] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(copy.deepcopy(v1["schema"]["openAPIV3Schema"])))


CASES = [("raycluster.yaml", "ray.io_rayclusters.yaml", "RayCluster"), ("rayjob.yaml", "ray.io_rayjobs.yaml", "RayJob")]


@pytest.mark.parametrize("name, crd, kind", CASES)
def test_manifests_validate_against_the_crd_schema(name, crd, kind):
    document = manifest(name)
    assert (document["apiVersion"], document["kind"]) == ("ray.io/v1", kind)
    errors = sorted(validator(crd).iter_errors(document), key=str)
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_an_unknown_field_is_rejected_so_the_validation_is_real():
    document = manifest("raycluster.yaml")
    document["spec"]["workerGroupSpecs"][0]["minReplica"] = 0
    assert any("minReplica" in e.message for e in validator("ray.io_rayclusters.yaml").iter_errors(document))


def containers(group):
    return group["template"]["spec"]["containers"]


def test_the_raycluster_autoscales_gpu_groups_from_zero_and_keeps_training_off_the_head():
    spec = manifest("raycluster.yaml")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    assert not any(GPU in c.get("resources", {}).get("limits", {}) for c in containers(spec["headGroupSpec"]))
    names = [g["groupName"] for g in spec["workerGroupSpecs"]]
    assert len(set(names)) == len(names)
    gpus = []
    for group in spec["workerGroupSpecs"]:
        # The operator's rules: min <= replicas <= max.
        assert 0 == group["minReplicas"] <= group.get("replicas", 0) <= group["maxReplicas"], group["groupName"]
        for container in containers(group):
            assert container["image"]
            requests, limits = container["resources"]["requests"], container["resources"]["limits"]
            assert requests.get(GPU) == limits.get(GPU)  # Kubernetes: extended resources request == limit
            if GPU in limits:
                gpus.append(int(limits[GPU]))
                tolerations = group["template"]["spec"]["tolerations"]
                assert any(t["key"] == GPU and t["operator"] == "Exists" for t in tolerations)
    assert 1 in gpus and max(gpus) >= 4


def test_the_raycluster_runs_the_ray_raytf_is_tested_with_and_stores_checkpoints_in_s3():
    from raytf._version import NEWEST

    spec = manifest("raycluster.yaml")["spec"]
    assert spec["rayVersion"] == NEWEST["ray"]
    dockerfile = open(os.path.join(CLUSTER, "docker", "Dockerfile")).read()
    assert f"FROM rayproject/ray:{NEWEST['ray']}-py311-gpu" in dockerfile
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for container in containers(group):
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            assert env["RAYTF_STORAGE_PATH"].startswith("s3://")


def gibibytes(quantity: str) -> float:
    """A Kubernetes memory quantity in GiB (the binary suffixes the manifests use)."""
    units = {"Ki": 2**-20, "Mi": 2**-10, "Gi": 1, "Ti": 2**10}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti)", quantity).groups()
    return float(number) * units[unit]


def test_every_pod_mounts_shared_memory_sized_for_the_object_store_and_checkpoints_in_memory():
    """Kubernetes gives a container 64 MiB at /dev/shm: Ray's object store and raytf's snapshots
    and restores from memory need a memory volume there (counted against the pod's memory)."""
    spec = manifest("raycluster.yaml")["spec"]
    for group in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            [mount] = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/dev/shm"]
            volume = volumes[mount["name"]]
            assert volume["emptyDir"]["medium"] == "Memory", group.get("groupName", "head")
            memory = gibibytes(container["resources"]["limits"]["memory"])
            # Ray's object store takes 30% of memory by default; raytf's copies of a checkpoint come on top.
            assert 0.3 * memory <= gibibytes(volume["emptyDir"]["sizeLimit"]) <= 0.5 * memory, group.get("groupName")


def test_the_image_copies_files_that_exist():
    for line in open(os.path.join(CLUSTER, "docker", "Dockerfile")):
        if line.startswith("COPY"):
            sources = [w for w in shlex.split(line)[1:-1] if not w.startswith("--")]
            for source in sources:
                assert os.path.exists(os.path.join(REPO, source)), source


def test_the_rayjob_runs_a_job_from_jobs_on_the_raycluster_and_its_flags_fit_the_groups():
    job = manifest("rayjob.yaml")["spec"]
    cluster = manifest("raycluster.yaml")
    # The operator needs a cluster to run on: a spec of its own, or a selector; not both.
    assert ("rayClusterSpec" in job) != ("clusterSelector" in job)
    assert job["clusterSelector"]["ray.io/cluster"] == cluster["metadata"]["name"]
    runtime_env = yaml.safe_load(job["runtimeEnvYAML"])
    assert set(runtime_env) <= {"working_dir", "env_vars", "pip", "py_modules", "excludes", "conda"}
    assert runtime_env["env_vars"]["RAYTF_STORAGE_PATH"].startswith("s3://")
    words = shlex.split(job["entrypoint"])
    assert words[0] == "python"
    script = os.path.join(repo_path(runtime_env["working_dir"]), words[1])
    assert os.path.exists(script), script
    dockerfile = open(os.path.join(CLUSTER, "docker", "Dockerfile")).read()
    assert re.search(r"COPY .*\bjobs /home/ray/raytf/jobs", dockerfile)  # the working_dir is in the image
    args = job_module(words[1]).build_parser().parse_args(words[2:])
    bundle = {"CPU": args.cpus_per_worker, "GPU": args.gpus_per_worker}
    room = 0
    for group in cluster["spec"]["workerGroupSpecs"]:
        limits = containers(group)[0]["resources"]["limits"]
        node = {"CPU": float(limits["cpu"]), "GPU": float(limits.get(GPU, 0))}
        room += fits({k: v for k, v in bundle.items() if v}, node) * group["maxReplicas"]
    assert room >= args.num_workers


def test_the_worker_groups_hold_each_jobs_default_scaling(scaling_of):
    from tests.cluster.conftest import job_scripts

    groups = manifest("raycluster.yaml")["spec"]["workerGroupSpecs"]
    for script in job_scripts():
        for args in ([], ["--gpus-per-worker", "1"]):
            scaling = scaling_of(script, args)
            room = 0
            for group in groups:
                limits = containers(group)[0]["resources"]["limits"]
                node = {"CPU": float(limits["cpu"]), "GPU": float(limits.get(GPU, 0))}
                room += fits(scaling._bundle(), node) * group["maxReplicas"]
            assert room >= scaling.max_workers, (script, args)

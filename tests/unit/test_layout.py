"""The house's rules, read from the source: Ray only where the README says, TensorFlow never at
import time, and the control plane importing neither."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "raytf"

# The modules that may import Ray (README, Layout).
RAY_MODULES = {
    "trainer.py",  # connects to Ray, and takes ray.data Datasets
    "launch.py",  # pickles the command for the workers
    "parameter_server.py",  # pickles train_fn, evaluate_fn and the partitioner for the actors
    "_internal/driver/cluster.py",
    "_internal/driver/placement.py",
    "_internal/driver/worker_group.py",
    "_internal/driver/ps_group.py",
    "_internal/driver/kept_shards.py",
    "_internal/data/shard.py",  # a kept shard is read with ray.get
    "_internal/worker/actor.py",
    "_internal/worker/payloads.py",
    "_internal/worker/logs.py",
}
# Pure: no Ray, no TensorFlow, tested in milliseconds.
PURE = [
    "_internal/protocol.py", "_internal/driver/controller.py", "_internal/driver/failure.py",
    "_internal/driver/scaling.py", "_internal/driver/watch.py", "_internal/driver/hang.py",
    "_internal/driver/preflight.py", "_internal/driver/topology.py", "_internal/data/split.py",
]


def imports(path):
    """(module, at module level) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, id(node) in top))
    return found


def modules():
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("name", modules())
def test_ray_is_imported_only_where_the_readme_says(name):
    uses_ray = any(m == "ray" or m.startswith("ray.") for m, _ in imports(PACKAGE / name))
    assert not uses_ray or name in RAY_MODULES, f"{name} imports Ray"


@pytest.mark.parametrize("name", modules())
def test_tensorflow_is_never_imported_at_module_level(name):
    # A worker sets TF_CONFIG, threads and the Keras choice before TensorFlow loads.
    assert not [m for m, top in imports(PACKAGE / name) if top and m.split(".")[0] in ("tensorflow", "keras", "tf_keras")]


@pytest.mark.parametrize("name", PURE)
def test_the_control_plane_imports_neither_ray_nor_tensorflow(name):
    assert not [m for m, _ in imports(PACKAGE / name) if m.split(".")[0] in ("ray", "tensorflow")]


def test_the_readme_marks_every_module_that_imports_ray():
    readme = (PACKAGE.parent / "README.md").read_text()
    marked = set()
    for line in readme.splitlines():
        if line.rstrip().endswith("[Ray]"):
            marked |= {word.rstrip(",") for word in line.split() if word.rstrip(",").endswith(".py")}
    assert marked == {name.split("/")[-1] for name in RAY_MODULES}

"""The house's rules, read from the source: Ray only where the layout (docs/contributing.md) says, TensorFlow never at
import time, and the control plane importing neither."""

import ast
import functools
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "raytf"

# The modules that may import Ray (docs/contributing.md, Layout).
RAY_MODULES = {
    "trainer.py",  # connects to Ray, and takes ray.data Datasets
    "launch.py",  # pickles the command for the workers
    "parameter_server.py",  # pickles train_fn, evaluate_fn and the partitioner for the actors
    "data.py",  # read_tfrecords is Ray Data's, with a feature spec
    "_internal/driver/cluster.py",
    "_internal/driver/placement.py",
    "_internal/driver/actors.py",
    "_internal/driver/group.py",
    "_internal/driver/shapes.py",  # a parameter-server chief's shard manifests, a placement error's figures
    "_internal/driver/warm.py",
    "_internal/driver/growth.py",  # the missing workers' placement group
    "_internal/driver/relay.py",  # an answer's Ray errors, read where the relay polls
    "_internal/driver/kept_shards.py",
    "_internal/data/shard.py",  # a kept shard is read with ray.get
    "_internal/data/planned.py",  # a planned shard's blocks are read with ray.get
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


@functools.lru_cache(maxsize=None)
def parse(path):
    source = path.read_text()
    try:
        return ast.parse(source)
    except SystemError:  # CPython gh-106905 (fixed in 3.11.8): a spurious "AST constructor recursion
        return ast.parse(source)  # depth mismatch" while other threads run (Ray's, in a suite process)


def imports(path):
    """(module, at module level) for every import in the file."""
    tree = parse(path)
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


def test_the_layout_marks_every_module_that_imports_ray():
    readme = (PACKAGE.parent / "docs" / "contributing.md").read_text()
    marked = set()
    for line in readme.splitlines():
        if line.rstrip().endswith("[Ray]"):
            marked |= {word.rstrip(",") for word in line.split() if word.rstrip(",").endswith(".py")}
    assert marked == {name.split("/")[-1] for name in RAY_MODULES}


def module_name(name):
    dotted = "raytf." + name[:-3].replace("/", ".")
    return dotted[: -len(".__init__")] if dotted.endswith(".__init__") else dotted


@functools.lru_cache(maxsize=None)
def raytf_imports():
    """module -> the raytf modules it imports, anywhere in it."""
    names = {module_name(n) for n in modules()}
    graph = {}
    for name in modules():
        found = set()
        for module, _ in imports(PACKAGE / name):
            found |= {module} & names
            tree_from = [n for n in ast.walk(parse(PACKAGE / name))
                         if isinstance(n, ast.ImportFrom) and n.module == module]
            found |= {f"{module}.{a.name}" for node in tree_from for a in node.names} & names
        graph[module_name(name)] = found - {module_name(name)}
    return graph


def test_no_import_cycles():
    graph, done, path = raytf_imports(), set(), []

    def visit(module):
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(module):] + [module]))
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            visit(imported)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


# What raytf's internals may import of its public layer: the plain types both sides share.
SHARED = {"raytf.config", "raytf.tensorflow_config", "raytf.errors", "raytf.checkpoint", "raytf._version"}


def test_internals_import_of_the_public_layer_only_the_plain_types_both_sides_share():
    for module, imported in raytf_imports().items():
        if module.startswith("raytf._internal"):
            up = {m for m in imported if not m.startswith("raytf._internal") and m not in SHARED}
            assert not up, f"{module} imports {sorted(up)}"


@pytest.mark.parametrize("name", modules())
def test_no_module_is_over_400_lines(name):
    assert len((PACKAGE / name).read_text().splitlines()) <= 400

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
    "_internal/driver/survivors.py",
    "_internal/driver/growth.py",  # the missing workers' placement group
    "_internal/driver/relay.py",  # an answer's Ray errors, read where the relay polls
    "_internal/driver/kept_shards.py",
    "_internal/data/shard.py",  # a kept shard is read with ray.get
    "_internal/data/planned.py",  # a planned shard's blocks are read with ray.get
    "_internal/worker/actor.py",
    "_internal/worker/payloads.py",
    "_internal/worker/logs.py",
    "_internal/hooks/ray.py",  # Ray's private code, the one place raytf reaches it
    "_internal/hooks/__main__.py",  # checks Ray's hooks against a Ray it connects to
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


def imports(path, skip=frozenset()):
    """(module, at module level) for every import in the file, but those whose node ids are in ``skip``."""
    tree = parse(path)
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
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
def _type_checking_only(tree):
    """The ids of the import nodes under ``if TYPE_CHECKING:``: for the type checker, never run."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
            and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
            for statement in node.body for inner in ast.walk(statement)}


def raytf_imports():
    """module -> the raytf modules it imports, anywhere in it (but for the type checker alone)."""
    names = {module_name(n) for n in modules()}
    graph = {}
    for name in modules():
        found = set()
        skipped = _type_checking_only(parse(PACKAGE / name))
        for module, _ in imports(PACKAGE / name, skip=skipped):
            found |= {module} & names
            tree_from = [n for n in ast.walk(parse(PACKAGE / name))
                         if isinstance(n, ast.ImportFrom) and n.module == module and id(n) not in skipped]
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


# The data path, one way (raytf/_internal/data/shard.py): each stage's modules use only their own
# stage's and the stages before.
DATA_STAGES = {
    "source": ["request", "columns", "planned"],
    "plan": ["position", "files", "formats", "formats.tfrecord", "formats.parquet"],
    "position": ["cursor"],
    "reader": ["read_blocks", "read_files", "read_stream"],
    "tf.data": ["tfdata"],
    "shard": ["shard"],
}


def test_the_data_path_goes_one_way_from_source_to_tf_data():
    graph = raytf_imports()
    stage_of = {f"raytf._internal.data.{m}": i for i, ms in enumerate(DATA_STAGES.values()) for m in ms}
    assert set(stage_of) <= set(graph), sorted(set(stage_of) - set(graph))
    stages = list(DATA_STAGES)
    backwards = [f"{m} ({stages[stage_of[m]]}) imports {i} ({stages[stage_of[i]]})"
                 for m in sorted(stage_of) for i in sorted(graph[m]) if stage_of.get(i, -1) > stage_of[m]]
    assert not backwards, backwards
    # A format is one class, in one module of formats/: adding one touches that module (and the
    # registry in formats/__init__.py), no reader.
    readers = [f"raytf._internal.data.{m}" for m in DATA_STAGES["reader"]]
    assert not any(i.startswith("raytf._internal.data.formats.") for r in readers for i in graph[r])


# What raytf's internals may import of its public layer: the plain types both sides share.
SHARED = {"raytf.config", "raytf.tensorflow_config", "raytf.errors", "raytf.checkpoint", "raytf._version",
          "raytf.policies"}


def test_internals_import_of_the_public_layer_only_the_plain_types_both_sides_share():
    for module, imported in raytf_imports().items():
        if module.startswith("raytf._internal"):
            up = {m for m in imported if not m.startswith("raytf._internal") and m not in SHARED}
            assert not up, f"{module} imports {sorted(up)}"


@pytest.mark.parametrize("name", modules())
def test_no_module_is_over_500_lines(name):
    # 400 lines when the code was packed by hand; ruff format's layout takes about a fifth more.
    assert len((PACKAGE / name).read_text().splitlines()) <= 500


# Private code of the libraries raytf stands on: reached only from raytf/_internal/hooks/.
LIBRARIES = ("tensorflow", "keras", "tf_keras", "ray")
PRIVATE_MODULES = ("tensorflow.python", "tensorflow.core", "keras.src", "tf_keras.src", "ray.experimental")
# Private names of the standard library raytf may use: not a library's.
STDLIB_PRIVATE = {("sys", "_current_frames"), ("sys", "_getframe")}


def _private_module(module):
    parts = module.split(".")
    return parts[0] in LIBRARIES and (module.startswith(PRIVATE_MODULES) or any(p.startswith("_") for p in parts[1:]))


def _private(name):
    return name.startswith("_") and not name.startswith("__")


@functools.lru_cache(maxsize=None)
def raytf_own_names():
    """Every name raytf itself defines outside the hooks (functions, classes, attributes it sets,
    arguments, imports): a private name not among them that raytf reads is a library's."""
    names = set()
    for name in modules():
        if name.startswith("_internal/hooks/"):
            continue
        for node in ast.walk(parse(PACKAGE / name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.module is None if hasattr(node, "module") else False:
                names.add(node.name)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raytf"):
                names |= {a.asname or a.name for a in node.names}
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)):
                names.add(node.args[1].value)
    return names


def private_reaches(tree):
    """Each reach into a library's private code in one module's ``tree``: ``line: what``. raytf's own
    private names are those it defines, and any it spells ``_raytf...`` (its marks on a library's objects)."""
    own, found = raytf_own_names(), []

    def theirs(name):
        return _private(name) and name not in own and not name.startswith("_raytf")

    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if _private_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _private_module(node.module):
                found.append(f"{line}: from {node.module} import ...")
            elif node.module.split(".")[0] in LIBRARIES:
                found += [f"{line}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and theirs(node.attr):
            if (getattr(node.value, "id", None), node.attr) not in STDLIB_PRIVATE:
                found.append(f"{line}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if (text.isidentifier() and theirs(text)) or _private_module(text.split(" ")[0]):
                found.append(f"{line}: {text!r}")
    return found


@pytest.mark.parametrize("name", [n for n in modules() if not n.startswith("_internal/hooks/")])
def test_private_code_of_tensorflow_keras_and_ray_is_reached_only_from_the_hooks(name):
    found = private_reaches(parse(PACKAGE / name))
    assert not found, f"raytf/{name} reaches private code outside raytf/_internal/hooks/: {found}"


def test_the_reach_finder_finds_each_kind_of_reach():
    """The rule above fails on each way raytf has reached private code: a private module, a private
    name imported, an attribute (through ``self`` too, in a method raytf put on a library's class),
    a name spelled as a string; and passes raytf's own private names and the standard library's."""
    source = ("from tensorflow.python.ops import gen_dataset_ops\n"
              "from ray.experimental.internal_kv import _internal_kv_get\n"
              "from ray._private import state\n"
              "def f(op, dataset, sys, self):\n"
              "    op._add_control_input(None)\n"
              "    getattr(dataset, '_original_dataset', None)\n"
              "    sys.modules.get('tensorflow.python.framework.errors_impl')\n"
              "    return sys._current_frames(), f._raytf_mark, self._hook_checked, '_raytf_shard'\n")
    found = sorted(reach.split(": ", 1)[1] for reach in private_reaches(ast.parse(source)))
    assert found == sorted(["from tensorflow.python.ops import ...", "from ray.experimental.internal_kv import ...",
                            "from ray._private import ...", "._add_control_input", "'_original_dataset'",
                            "'tensorflow.python.framework.errors_impl'", "._hook_checked"]), found


# Where raytf raises Python's own errors: checks of its own state (a bug in raytf if one fails), caught
# where they are raised for (a checkpoint's data position that does not fit, an index entry), or
# abstract. Every error a user is meant to act on is a raytf.RaytfError (docs/reference/errors.md).
INTERNAL_RAISES = {
    ("launch.py", "_no_train_fn"), ("_internal/hooks/__init__.py", "named"),
    ("_internal/hooks/tensorflow/checkpoint.py", "host_copies"), ("_internal/driver/failure.py", "root_cause"),
    ("_internal/driver/shapes.py", "order"), ("_internal/driver/shapes.py", "datasets"),
    ("_internal/driver/shapes.py", "placement_error"), ("_internal/driver/topology.py", "assign_ranks"),
    ("_internal/driver/topology.py", "build_tf_config"), ("_internal/driver/topology.py", "check_unique"),
    ("_internal/driver/group.py", "__init__"), ("_internal/worker/payloads.py", "user_code"),
    ("_internal/worker/ps.py", "retarget"), ("_internal/data/cursor.py", "resume_point"),
    ("_internal/data/position.py", "from_json"), ("_internal/checkpoint/manager.py", "parse_entry"),
    ("_internal/checkpoint/snapshot.py", "take"),
    ("_internal/checkpoint/saver.py", "_upload_as"),  # an upload that lost a part: retried (uploads.py)
    # The accessors of values always set by the time they are read (docs/contributing.md, mypy):
    ("_internal/protocol.py", "share"), ("_internal/protocol.py", "ps_task"), ("_internal/protocol.py", "store"),
    ("_internal/driver/members.py", "reserved"), ("_internal/driver/members.py", "given_rank"),
    ("_internal/driver/members.py", "watch_of"),
}
BUILTIN_ERRORS = {"ValueError", "TypeError", "RuntimeError", "KeyError", "NotImplementedError", "AssertionError",
                  "Exception", "OSError", "IndexError"}


def test_errors_a_user_acts_on_are_raytf_errors():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        enclosing = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    enclosing.setdefault(id(inner), node.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and node.exc is not None:
                made = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if getattr(made, "id", None) in BUILTIN_ERRORS:
                    found.add((path.relative_to(PACKAGE).as_posix(), enclosing.get(id(node), "(module)")))
    assert found - INTERNAL_RAISES == set(), "raise a raytf error (raytf/errors.py) that names the setting and the fix"


def run_tool(*args: str) -> None:
    """``python -m <args>`` from the repository's root; its complaints, if any, fail the test."""
    import subprocess
    import sys

    checked = subprocess.run([sys.executable, "-m", *args], cwd=PACKAGE.parent, capture_output=True, text=True,
                             timeout=300)
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]


def test_ruff_finds_nothing_in_the_repository():
    """The lint pyproject.toml configures ([tool.ruff]): pyflakes, pycodestyle's errors and bugbear
    over raytf/, tests/, bench/, jobs/ and docs/, the rules that find bugs rather than taste."""
    run_tool("ruff", "check", "--no-cache", "--output-format", "concise", ".")


def test_raytf_is_formatted_by_ruff_format():
    run_tool("ruff", "format", "--check", "--no-cache", "raytf")  # mend with: ruff format raytf


def test_mypy_finds_nothing_in_raytf():
    """The type check pyproject.toml configures ([tool.mypy]) over raytf/: calls, attributes and
    returns against their annotations (it found a renamed attribute a warning still used)."""
    run_tool("mypy", "--no-incremental")


def defined_names(tree) -> set:
    """The names a module binds at its top level: functions, classes, assignments, imports."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
            names |= defined_names(ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[]))
    return names


@pytest.mark.parametrize("script", sorted(p.name for p in (PACKAGE.parent / "bench").glob("*.py")))
def test_every_raytf_name_a_benchmark_imports_exists(script):
    """The benchmarks reach raytf's internals to time one stage at a time (bench/ingest.py, ...);
    a module or name moved by a refactor fails here, not an hour into `python -m bench cpu-full`."""
    missing = []
    for node in ast.walk(parse(PACKAGE.parent / "bench" / script)):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "raytf"):
            continue
        base = PACKAGE.parent.joinpath(*node.module.split("."))
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not module.exists():
            missing.append(node.module)
            continue
        names = defined_names(parse(module))
        missing += [f"{node.module}.{alias.name}" for alias in node.names
                    if alias.name not in names and not (base / f"{alias.name}.py").exists()
                    and not (base / alias.name).is_dir()]
    assert not missing, f"bench/{script} imports what raytf no longer has: {missing}"

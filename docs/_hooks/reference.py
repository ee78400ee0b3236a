"""Reference text read off raytf's code with ``ast`` (nothing imported from raytf but its CLI parser):
every error raytf raises with its message, the environment variables, the ``raytf`` command's help.

Each function returns Markdown for the docs' hooks (generate.py); ``tests/docs`` builds the site.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from dataclasses import dataclass
from typing import Iterator


@dataclass(frozen=True)
class Raised:
    """One place raytf makes an error: the class, the message as written, where."""

    error: str
    message: str
    module: str
    function: str
    line: int


def _error_classes(root: str) -> dict[str, str]:
    """raytf.errors' exception classes (every subclass of RaytfError there) -> their docstrings."""
    tree = ast.parse(open(os.path.join(root, "raytf", "errors.py")).read())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if node.name == "RaytfError" or bases & set(found):
                found[node.name] = " ".join((ast.get_docstring(node) or "").split())
    return found


def _text(node: ast.AST) -> str:
    """A message as its code writes it: literal text, and ``{expression}`` where a value goes."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " / " + _text(node.orelse)
    return "{" + ast.unparse(node) + "}"


def _modules(root: str) -> Iterator[tuple[str, ast.Module]]:
    package = os.path.join(root, "raytf")
    for directory, _, names in sorted(os.walk(package)):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                yield os.path.relpath(path, root), ast.parse(open(path).read())


def _made_by(expression: ast.AST, scope: ast.AST, makers: dict, depth: int = 0, before: int = 1 << 30) -> list[str]:
    """The messages an expression can hold, where it is a name set from a call of one of raytf's
    functions that return a message (``problem = too_few_rows(...)``): each string those return,
    following calls, ``or`` and tuples. [] where it is none of these."""
    if depth > 8:
        return []
    if isinstance(expression, (ast.Constant, ast.JoinedStr, ast.BinOp)):
        text = _text(expression)
        return [text] if isinstance(expression, (ast.JoinedStr, ast.BinOp)) or isinstance(expression.value, str) else []
    if isinstance(expression, ast.BoolOp):
        return [m for value in expression.values for m in _made_by(value, scope, makers, depth + 1)]
    if isinstance(expression, ast.Tuple) and expression.elts:
        return _made_by(expression.elts[0], scope, makers, depth + 1)
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute) and \
            expression.func.attr == "join" and isinstance(expression.func.value, ast.Constant) and \
            len(expression.args) == 1 and isinstance(expression.args[0], ast.Name):  # sep.join(lines): every line
        lines = expression.args[0].id
        parts = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == lines and \
                    isinstance(node.value, ast.List):
                parts += [(e.lineno, _text(e)) for e in node.value.elts]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append" \
                    and getattr(node.func.value, "id", None) == lines and node.args:
                parts.append((node.lineno, _text(node.args[0])))
        return [expression.func.value.value.join(text for _, text in sorted(parts))] if parts else []
    if isinstance(expression, ast.Call):
        func = expression.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        maker = makers.get(name)
        if maker is None:
            return []
        return [m for node in ast.walk(maker) if isinstance(node, ast.Return) and node.value is not None
                for m in _made_by(node.value, maker, makers, depth + 1)]
    if isinstance(expression, ast.Name):  # its value at the last assignment before ``before``
        last = None
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and node.lineno < before:
                target = node.targets[0]
                named = target.id if isinstance(target, ast.Name) else (
                    getattr(target.elts[0], "id", None) if isinstance(target, ast.Tuple) and target.elts else None)
                if named == expression.id and (last is None or node.lineno > last.lineno):
                    last = node
        return _made_by(last.value, scope, makers, depth + 1) if last is not None else []
    return []


def raised(root: str) -> Iterator[Raised]:
    """Every construction of one of raytf's error classes in the package, in file order; a message
    made by another function of raytf's (a preflight check's) is listed by each text it can take."""
    classes = set(_error_classes(root))
    modules = list(_modules(root))
    makers = {node.name: node for _, tree in modules for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name != "__init__"}
    own_str = {}  # error classes that word their message in __str__ (TrainingFailedError): its text
    for node in ast.parse(open(os.path.join(root, "raytf", "errors.py")).read()).body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for method in node.body:
                if isinstance(method, ast.FunctionDef) and method.name == "__str__":
                    own_str[node.name] = [m.replace("\n", " / ") for r in ast.walk(method)
                                          if isinstance(r, ast.Return) and r.value is not None
                                          for m in _made_by(r.value, method, makers)]
    for module, tree in modules:
        functions: dict = {}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    functions.setdefault(id(inner), node)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if called not in classes:
                continue
            scope = functions.get(id(node))
            where = scope.name if scope is not None else "(module)"
            made = _made_by(node.args[0], scope, makers, before=node.lineno) \
                if isinstance(node.args[0], ast.Name) and scope else []
            if not made and isinstance(node.args[0], ast.Name) and called in own_str:  # a class that words its message
                made = own_str[called]
            for message in dict.fromkeys(made) or [_text(node.args[0])]:
                yield Raised(called, message, module, where, node.lineno)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def errors_markdown(root: str, error: str) -> str:
    """Each place raytf raises ``error`` (a class of raytf.errors), with its message as written."""
    if error not in _error_classes(root):
        raise ValueError(f"docs: {error!r} is not an error class in raytf/errors.py")
    sites = [site for site in raised(root) if site.error == error]
    if not sites:
        return "(raised with a worker's failure, or through its subclasses)\n"
    out = ["| raised in | message (`{...}`: filled in with the value) |", "| --- | --- |"]
    out += [f"| `{s.module}` `{s.function}` | `{_cell(s.message)}` |" for s in sites]
    return "\n".join(out) + "\n"


def error_classes(root: str) -> list[str]:
    """raytf's error classes, in raytf/errors.py's order."""
    return list(_error_classes(root))


def environment_markdown(root: str) -> str:
    """The variables of raytf/_internal/env.py, by the section comment above them, with defaults."""
    source = open(os.path.join(root, "raytf", "_internal", "env.py")).read()
    tree = ast.parse(source)
    lines = source.splitlines()
    names = {}
    defaults = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("DEFAULT"):
                comment = lines[node.lineno - 1].partition("#")[2].strip()
                names[target.id] = (node.value.value, comment, node.lineno)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Name) and isinstance(value, ast.Constant):
                    defaults[key.id] = value.value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                getattr(node.targets[0], "id", "") == "DEFAULT_STORAGE_PATH":
            defaults["STORAGE_PATH"] = node.value.value
    sections, current = [], None
    for number, line in enumerate(lines, start=1):
        if line.startswith("# ") and line.rstrip().endswith("."):
            current = (line[2:].strip(), [])
            sections.append(current)
        for name, (value, comment, at) in names.items():
            if at == number and current is not None:
                current[1].append((value, defaults.get(name), comment))
    out = []
    for title, rows in sections:
        if not rows:
            continue
        out += [f"**{title}**", "", "| variable | default | what |", "| --- | --- | --- |"]
        out += [f"| `{value}` | {'' if default is None else f'`{default}`'} | {_cell(comment)} |"
                for value, default, comment in rows]
        out.append("")
    return "\n".join(out)


def cli_markdown(root: str) -> str:
    """``raytf --help`` and each command's ``--help``, as the parser prints them."""
    import sys

    sys.path.insert(0, root)
    from raytf.cli import _parser

    parser = _parser()
    out = ["```text", "$ raytf --help", parser.format_help().rstrip(), "```", ""]
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subcommands here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                out += [f"### `raytf {name}`", "", "```text", f"$ raytf {name} --help",
                        sub.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def hooks_markdown(root: str) -> str:
    """Every hook into a library's private code and every process-wide patch, as tables: read off
    raytf._internal.hooks (plain data: importing it imports no library)."""
    sys.path.insert(0, root)
    from raytf._internal import hooks

    def cell(text: str) -> str:
        return " ".join(text.split()).replace("|", "\\|")

    rows = ["| Hook | Reaches | What needs it | Without it | Checked |", "|---|---|---|---|---|"]
    for hook in hooks.all_hooks():
        checked = "probe at worker start" + (", behaviour in a process of its own" if hook.behaves else "")
        without = ("optional: " if hook.optional else "turn off: ") + hook.turn_off
        rows.append(f"| `{hook.name}` | {cell(hook.reaches)} | {cell(hook.serves)} | {cell(without)} | {checked} |")
    patches = ["| Patch | Replaces | When | What it does |", "|---|---|---|---|"]
    for patch in hooks.PATCHES:
        patches.append(f"| `{patch.name}` | {cell(patch.replaces)} | {cell(patch.when)} | {cell(patch.does)} |")
    return "\n".join(rows) + "\n\n### Process-wide patches\n\n" + "\n".join(patches) + "\n"


SUITE_RECORD = os.path.join("tests", "records", "suite.jsonl")
# Whole runs held to fewer CPUs than their machine has (tests/slowed.py), kept apart.
SLOWED_RECORD = os.path.join("tests", "records", "suite_slowed.jsonl")


def _records(root: str, record: str) -> list[dict]:
    import json

    path = os.path.join(root, record)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _whole(run: dict) -> bool:
    return not {"-m", "-k"} & set(run["args"])


def whole_runs(root: str) -> list[dict]:
    """Every kept run (``--suite-record``, tests/conftest.py) of the whole suite that passed on its
    machine's full cores, oldest first: no ``-m`` or ``-k`` choosing part of it, no CPU quota."""
    return [r for r in _records(root, SUITE_RECORD)
            if r["exit_status"] == 0 and _whole(r) and not r["machine"].get("cpu_quota")]


def slowed_runs_markdown(root: str) -> str:
    """Every kept run of the whole suite held to fewer CPUs (tests/slowed.py), newest first: when,
    the commit, the CPUs it was held to, its outcomes, its minutes and its CPU-minutes."""
    runs = [r for r in _records(root, SLOWED_RECORD) if _whole(r)][::-1]
    if not runs:
        return f"No run of the whole suite held to fewer CPUs is recorded in `{SLOWED_RECORD}` yet.\n"
    lines = ["| When (UTC) | Commit | CPUs, held to | Outcomes | Minutes | CPU-minutes |",
             "|---|---|---|---|---:|---:|"]
    for run in runs:
        machine, busy = run["machine"], run.get("machine_cpu_s")
        outcomes = ", ".join(f"{n:,} {outcome}" for outcome, n in sorted(run["outcomes"].items()))
        lines.append(f"| {run['when'][:16].replace('T', ' ')} | `{run['commit']}` | "
                     f"{machine['cpus']}, {machine.get('cpu_quota', '?')} | {outcomes} | {run['wall_s'] / 60:.1f} | "
                     f"{f'{busy / 60:.1f}' if busy else ''} |")
    return "\n".join(lines) + "\n"


def newest_whole_run(root: str) -> dict | None:
    """The newest of :func:`whole_runs`, or None."""
    whole = whole_runs(root)
    return whole[-1] if whole else None


def suite_runs_markdown(root: str) -> str:
    """Every kept passing run of the whole suite, newest first: when, the commit, how many tests,
    its minutes, the CPU-minutes the machine's cores were busy, and the CPU-seconds of a worker's
    ``import tensorflow`` on the machine before and after the tests (where recorded: the machine's
    own speed that hour, tests/conftest.py's reference) and how many pytest processes ran it."""
    runs = whole_runs(root)[::-1]
    if not runs:
        return f"No passing run of the whole suite is recorded in `{SUITE_RECORD}` yet.\n"
    lines = ["| When (UTC) | Commit | Tests | pytest processes | Minutes | CPU-minutes "
             "| TensorFlow's import (CPU-s, before / after) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for run in runs:
        busy = run.get("machine_cpu_s")
        # The processes that ran its tests (``ran_at``: pytest-xdist's gw0, gw1, ... or one "main"),
        # where recorded; every run before that record ran in two.
        processes = len({process for process, _start, _end in run["ran_at"].values()}) if run.get("ran_at") else 2
        reference = run.get("reference") or {}
        imports = [reference.get(when, {}).get("import_tensorflow") for when in ("before", "after")]
        shown = " / ".join(f"{v:.2f}" if v is not None else "?" for v in imports) if any(imports) else ""
        lines.append(f"| {run['when'][:16].replace('T', ' ')} | `{run['commit']}` | {sum(run['outcomes'].values())} | "
                     f"{processes} | {run['wall_s'] / 60:.1f} | {f'{busy / 60:.1f}' if busy else ''} | {shown} |")
    return "\n".join(lines) + "\n"


def slowest_markdown(root: str) -> str:
    """The whole suite's newest kept run: its time, its machine, its ten costliest tests by CPU
    (where the record has them) and its ten slowest, with their seconds (setup, call and teardown)."""
    run = newest_whole_run(root)
    if run is None:
        return f"No passing run of the whole suite is recorded in `{SUITE_RECORD}` yet.\n"
    machine, versions = run["machine"], run["versions"]
    tests = sum(run["outcomes"].values())
    lines = [
        f"The newest kept run of the whole suite (`{SUITE_RECORD}`, {run['when'][:10]}, commit `{run['commit']}`): "
        f"{tests} tests in {run['wall_s'] / 60:.1f} minutes on {machine['cpus']} CPUs"
        + (f" ({machine['cpu_model']})" if machine.get("cpu_model") else "") + " and "
        f"{machine['memory_gib']} GiB, Python {machine['python']}, TensorFlow {versions['tensorflow']}, "
        f"Keras {versions['keras']}, Ray {versions['ray']}.",
    ]
    cpu = run.get("tests_cpu_s")
    if cpu:  # recorded since the suite counts CPU (tests/cpu.py)
        busy = run.get("machine_cpu_s")
        if busy:
            lines[-1] += (f" The machine's cores were busy for {busy / 60:.1f} CPU-minutes of it "
                          f"({busy / run['wall_s'] / machine['cpus']:.0%} of all they had).")
        host = run.get("host")  # recorded since the suite reads the host's counters (tests/conftest.py)
        if host:
            lines[-1] += (f" Its host took {host['steal_s']:.0f} CPU-seconds of steal meanwhile, and "
                          f"{host['refaulted_file_mib']:,.0f} MiB of evicted files were read back from disk.")
        starts = run.get("worker_starts")  # recorded since the suite counts them (tests/conftest.py)
        lines[-1] += (" Its ten costliest tests by CPU, their Ray processes' included (setup, call and teardown; a "
                      "file's shared runs count to the test that first asks for them), with their seconds"
                      + (" and the TrainWorker processes they started:" if starts is not None else ":"))
        if starts is not None:
            lines += ["", "| CPU-seconds | Seconds | Workers started | Test |", "|---:|---:|---:|---|"]
        else:
            lines += ["", "| CPU-seconds | Seconds | Test |", "|---:|---:|---|"]
        for nodeid, used in list(cpu.items())[:10]:
            started = f" {starts.get(nodeid, 0)} |" if starts is not None else ""
            lines.append(f"| {used:.0f} | {run['tests_s'].get(nodeid, 0):.0f} |{started} `{nodeid.split('@')[0]}` |")
        lines += ["", f"Together the integration and end-to-end tests used {sum(cpu.values()) / 60:.1f} CPU-minutes."]
        if starts:
            integration = sum(v for k, v in cpu.items() if "/integration/" in k)
            lines[-1] += (f" The integration tests started {sum(starts.values())} TrainWorker processes (standbys "
                          f"included) and used {integration / 60:.1f} CPU-minutes: "
                          f"{integration / sum(starts.values()):.1f} CPU-seconds a worker process, all they do "
                          "included.")
        kinds = run.get("cpu_by_kind")  # recorded since the suite tells its processes apart (tests/cpu.py)
        if kinds:
            lines += ["", "Where the run's CPU went, by kind of process: the pytest processes', their Ray clusters' "
                      "and end-to-end heads' and the subprocesses they started (tests/cpu.py's `kind_of`; the "
                      "CPU-seconds each process had used when last seen):", "",
                      "| Kind of process | CPU-seconds | Share |", "|---|---:|---:|"]
            whole = sum(kinds.values())
            lines += [f"| {kind} | {cpu_s:.0f} | {cpu_s / whole:.0%} |" for kind, cpu_s in kinds.items()]
        ran_at = run.get("ran_at")  # recorded since the suite records when each test ran (tests/conftest.py)
        if ran_at:
            lines += ["", schedule_sentence(ran_at, run["wall_s"])]
        lines += ["", "Its ten slowest tests:"]
    else:
        lines[-1] += " Its ten slowest tests (setup, call and teardown):"
    lines += ["", "| Seconds | Test |", "|---:|---|"]
    for nodeid, took in list(run["tests_s"].items())[:10]:
        lines.append(f"| {took:.0f} | `{nodeid.split('@')[0]}` |")
    return "\n".join(lines) + "\n"


def schedule_sentence(ran_at: dict, wall_s: float) -> str:
    """How the run's pytest processes shared it: for each, the test files it ran and when its last
    test ended, against the run's whole time (a process that ends long before the other sat idle)."""
    ends: dict[str, float] = {}
    files: dict[str, set] = {}
    for nodeid, (process, _start, end) in ran_at.items():
        ends[process] = max(ends.get(process, 0.0), end)
        files.setdefault(process, set()).add(nodeid.split("::")[0])
    parts = [f"{process} ran {len(files[process])} test file{'s' if len(files[process]) != 1 else ''}, its last test "
             f"ending at {ends[process]:.0f} s"
             for process in sorted(ends)]
    return f"How its pytest processes shared the {wall_s:.0f} s: " + "; ".join(parts) + "."


SUPPORTED = (("Python", "python"), ("TensorFlow", "tensorflow"), ("Keras", "keras"), ("tf-keras", "tf-keras"),
             ("Ray", "ray"), ("pyarrow", "pyarrow"), ("numpy", "numpy"))


def support_markdown(root: str) -> str:
    """The versions raytf supports, read off what CI runs: the bounds in pyproject.toml, the oldest
    combination noxfile.py pins (``nox -s oldest``), and the newest the whole suite's newest kept
    record ran on (the README's test command installs the newest the bounds allow)."""
    import re
    import tomllib

    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    allowed = {"python": project["requires-python"]}
    for requirement in project["dependencies"]:
        name, bounds = re.match(r"([\w-]+)(?:\[[\w,]+\])?\s*(.*)", requirement).groups()
        allowed[name] = bounds
    tree = ast.parse(open(os.path.join(root, "noxfile.py")).read())
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
    oldest = {"python": ast.literal_eval(values["PYTHON"])}
    for pin in ast.literal_eval(values["OLDEST"]):
        exact = re.match(r"([\w-]+)(?:\[[\w,]+\])?==(.+)", pin)  # (pandas<3 is a bound, not a pin)
        if exact:
            oldest[exact.group(1)] = exact.group(2)
    run = newest_whole_run(root)
    if run is None:
        raise ValueError(f"the support table needs a passing run of the whole suite in {SUITE_RECORD}")
    newest = {"python": run["machine"]["python"], **run["versions"]}
    lines = [
        f"| | Allowed (`pyproject.toml`) | Oldest, run by CI (`noxfile.py`) | Newest, run by CI ({run['when'][:10]}, "
        f"commit `{run['commit']}`) |", "|---|---|---|---|",
    ]
    for label, key in SUPPORTED:
        lines.append(f"| {label} | `{allowed.get(key, '')}` | {oldest.get(key, '')} | "
                     f"{newest.get(key) or 'not recorded'} |")
    return "\n".join(lines) + "\n"

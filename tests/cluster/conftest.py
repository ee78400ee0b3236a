"""Helpers for checking cluster/ offline: the jobs' flags, and which node types can hold a worker."""

from __future__ import annotations

import importlib
import os
import shlex
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER = os.path.join(REPO, "cluster")
JOBS = os.path.join(REPO, "jobs")
IMAGE_ROOT = "/home/ray/raytf"  # where file_mounts and the Dockerfile put this repository


def job_module(script: str):
    """The module of ``jobs/<script>`` (its build_parser gives the flags it takes)."""
    if JOBS not in sys.path:
        sys.path.insert(0, JOBS)
    return importlib.import_module(os.path.splitext(os.path.basename(script))[0])


def job_scripts() -> list[str]:
    return sorted(f for f in os.listdir(JOBS) if f.startswith("train_") and f.endswith(".py"))


def submitted_jobs(text: str) -> list[tuple[str, list[str]]]:
    """(script, arguments) of every `... python <script> ARGS` command in ``text`` (comments too)."""
    found = []
    joined = text.replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.lstrip("# ").strip()
        if "python " not in line or ".py" not in line:
            continue
        try:
            words = shlex.split(line[line.index("python "):])
        except ValueError:
            continue  # prose that mentions python, not a command
        if len(words) < 2:
            continue
        script = words[1]
        if script.endswith(".py"):
            found.append((script, words[2:]))
    return found


def repo_path(path: str, working_dir: str = "") -> str:
    """A path as a command on a node names it, mapped back into this repository."""
    if path.startswith(IMAGE_ROOT):
        return os.path.join(REPO, path[len(IMAGE_ROOT):].lstrip("/"))
    if working_dir:
        return os.path.join(repo_path(working_dir), path)
    return os.path.join(REPO, path)


def fits(bundle: dict[str, float], resources: dict[str, float]) -> int:
    """How many workers of ``bundle`` one node of ``resources`` holds."""
    counts = [resources.get(k, 0) // v for k, v in bundle.items() if v > 0]
    return int(min(counts)) if counts else 0


@pytest.fixture
def scaling_of():
    import raytf

    def make(script: str, args: list[str]) -> raytf.ScalingConfig:
        parsed = job_module(script).build_parser().parse_args(args)
        return raytf.ScalingConfig(num_workers=parsed.num_workers, cpus_per_worker=parsed.cpus_per_worker,
                                   gpus_per_worker=parsed.gpus_per_worker)

    return make

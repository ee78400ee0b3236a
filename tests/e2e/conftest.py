"""The end-to-end heads run raytf as a cluster runs it: installed from its wheel, not from this
checkout.

``wheel_python`` builds raytf's wheel and sdist (``python -m build``, from the checkout's files),
checks both with ``twine check`` (what PyPI checks on upload), and installs the wheel, without
its dependencies, into a virtualenv over this environment's packages (TensorFlow, Ray and the rest,
as a cluster image would have them). Both heads (test_job_submit.py, test_autoscaler.py) start
from that virtualenv's Python, so every job they run (the README's quick start among them)
imports raytf from the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(*command: str, cwd: str) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="session")
def wheel_python(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wheel")
    source, dist, venv = root / "source", root / "dist", root / "venv"
    # The files a clone has (tracked, or new and not ignored): no build/ or egg-info of the checkout's.
    listed = run("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=REPO).splitlines()
    for name in listed:
        if os.path.isfile(os.path.join(REPO, name)):
            os.makedirs(source / os.path.dirname(name), exist_ok=True)
            shutil.copy2(os.path.join(REPO, name), source / name)
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), ".", cwd=str(source))
    built = sorted(p.name for p in dist.iterdir())  # the wheel, then the sdist
    assert len(built) == 2 and built[0].endswith("-py3-none-any.whl") and built[1].endswith(".tar.gz"), built
    checked = run(sys.executable, "-m", "twine", "check", "--strict", *(str(dist / b) for b in built), cwd=str(root))
    assert checked.count("PASSED") == 2, checked
    # No pip of its own (ensurepip is seconds of CPU): this environment's pip installs into it.
    run(sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv), cwd=str(root))
    python = str(venv / "bin" / "python")
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet",
        str(dist / built[0]), cwd=str(root))
    # From any directory but the checkout, that Python's raytf is the wheel's (site-packages comes
    # before the editable install's finder), and the wheel's console script runs.
    found = run(python, "-c", "import raytf; print(raytf.__file__)", cwd=str(root)).strip()
    assert found.startswith(str(venv)), found
    assert run(str(venv / "bin" / "raytf"), "--version", cwd=str(root)).startswith("raytf ")
    return python


def activated(env: dict, python: str) -> dict:
    """``env`` with the virtualenv of ``python`` first on PATH, as its ``activate`` does: a job's
    entrypoint (``python train.py``) and a launched script's ``python`` are then its Python."""
    return {**env, "PATH": os.pathsep.join([os.path.dirname(python), env.get("PATH", "")]),
            "VIRTUAL_ENV": os.path.dirname(os.path.dirname(python))}

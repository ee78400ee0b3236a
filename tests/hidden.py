"""Packages that the test extras or this machine's image install and that no Ray process of the
suite uses, hidden from the clusters the tests start.

TensorFlow's import loads each of them where installed: Keras's scikit-learn wrapper, its image
gallery's matplotlib, its notebook check's IPython (which Ray Data's import loads too, for its
pretty printer), and SciPy, which only scikit-learn needs here, through TensorFlow's own legacy
Keras. Together they are a third of a worker's ``import tensorflow`` on this machine, paid by each
of the suite's 250 or so worker processes. A user's cluster without them starts its workers as
these do.
"""

from __future__ import annotations

import os
import pathlib

TEST_ONLY = ("sklearn", "matplotlib", "mpl_toolkits", "IPython", "scipy")


def hiding(directory: pathlib.Path, env: dict, names: tuple[str, ...] = TEST_ONLY) -> dict:
    """``env`` with a PYTHONPATH under which ``names`` cannot be imported (each raises ImportError,
    as a package that is not installed does): for the processes a cluster started with it runs."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).mkdir(exist_ok=True)
        (directory / name / "__init__.py").write_text(
            f'raise ImportError("{name} is hidden from the test cluster (tests/hidden.py)")\n')
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), env.get("PYTHONPATH")]))}

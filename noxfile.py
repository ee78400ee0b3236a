"""raytf's version matrix: the oldest and the newest TensorFlow, Keras and Ray that pyproject.toml allows.

    pip install nox
    nox -s oldest      # the oldest supported versions: the fast and integration tiers
    nox -s newest      # the newest: the whole suite, the slow tier included (what .ci/run runs)

raytf reaches into private TensorFlow, Keras and Ray code (raytf/_internal/hooks/); each hook is
checked when a worker starts and has a test. The ``oldest`` session is what keeps the lower
bounds in pyproject.toml honest: raise a bound there and here together, and only once this passes.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["oldest", "newest"]
nox.options.reuse_existing_virtualenvs = True

# The lower bounds of pyproject.toml's dependencies, pinned (raytf/_version.py names them too).
OLDEST = [
    "tensorflow==2.16.2",
    "tf-keras==2.16.0",
    "keras==3.10.0",  # the first Keras whose metrics sum over workers under a tf.distribute strategy
    "ray[default,data]==2.50.1",
    "numpy==1.26.4",  # numpy 2 needs TensorFlow 2.18
    "pyarrow==14.0.2",
    "pandas<3",  # Ray 2.50's Ray Data names pandas.errors.SettingWithCopyWarning, gone in pandas 3
]


@nox.session(python="3.11")
def oldest(session: nox.Session) -> None:
    """The oldest versions raytf allows: every test but the slow end-to-end tier (the newest runs it)."""
    session.install(*OLDEST)
    session.install("-e", ".[test]", *OLDEST)
    session.run("python", "-m", "pytest", "-m", "not gpu and not e2e", *session.posargs)


@nox.session(python="3.11")
def newest(session: nox.Session) -> None:
    """The newest versions the index has: the whole suite, as CI runs it."""
    session.install("-e", ".[test]", "--upgrade")
    session.run("python", "-m", "pytest", *session.posargs)

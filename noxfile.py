"""raytf's version matrix: the oldest and the newest TensorFlow, Keras and Ray that pyproject.toml allows.

    pip install nox
    nox -s oldest      # the oldest supported versions: the unit, docs and integration tiers
    nox -s newest      # the newest: the whole suite, the slow tier included
    nox -s next        # the newest pre-releases: which of raytf's hooks they break (never fails)

CI (.ci/run) runs the README's test command (the whole suite on the newest versions), then
``oldest``. raytf reaches into private TensorFlow, Keras and Ray code
(raytf/_internal/hooks/); each hook is checked when a worker starts and has a test. The
``oldest`` session is what keeps the lower bounds in pyproject.toml honest: raise a bound there
and here together, and only once this passes; ``next`` says what the next releases will break
before they are out.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["oldest", "newest"]
PYTHON = "3.11"  # pyproject.toml's requires-python: the one raytf's CI runs
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


@nox.session(python=PYTHON)
def oldest(session: nox.Session) -> None:
    """The oldest versions raytf allows: every test but the slow end-to-end tier (the newest runs it)."""
    session.install(*OLDEST)
    session.install("-e", ".[test]", *OLDEST)
    session.run("python", "-m", "pytest", "-m", "not gpu and not e2e", *session.posargs)


@nox.session(python=PYTHON)
def newest(session: nox.Session) -> None:
    """The newest versions the index has: the whole suite, as CI runs it."""
    session.install("-e", ".[test]", "--upgrade")
    session.run("python", "-m", "pytest", *session.posargs)


# The newest pre-releases, past pyproject.toml's upper bounds: TensorFlow's release candidate,
# Keras's nightly (or its newest pre-release where the index has no nightly), tf-keras's and Ray's.
# The hooks' report names the versions it checked.
NEXT = ["tensorflow", "ray[default,data]"]
KERAS_NEXT = ("keras-nightly", "keras")


@nox.session(python=PYTHON, default=False)
def next(session: nox.Session) -> None:  # noqa: A001 - the session's name
    """The newest pre-releases: every hook checked for real (``python -m raytf._internal.hooks``),
    and the unit tier. It reports what broke and never fails: CI does not wait on releases that
    raytf does not support yet."""
    session.install("--pre", "--upgrade", *NEXT)
    # tf-keras pins the TensorFlow minor it was released with, which would hold TensorFlow back
    # from its release candidate: its newest, beside whatever TensorFlow is newest.
    session.install("--pre", "--upgrade", "--no-deps", "tf-keras")
    for keras in KERAS_NEXT:
        try:
            session.install("--pre", "--upgrade", keras, silent=True)
            break
        except nox.command.CommandFailed:
            session.log(f"{keras}: not on this index")
    # raytf itself without its bounds (they exclude what is being tried), its test tools with them.
    session.install("--no-deps", "-e", ".")
    session.install("pytest", "pytest-timeout", "pytest-rerunfailures", "pytest-xdist", "moto[server]", "scikit-learn")
    session.run("python", "-m", "raytf._internal.hooks", success_codes=[0, 1])
    session.run("python", "-m", "pytest", "-m", "unit", "-q", "-p", "no:cacheprovider", *session.posargs,
                success_codes=[0, 1])

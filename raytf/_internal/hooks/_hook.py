"""One hook into a library's private code, and how its failure reads (see the package docstring)."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from raytf.errors import HookError

from raytf._version import NEWEST, OLDEST

# The versions raytf's tests run against (pyproject.toml allows this range).
TESTED = ", ".join(
    f"{name} {OLDEST[key]} to {NEWEST[key]}"
    for key, name in (("tensorflow", "TensorFlow"), ("keras", "Keras"), ("tf_keras", "tf-keras"), ("ray", "Ray"))
)


@dataclass(frozen=True)
class Hook:
    """One reach into a library's private code: where it reaches, what it serves, how to do without."""

    name: str
    library: str  # the distribution's module: "tensorflow", "keras", "tf_keras", "ray"
    reaches: str  # the private name
    serves: str  # the raytf feature that stands on it
    turn_off: str  # what the user sets to do without that feature
    # Raises when the hook cannot work with the installed library. Cheap, and runs no TensorFlow op:
    # a worker checks it before its strategy configures TensorFlow's collectives.
    probe: Callable[[], object]  # what it returns is not used
    # Raises when the hook, really used, does not do what raytf needs: may run TensorFlow ops, so it
    # runs in a process of its own (``python -m raytf._internal.hooks``, and the tests); None where
    # only a cluster of workers can show it (the tests that train through it do).
    behaves: Optional[Callable[[], None]] = None
    needs_ray: bool = False  # ``behaves`` asks a connected Ray
    in_processes: bool = False  # ``behaves`` runs TensorFlow in processes of its own (seconds, mostly waiting)
    optional: bool = False  # a run goes on without it, warned once of what it loses

    def check(self) -> None:
        self._run(self.probe)

    def check_behaviour(self) -> None:
        if self.behaves is not None:
            self._run(self.behaves)

    def _run(self, check: Callable[[], object]) -> None:
        try:
            check()
        except Exception as error:  # noqa: BLE001 - any way it fails is the same news to the user
            raise self.error(error) from None

    def error(self, cause: BaseException) -> HookError:
        return HookError(
            f"raytf's {self.serves} needs {self.reaches} from {self.library} {version(self.library)}, "
            f"and it does not work ({type(cause).__name__}: {cause}) [hook {self.name}]. raytf is tested "
            f"with {TESTED}: install those, "
            + (f"or go without it ({self.turn_off})" if self.optional else f"or turn off {self.turn_off}")
        )

    def call(self, reach: Callable[..., object], *args: object) -> object:
        """``reach(*args)`` (one of this hook's functions), any failure of it a HookError naming the hook."""
        try:
            return reach(*args)
        except Exception as error:  # noqa: BLE001 - as in _run
            raise self.error(error) from None

    def call_or_warn(self, reach: Callable[..., object], *args: object) -> object:
        """``reach(*args)`` through this optional hook, or None once the run was warned (once) that
        the hook does not work and what it goes without."""
        try:
            return self.call(reach, *args)
        except HookError as error:
            warn_once(self, error)
            return None


@dataclass(frozen=True)
class Patch:
    """A process-wide change raytf makes to a library's code in a worker: what it replaces, when."""

    name: str
    replaces: str
    when: str  # what makes a worker install it
    does: str


_warned: set[str] = set()


def warn_once(hook: Hook, error: HookError) -> None:
    """Say once a process that an optional hook failed, and what the run goes without."""
    if hook.name in _warned:
        return
    _warned.add(hook.name)
    logging.getLogger("raytf").warning("%s. This run goes on without it.", error)


def version(library: str) -> str:
    try:
        return importlib.import_module(library).__version__
    except Exception:  # noqa: BLE001 - not installed, or no version attribute
        return "(version unknown)"


def once_a_process(check: Callable[[], None]) -> Callable[[], None]:
    """A behaviour check that runs at most once a process, for several hooks: its outcome, a
    failure included, is kept (a check that timed out is not waited for a second time)."""
    outcome: list[Optional[BaseException]] = []

    def checked() -> None:
        if not outcome:
            try:
                check()
                outcome.append(None)
            except Exception as error:  # noqa: BLE001 - kept, and raised to every caller
                outcome.append(error)
        if outcome[0] is not None:
            raise outcome[0]

    return checked


def run_check_script(script: str, *args: str, timeout_s: float = 90.0, tries: int = 2) -> str:
    """A behaviour check's script run in a new Python (and the processes it starts, in a session of
    their own): its output once it printed "ok". A run that outlasts ``timeout_s`` is stopped with
    SIGABRT first, so that faulthandler prints where each of its threads waited, then with its
    whole session killed, and tried again, ``tries`` runs in all: a check of clusters of processes
    on a loaded machine may meet a stall of its own making once. AssertionError with each run's
    output if none printed "ok".

    It runs in threads (``python -m raytf._internal.hooks`` runs the checks of clusters together),
    so it imports nothing: what it needs is imported with this module. A first import in a thread
    can deadlock against TensorFlow's load in another. TensorFlow up to 2.16 imports ``distutils``,
    and setuptools' shim for it (``distutils-precedence.pth``) then imports setuptools while holding
    Python's global import lock; setuptools imports ``subprocess``, and a thread that was importing
    ``subprocess`` itself waits for that lock with the module's own held (the oldest versions' CI
    run, 2026-12-05: both threads' stacks, found by the SIGABRT below in the integration test)."""
    said = []
    for _ in range(tries):
        process = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", script, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            try:
                out, err = process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            err = f"(stopped after {timeout_s:g} s)\n{err}"
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # its peers and servers, wherever it stopped
            except OSError:
                pass
        if out.strip().endswith("ok"):
            return out
        said.append((out + err)[-3000:])
    assert not said, "\n--- next run ---\n".join(said)  # a check's failure, as its other asserts are
    return ""

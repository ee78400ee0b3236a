"""One hook into a library's private code, and how its failure reads (see the package docstring)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from raytf.errors import HookError

from raytf._version import NEWEST, OLDEST

# The versions raytf's tests run against (pyproject.toml allows this range).
TESTED = ", ".join(f"{name} {OLDEST[key]} to {NEWEST[key]}" for key, name in (
    ("tensorflow", "TensorFlow"), ("keras", "Keras"), ("tf_keras", "tf-keras"), ("ray", "Ray")))


@dataclass(frozen=True)
class Hook:
    """One reach into a library's private code: where it reaches, what it serves, how to do without."""

    name: str
    library: str  # the distribution: "tensorflow", "keras", "tf_keras"
    reaches: str  # the private name
    serves: str  # the raytf feature that stands on it
    turn_off: str  # what the user sets to do without that feature
    probe: Callable[[], None]  # raises when the hook cannot work with the installed library

    def check(self) -> None:
        try:
            self.probe()
        except Exception as error:  # noqa: BLE001 - any way it fails is the same news to the user
            raise HookError(
                f"raytf's {self.serves} needs {self.reaches} from {self.library} {version(self.library)}, "
                f"and it is not there ({type(error).__name__}: {error}). raytf is tested with {TESTED}: "
                f"install those, or turn off {self.turn_off}"
            ) from None


def version(library: str) -> str:
    try:
        return importlib.import_module(library).__version__
    except Exception:  # noqa: BLE001 - not installed, or no version attribute
        return "(version unknown)"

"""How the driver starts a CPU worker through its node's fork server (raytf_forkserver.py, which
says why): Ray's ``py_executable`` runtime environment field names the server's client as the
worker's interpreter, and the run's start environment goes into the runtime environment, so that
the server imports TensorFlow under it."""

from __future__ import annotations

import logging
import os
import shlex
import sys
from typing import Any, Mapping, Optional

from raytf._internal.protocol import RunSpec
from raytf._internal.worker.tensorflow import start_environment
from raytf.errors import ConfigError

logger = logging.getLogger(__name__)

# The fields of a job's runtime environment that leave its workers' interpreter as it is. The
# others (pip, conda, uv, a container, nsight, py_executable itself) set the interpreter, which
# the client's command would replace: their workers spawn.
KEEPS_INTERPRETER = frozenset(
    {"working_dir", "py_modules", "env_vars", "excludes", "config", "worker_process_setup_hook"}
)


def start_options(run: RunSpec, job_runtime_env: Mapping[str, Any]) -> dict[str, Any]:
    """Ray's options that start a worker of ``run`` through its node's fork server; none where it
    spawns (TensorflowConfig.start_method). ``job_runtime_env``: the driver's job's."""
    method = run.tensorflow.start_method
    if method == "spawn":
        return {}
    why = why_it_spawns(job_runtime_env)
    if why is not None:
        if method == "forkserver":
            raise ConfigError(
                f"TensorflowConfig.start_method='forkserver', but {why}: use start_method='auto' (which then "
                "spawns) or 'spawn'"
            )
        logger.debug("raytf workers spawn: %s", why)
        return {}
    return {"runtime_env": {"py_executable": command(), "env_vars": start_environment(run)}}


def command() -> str:
    """The interpreter Ray runs a worker with: the fork server's client, in the driver's Python."""
    return f"{shlex.quote(sys.executable)} -m raytf_forkserver"


def why_it_spawns(job_runtime_env: Mapping[str, Any]) -> Optional[str]:
    """Why this driver's CPU workers cannot start through a fork server, or None."""
    if sys.platform != "linux" or not hasattr(os, "pidfd_open"):
        return f"the driver runs on {sys.platform} without os.pidfd_open (the fork server needs Linux 5.3)"
    own = sorted(key for key in job_runtime_env if key not in KEEPS_INTERPRETER and not key.startswith("_"))
    if own:
        return f"the job's runtime environment sets its workers' interpreter ({', '.join(own)})"
    return None

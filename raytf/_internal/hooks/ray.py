"""raytf's reaches into Ray's private code (see the package docstring).

Each serves a signal Ray has no public API for. None is needed to train: where one is missing
its reader raises :class:`~raytf.errors.HookError`, and the driver warns once, naming what the
run goes without (``optional``), instead of reading it as "nothing to see".
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

from raytf._internal.hooks._hook import Hook

# ray._private.ray_constants.DEBUG_AUTOSCALING_STATUS: where the autoscaler publishes what
# ``ray status`` shows.
_AUTOSCALER_STATUS_KEY = "__autoscaling_status"


def _state() -> Any:
    from ray._private.state import state

    return state


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch, 0 for none) of every node Ray is draining
    (``ray drain-node``, autoscaler v2, KubeRay, a spot instance's notice)."""
    return dict(_state().get_draining_nodes())


def cluster_config() -> Any:
    """The cluster config an autoscaler reported to GCS (its ``node_group_configs``: name,
    resources, max_count), or None where none reported one."""
    return _state().get_cluster_config()


def autoscaler_status() -> Optional[bytes]:
    """The autoscaler's report for ``ray status`` (JSON), or None without an autoscaler."""
    from ray.experimental.internal_kv import _internal_kv_get

    return _internal_kv_get(_AUTOSCALER_STATUS_KEY)


def log_prefix_actor_name() -> str:
    """The line that makes Ray's log prefix of an actor's output ``(<name> pid=...)``."""
    from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME

    return LOG_PREFIX_ACTOR_NAME


def train_datasets_to_split(config: Any) -> Any:
    """What Ray Train's ``DataConfig(datasets_to_split=...)`` was given (it keeps no public field)."""
    return config._datasets_to_split  # noqa: SLF001


def _probe_state() -> None:
    from ray._private.state import GlobalState

    for name in ("get_draining_nodes", "get_cluster_config"):
        method = getattr(GlobalState, name, None)
        assert callable(method), f"ray._private.state.GlobalState.{name}"
        assert list(inspect.signature(method).parameters) == ["self"], f"GlobalState.{name}() takes arguments"


def _probe_status() -> None:
    from ray.experimental.internal_kv import _internal_kv_get

    assert "namespace" in inspect.signature(_internal_kv_get).parameters, "_internal_kv_get(key, namespace=...)"


def _probe_prefix() -> None:
    assert isinstance(log_prefix_actor_name(), str)


def _probe_data_config() -> None:
    from ray.train import DataConfig

    assert train_datasets_to_split(DataConfig(datasets_to_split=["a"])) == ["a"], "DataConfig._datasets_to_split"


def _behaves_state() -> None:
    # Needs a connected Ray: asks GCS for real.
    drains = draining_nodes()
    assert isinstance(drains, dict) and all(isinstance(v, int) for v in drains.values()), drains
    config = cluster_config()
    assert config is None or hasattr(config, "node_group_configs"), type(config)


def _behaves_status() -> None:
    status = autoscaler_status()
    assert status is None or isinstance(status, bytes), type(status)


HOOKS = [
    Hook(
        "ray.draining_nodes",
        "ray",
        "ray._private.state.state.get_draining_nodes and get_cluster_config",
        "drain watching: a worker on a node Ray drains checkpoints and stops as a preemption, uncounted; "
        "and the autoscaler's node types where it reports them to GCS",
        "without it a drained node's workers are lost as failures, counted "
        "against FailureConfig.max_failures, and node types are read from the autoscaler's YAML",
        _probe_state,
        behaves=_behaves_state,
        needs_ray=True,
        optional=True,
    ),
    Hook(
        "ray.autoscaler_status",
        "ray",
        "ray.experimental.internal_kv._internal_kv_get('__autoscaling_status')",
        "waiting for the nodes an autoscaler is launching (ScalingConfig's elastic growth, the start-up wait)",
        "without it raytf waits its start timeout for nodes it cannot see coming",
        _probe_status,
        behaves=_behaves_status,
        needs_ray=True,
        optional=True,
    ),
    Hook(
        "ray.log_prefix",
        "ray",
        "ray._private.ray_constants.LOG_PREFIX_ACTOR_NAME",
        "worker log lines prefixed with their rank, (raytf-worker-0 pid=...)",
        "without it Ray's own prefix (the actor class) stays",
        _probe_prefix,
        behaves=_probe_prefix,
        optional=True,
    ),
    Hook(
        "ray.train_data_config",
        "ray",
        "ray.train.DataConfig._datasets_to_split",
        "Ray Train's DataConfig(datasets_to_split=...) passed to raytf.train",
        "pass raytf.train.DataConfig instead of Ray Train's",
        _probe_data_config,
        behaves=_probe_data_config,
    ),
]

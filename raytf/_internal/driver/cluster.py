"""What the driver asks Ray about the cluster: live nodes, draining nodes, the autoscaler's node
types and launches, and which nodes see a local storage path.

Ray has no public API for the autoscaler's node types or launches. Node types: GCS holds a cluster config
where the autoscaler reports one (autoscaler v2, some KubeRay setups);
otherwise the autoscaler reads a YAML file on the head node (the
``--autoscaling-config`` of its monitor process: what ``ray up`` and
``ray start --head --autoscaling-config`` pass), which a 0-CPU task on the
head reads. Every Ray head runs a monitor, autoscaling or not; one without a
config cannot add nodes. What it is launching: the status the autoscaler
publishes for ``ray status``. Every reader degrades to "unknown" rather than
failing a run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Optional

from raytf._internal import hooks
from raytf._internal.hooks import ray as ray_hooks
from raytf._internal.hooks._hook import warn_once

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeType:
    """A node type the autoscaler can add: its resources and how many of it at most."""

    name: str
    resources: dict[str, float]
    max_workers: int


def _read_config_on_head(gcs_address: str) -> Optional[dict]:
    """The config of this cluster's autoscaler, read where it runs (the head node): the
    ``--autoscaling-config`` of the monitor process that serves ``gcs_address``."""
    import os

    import yaml

    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(w.endswith("autoscaler/_private/monitor.py") for w in words):
            continue
        if f"--gcs-address={gcs_address}" not in words:
            continue  # another cluster's autoscaler on the same machine
        for word in words:
            if word.startswith("--autoscaling-config="):
                path = os.path.expanduser(word.split("=", 1)[1])
                if os.path.isfile(path):
                    with open(path) as f:
                        config = yaml.safe_load(f)
                    return {
                        "head_node_type": config.get("head_node_type"),
                        "available_node_types": config.get("available_node_types", {}),
                    }
    return None


def _from_gcs() -> Optional[list[NodeType]]:
    config = _optional(ray_hooks.cluster_config, "ray.draining_nodes")
    if config is None or not config.node_group_configs:
        return None
    return [
        NodeType(g.name, {k: float(v) for k, v in g.resources.items()}, g.max_count if g.max_count >= 0 else 10**6)
        for g in config.node_group_configs
    ]


_checked: set[str] = set()


def _optional(reach: Any, hook_name: str) -> Any:
    """``reach()`` through an optional Ray hook, or None: warned of once, naming what the run goes
    without, where the hook no longer works with this Ray; logged where Ray did not answer."""
    import ray

    from raytf.errors import HookError

    if not ray.is_initialized():
        return None
    hook = hooks.named(hook_name)
    try:
        if hook.name not in _checked:
            hook.check()
            _checked.add(hook.name)
        return reach()
    except HookError as error:
        warn_once(hook, error)
    except (AttributeError, TypeError, ImportError) as error:  # the private API changed under raytf
        warn_once(hook, hook.error(error))
    except Exception as error:  # noqa: BLE001 - not connected, GCS busy: asked again next time
        logger.info("Ray did not answer for %s: %s", hook.reaches, error)
    return None


def _head_node_id() -> Optional[str]:
    import ray

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in node.get("Resources", {}):
            return node["NodeID"]
    return None


def autoscaler_running() -> bool:
    """Whether an autoscaler publishes its status on this cluster."""
    return autoscaler_status() is not None


def node_types(timeout_s: float = 30.0) -> Optional[list[NodeType]]:
    """The worker node types the autoscaler can add (max_workers >= 1), or None when unknown."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    found = _from_gcs()
    if found is not None:
        return [t for t in found if t.max_workers >= 1]
    head = _head_node_id()
    if head is None or not autoscaler_running():
        return None
    gcs_address = ray.get_runtime_context().gcs_address
    if ray.get_runtime_context().get_node_id() == head:  # a job's driver: read it here, no task to start
        config = _read_config_on_head(gcs_address)
    else:
        read = ray.remote(num_cpus=0, max_retries=0)(_read_config_on_head).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)
        )
        try:
            config = ray.get(read.remote(gcs_address), timeout=timeout_s)
        except Exception as error:  # noqa: BLE001 - unknown, not fatal
            logger.info("could not read the autoscaler's config on the head node: %s", error)
            return None
    if config is None:
        return None
    types = []
    for name, spec in config["available_node_types"].items():
        if name == config["head_node_type"]:
            continue
        resources = {k: float(v) for k, v in (spec.get("resources") or {}).items()}
        types.append(NodeType(name, resources, int(spec.get("max_workers", 0))))
    return [t for t in types if t.max_workers >= 1]


def autoscaler_status() -> Optional[dict[str, Any]]:
    """The autoscaler's own report (what `ray status` shows), or None without an autoscaler."""
    raw = _optional(ray_hooks.autoscaler_status, "ray.autoscaler_status")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None


def launching() -> dict[str, int]:
    """Node type -> nodes the autoscaler is launching or setting up now ({} when none, or unknown)."""
    report = (autoscaler_status() or {}).get("autoscaler_report") or {}
    counts = dict(report.get("pending_launches") or {})
    for node in report.get("pending_nodes") or []:  # [ip, node type, status]
        if isinstance(node, (list, tuple)) and len(node) >= 2:
            counts[node[1]] = counts.get(node[1], 0) + 1
    return {k: int(v) for k, v in counts.items() if v}


def live_node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def live_node_ids() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 0.0))


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch, 0 for none) of every node Ray is draining.

    Autoscalers and spot-instance handlers drain a node before taking it away
    (``ray drain-node``, autoscaler v2, KubeRay). Ray has no public API for this: a Ray whose
    private one changed warns once that drains go unseen, and reads as "nothing draining".
    """
    return _optional(ray_hooks.draining_nodes, "ray.draining_nodes") or {}


def _sees(path: str, expected: str) -> bool:
    try:
        with open(path) as f:
            return f.read() == expected
    except OSError:
        return False


def nodes_seeing(directory: str, bundle: dict[str, float], timeout_s: float = 60.0) -> dict[str, Optional[bool]]:
    """For every live node that could hold a worker of ``bundle``: does it see a file the driver
    writes in the local ``directory``? (None: it did not answer in time.)"""
    import os
    import uuid

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raytf._internal.driver.preflight import fits

    nodes = [n for n in ray.nodes() if n.get("Alive") and fits(bundle, n["Resources"])]
    if len(nodes) < 2:
        return {}
    token = uuid.uuid4().hex
    probe = os.path.join(directory, f".raytf-probe-{token}")
    with open(probe, "w") as out:
        out.write(token)
    task = ray.remote(num_cpus=0, max_retries=0)(_sees)
    refs = {
        n["NodeManagerAddress"] + f" (node {n['NodeID'][:8]})": task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(probe, token)
        for n in nodes
    }
    try:
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        return {node: (ray.get(ref) if ref in ready else None) for node, ref in refs.items()}
    finally:
        os.remove(probe)

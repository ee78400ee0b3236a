"""What ``fit()`` checks before anything starts, and what it says when a group does not fit.

Pure: the facts (live nodes, the autoscaler's node types, row counts, which
nodes see a path) come from cluster.py; the decisions and messages are here,
tested without Ray.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

NodeResources = Mapping[str, float]


def _fmt(resources: Mapping[str, float]) -> str:
    shown = {k: v for k, v in sorted(resources.items()) if not _internal(k)}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in shown.items()) + "}"


def _internal(resource: str) -> bool:
    return resource.startswith("node:") or resource in ("memory", "object_store_memory")


def fits(bundle: Mapping[str, float], node: NodeResources) -> bool:
    """Whether a node's total resources can hold one worker's bundle."""
    return all(node.get(k, 0.0) >= v for k, v in bundle.items())


def holds(bundle: Mapping[str, float], node: NodeResources) -> int:
    """How many workers of ``bundle`` a node with these total resources holds."""
    counts = [int(node.get(k, 0.0) // v) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 0


def launchable(
    bundle: Mapping[str, float], workers: int, live: Sequence[NodeResources], node_types: Sequence[Any]
) -> tuple[Optional[str], list[str]]:
    """On an autoscaling cluster: (why the group can never be placed, or None; the node types to wait for).

    ``node_types`` are what the autoscaler can add (``name``, ``resources``,
    ``max_workers`` each). A worker no live node holds but some node type
    does waits for the autoscaler; one that fits no node type, live or
    launchable, is refused at once, as is a group larger than live nodes and
    every launchable node together could hold.
    """
    fitting = [t for t in node_types if holds(bundle, t.resources)]
    names = ", ".join(f"{t.name} {_fmt(t.resources)} x{t.max_workers}" for t in node_types) or "none"
    if not fitting and not any(fits(bundle, n) for n in live):
        return (
            f"no node can hold one worker, which asks for {_fmt(bundle)}: not a live node "
            f"({', '.join(_fmt(n) for n in live) or 'none'}), nor a node type the autoscaler can add "
            f"({names}). Lower the per-worker ask (ScalingConfig.cpus_per_worker, gpus_per_worker, "
            "resources_per_worker) or add a node type that fits it to the cluster's config.",
            [],
        )
    room = sum(holds(bundle, n) for n in live) + sum(holds(bundle, t.resources) * t.max_workers for t in fitting)
    if room < workers:
        return (
            f"the cluster can hold at most {room} workers of {_fmt(bundle)} (live nodes and every node "
            f"the autoscaler can add: {names}), fewer than ScalingConfig.num_workers={workers}. Lower "
            "num_workers or raise the node types' max_workers.",
            [],
        )
    if any(fits(bundle, n) for n in live):
        return None, []
    return None, [t.name for t in fitting]


def unfit_worker(bundle: Mapping[str, float], nodes: Sequence[NodeResources]) -> Optional[str]:
    """Why no live node could ever hold one worker's bundle, or None if one could.

    This compares totals, not what is free now: it rejects only asks the
    cluster as it stands can never meet, such as more GPUs per worker than
    any node has. (With an autoscaler, :func:`launchable` decides instead.)
    """
    if any(fits(bundle, node) for node in nodes):
        return None
    lines = [f"no node in the cluster can hold one worker, which asks for {_fmt(bundle)}."]
    for resource, amount in sorted(bundle.items()):
        most = max((node.get(resource, 0.0) for node in nodes), default=0.0)
        if most < amount:
            setting = {"CPU": "cpus_per_worker", "GPU": "gpus_per_worker"}.get(
                resource, f"resources_per_worker[{resource!r}]"
            )
            lines.append(f"ScalingConfig.{setting}={amount:g}, but the largest node has {most:g} {resource}.")
    lines.append(
        f"Nodes: {', '.join(_fmt(n) for n in nodes) or 'none'}. Lower the per-worker ask or add a "
        "node that fits it; on an autoscaling cluster whose node types raytf cannot read (its "
        "autoscaler runs outside the head's container, as KubeRay's does), pass "
        "ScalingConfig(check_resources=False) and the group waits for the autoscaler."
    )
    return " ".join(lines)


def placement_timeout_message(
    bundle: Mapping[str, float],
    num_workers: int,
    strategy: str,
    timeout_s: float,
    total: Mapping[str, float],
    available: Mapping[str, float],
    nodes: Sequence[NodeResources],
    set_by: str = "ScalingConfig.placement_timeout_s",
) -> str:
    return (
        f"The worker group could not be placed within {timeout_s:g} s "
        f"({set_by}): it asks for {num_workers} x {_fmt(bundle)} "
        f"with placement={strategy}. The cluster has {len(nodes)} node(s) "
        f"[{', '.join(_fmt(n) for n in nodes)}], {_fmt(total)} in all, {_fmt(available)} free. "
        "Free resources (other jobs may hold them), lower num_workers or the per-worker ask, "
        "relax the placement strategy, add nodes, or raise placement_timeout_s "
        "(None waits forever)."
    )


def data_starvation(lazy_datasets: Sequence[str], cluster_cpus: float, worker_cpus: float) -> Optional[str]:
    """Why Ray Data could never run a lazy dataset's tasks while the workers hold the CPUs."""
    if not lazy_datasets or cluster_cpus - worker_cpus >= 1:
        return None
    names = ", ".join(repr(n) for n in lazy_datasets)
    return (
        f"Trainer(datasets=...): {names} must run Ray Data tasks while training, but the worker "
        f"group takes {worker_cpus:g} of the cluster's {cluster_cpus:g} CPUs and leaves none for "
        "them, so reading would wait forever. Call .materialize() on the dataset before fit(), "
        "lower ScalingConfig.num_workers or cpus_per_worker, or add CPUs; on an autoscaling "
        "cluster pass ScalingConfig(check_resources=False)."
    )


def unseen_storage(root: str, seen: Mapping[str, Optional[bool]]) -> Optional[str]:
    """Why a local storage path will not work on this cluster, or None.

    ``seen`` maps each node that could hold a worker (by address) to whether
    it found the probe file the driver wrote under ``root``; None means the
    node did not answer in time, which says nothing either way.
    """
    blind = sorted(node for node, found in seen.items() if found is False)
    if not blind:
        return None
    return (
        f"RunConfig.storage_path={root!r} is a local directory, but the workers on "
        f"{', '.join(blind)} cannot see what the driver writes there, so checkpoints would be "
        "lost with the node that wrote them. Use storage every node shares: a URI such as "
        "s3://bucket/prefix or gs://bucket/prefix, or a path on a network filesystem (NFS, EFS) "
        "mounted at the same place on every node."
    )


def too_few_rows(
    name: str, rows: int, workers: int, split: bool, trainer: str = "Trainer", scaling: str = "ScalingConfig"
) -> Optional[str]:
    """Why a materialized dataset cannot feed the group (empty, or fewer rows than workers), or None."""
    if split and rows < workers:
        return (
            f"{trainer}(datasets={{{name!r}: ...}}) has {rows} row(s), fewer than the {workers} workers it "
            f"is split across, so some worker would get none. Pass more data, lower "
            f"{scaling}.num_workers, or leave it out of DataConfig(datasets_to_split=...) so every "
            "worker gets all of it"
        )
    if rows == 0:
        return f"{trainer}(datasets={{{name!r}: ...}}) is empty (0 rows); pass a dataset with rows"
    return None


def check_group(
    bundle: Mapping[str, float],
    min_workers: int,
    live: Sequence[NodeResources],
    node_types: Optional[Sequence[Any]],
    lazy_datasets: Sequence[str],
    cluster_cpus: float,
) -> tuple[Optional[str], list[str]]:
    """(why the group can never run here, or None; node types it waits for the autoscaler to add).

    ``node_types`` is None where no autoscaler can add nodes (or raytf cannot
    read its config): then a worker must fit a live node, and lazy datasets
    need a CPU the workers leave free.
    """
    if node_types is None:
        problem = unfit_worker(bundle, live) or data_starvation(
            lazy_datasets, cluster_cpus, min_workers * bundle.get("CPU", 0.0)
        )
        return problem, []
    return launchable(bundle, min_workers, live, node_types)


def file_sources(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """The datasets that are raytf.data file sources (read by the workers, not by Ray Data)."""
    from raytf._internal.data.files import FileSource

    return {name: d for name, d in datasets.items() if isinstance(d, FileSource)}


def unreadable_files(name: str, source: Any) -> Optional[str]:
    """Why a file source names no files to read, if it does not (they are counted later, while
    the workers start)."""
    from raytf._internal.data.files import list_files

    try:
        list_files(source)
    except (ValueError, OSError) as error:
        return f"Trainer(datasets={{{name!r}: ...}}): {error}"
    return None

"""Placement groups: waiting for the cluster (and its autoscaler) to fit one; where one's bundles are."""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from ray.util import placement_group_table
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from raytf._internal.driver import cluster

_STEP_S = 1.0  # how often to look at the autoscaler while waiting
_NOTE_INTERVAL_S = 30.0  # how often to say that it still waits


def _describe(bundles: Sequence[dict[str, float]]) -> str:
    counts: dict[str, int] = {}
    for bundle in bundles:
        counts[str(bundle)] = counts.get(str(bundle), 0) + 1
    return " + ".join(f"{n} x {b}" for b, n in counts.items())


def place(
    bundles: Sequence[dict[str, float]],
    strategy: str,
    timeout_s: Optional[float],
    notify: Callable[[str], None] = lambda message: None,
    set_by: str = "ScalingConfig.placement_timeout_s",
) -> Optional[PlacementGroup]:
    """A placement group of ``bundles``, ready; or None after ``timeout_s`` (None: wait forever),
    which ``set_by`` names in what is said while waiting.

    Time in which the autoscaler is launching nodes does not count: a cloud
    GPU node takes minutes to come up, and the wait is for it. What it waits
    for is said when that changes, and every half minute.
    """
    group = placement_group(list(bundles), strategy=strategy)
    waited, said, said_at = 0.0, "", 0.0
    while not group.wait(_STEP_S):
        launching = cluster.launching()
        if not launching:
            waited += _STEP_S
        what = f"waiting for room for {_describe(bundles)}"
        if launching:
            what += ": the autoscaler is launching " + ", ".join(f"{n} x {t}" for t, n in sorted(launching.items()))
        now = time.monotonic()
        if what != said or now - said_at >= _NOTE_INTERVAL_S:
            limit = "None" if timeout_s is None else f"{timeout_s:g}"
            notify(what if launching else f"{what} ({waited:.0f} s of {set_by}={limit})")
            said, said_at = what, now
        if timeout_s is not None and waited >= timeout_s:
            remove_placement_group(group)
            return None
    return group


def bundle_nodes(group: PlacementGroup) -> dict[int, str]:
    """Bundle index -> the id of the node it was placed on."""
    table = placement_group_table(group)
    return {int(i): node for i, node in (table.get("bundles_to_node_id") or {}).items()}


def on_live_nodes(group: PlacementGroup) -> bool:
    """Whether ``group`` is placed, on live nodes none of which is draining."""
    table = placement_group_table(group)
    nodes = set((table.get("bundles_to_node_id") or {}).values())
    return (
        table.get("state") == "CREATED"
        and bool(nodes)
        and nodes <= cluster.live_node_ids()
        and not nodes & set(cluster.draining_nodes())
    )


def remove(group: Optional[PlacementGroup]) -> None:
    if group is not None:
        remove_placement_group(group)

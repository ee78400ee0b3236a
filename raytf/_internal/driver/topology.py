"""Ranks and TF_CONFIG, from the addresses the actors report. Pure: no Ray, no TensorFlow.

The driver gathers one :class:`WorkerAddress` per actor of each role, calls
:func:`assign_ranks` for the training workers, and :func:`build_tf_config`
once per actor, with the cluster of every role.
"""

from __future__ import annotations

import json
from typing import Mapping, Sequence

from raytf._internal.protocol import RankInfo, WorkerAddress, format_host_port

__all__ = [
    "ROLE_ORDER",
    "RankInfo",
    "WorkerAddress",
    "assign_ranks",
    "build_tf_config",
    "format_host_port",
    "worker_list",
]

# The cluster's roles in the order TensorFlow's docs and Kubeflow's TFJob list them.
ROLE_ORDER = ("chief", "worker", "ps", "evaluator")


def assign_ranks(addresses: Sequence[WorkerAddress]) -> list[RankInfo]:
    """Ranks for each actor, in the order the actors were given.

    Nodes are numbered in the order their first actor appears (the order of the
    placement group's bundles), and each node's actors take consecutive world
    ranks in bundle order, so local rank 0 of every node is its lowest world
    rank and the actor in bundle 0 is the chief.
    """
    if not addresses:
        raise ValueError("assign_ranks needs at least one worker address")
    node_order: dict[str, list[int]] = {}
    for index, address in enumerate(addresses):
        node_order.setdefault(address.node_id, []).append(index)
    check_unique(addresses)
    ranks: list[RankInfo | None] = [None] * len(addresses)
    world_rank = 0
    for node_rank, indices in enumerate(node_order.values()):
        for local_rank, index in enumerate(indices):
            ranks[index] = RankInfo(
                world_rank=world_rank,
                world_size=len(addresses),
                local_rank=local_rank,
                local_world_size=len(indices),
                node_rank=node_rank,
                num_nodes=len(node_order),
            )
            world_rank += 1
    return [r for r in ranks if r is not None]


def check_unique(addresses: Sequence[WorkerAddress]) -> None:
    seen: set[tuple[str, int]] = set()
    for address in addresses:
        key = (address.node_ip, address.port)
        if key in seen:
            raise ValueError(f"two workers reported the same address {address.host_port}")
        seen.add(key)


def worker_list(addresses: Sequence[WorkerAddress], ranks: Sequence[RankInfo]) -> list[str]:
    """The ``cluster.worker`` list of TF_CONFIG: each worker's ``host:port`` at its world rank."""
    by_rank = sorted(zip(ranks, addresses), key=lambda pair: pair[0].world_rank)
    return [address.host_port for _, address in by_rank]


def build_tf_config(cluster: Mapping[str, Sequence[str]] | Sequence[str], index: int, task_type: str = "worker") -> str:
    """The TF_CONFIG JSON of task ``index`` of role ``task_type``.

    ``cluster`` maps each role to its tasks' ``host:port`` in index order (a
    plain list is the "worker" role alone: MultiWorkerMirroredStrategy, whose
    rank 0 acts as chief when no ``chief`` task is listed). An evaluator is
    not part of the training cluster, as TensorFlow expects: it is left out of
    ``cluster``, and its own TF_CONFIG names it as its task.
    """
    roles = {"worker": list(cluster)} if not isinstance(cluster, Mapping) else {k: list(v) for k, v in cluster.items()}
    tasks = roles.get(task_type, [])
    if not 0 <= index < len(tasks):
        raise ValueError(f"task index {index} of role {task_type!r} is outside 0..{len(tasks) - 1}")
    members = {role: roles[role] for role in ROLE_ORDER if role != "evaluator" and roles.get(role)}
    return json.dumps({"cluster": members, "task": {"type": task_type, "index": index}}, sort_keys=True)

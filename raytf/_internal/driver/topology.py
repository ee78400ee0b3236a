"""Ranks and TF_CONFIG, from the addresses the worker actors report.

Pure functions: no Ray, no TensorFlow. The driver gathers one
:class:`WorkerAddress` per actor, calls :func:`assign_ranks`, then
:func:`build_tf_config` once per rank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class WorkerAddress:
    """Where one worker actor lives and the port it holds for TensorFlow's server."""

    node_id: str
    node_ip: str
    port: int
    gpu_ids: tuple[str, ...] = ()
    pid: int = 0

    @property
    def host_port(self) -> str:
        return format_host_port(self.node_ip, self.port)


@dataclass(frozen=True)
class RankInfo:
    """The ranks of one worker. Workers on one node have contiguous world ranks."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int


def format_host_port(host: str, port: int) -> str:
    """``host:port``, with IPv6 addresses in brackets as gRPC expects."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


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
    seen_ports: set[tuple[str, int]] = set()
    for address in addresses:
        key = (address.node_ip, address.port)
        if key in seen_ports:
            raise ValueError(f"two workers reported the same address {address.host_port}")
        seen_ports.add(key)

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


def worker_list(addresses: Sequence[WorkerAddress], ranks: Sequence[RankInfo]) -> list[str]:
    """The ``cluster.worker`` list of TF_CONFIG: each worker's ``host:port`` at its world rank."""
    by_rank = sorted(zip(ranks, addresses), key=lambda pair: pair[0].world_rank)
    return [address.host_port for _, address in by_rank]


def build_tf_config(workers: Sequence[str], world_rank: int) -> str:
    """The TF_CONFIG JSON of the worker at ``world_rank``.

    Every rank is a ``worker``; rank 0 acts as MultiWorkerMirroredStrategy's
    chief, as TensorFlow does when no ``chief`` task is listed.
    """
    if not 0 <= world_rank < len(workers):
        raise ValueError(f"world_rank {world_rank} is outside 0..{len(workers) - 1}")
    return json.dumps(
        {"cluster": {"worker": list(workers)}, "task": {"type": "worker", "index": world_rank}},
        sort_keys=True,
    )

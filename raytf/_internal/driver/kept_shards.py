"""Warm restarts' data: each rank's shard, as an attempt read it, kept for the next attempt.

With warm standbys (``FailureConfig.warm_standby``), once an attempt trains, the driver
asks each rank for the shards it read whole (the cached path of
``raytf.get_dataset_shard``). The columns come back as the return value of an
actor call the driver made, so they sit in Ray's object store on the worker's
node, owned by the driver: they outlive the worker process. A restart of the
same size hands rank r what rank r read (data/shard.py, KeptShard) instead of
splitting the dataset again, which costs a new split coordinator, a streaming
executor and a second read of every block (0.8 s of a 2.3 s W1 recovery).
The retry also trains on exactly the rows its predecessor trained on, so a
seeded shuffle resumes as the run without a failure would have.

A whole (unsplit) dataset is kept once, from rank 0, and given to every rank.
The cost is one more copy of the shards in object-store memory for the run.
"""

from __future__ import annotations

import logging
from typing import Any, Collection, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from raytf._internal.data.shard import KeptShard
from raytf._internal.driver import cluster

logger = logging.getLogger(__name__)

# A rank's answer, asked for once the attempt trained, is long in by the restart (the CPU workers'
# standbys, warm.py, are made only once it is).
ANSWER_TIMEOUT_S = 10.0


class ShardKeeper:
    """What the ranks of the last attempt that trained read whole, by dataset name."""

    def __init__(self, names: Collection[str], split: Collection[str]):
        self._names = sorted(names)
        self._split = frozenset(split)
        self._kept: dict[str, list[KeptShard]] = {}
        # name -> (flags, columns, nodes), one each per rank asked: a rank's columns stay on its node
        self._asked: dict[str, tuple[list[Any], list[Any], list[str]]] = {}
        self._nodes: dict[str, list[str]] = {}  # name -> the nodes that hold its kept shards
        self._workers = 0  # the size of the attempt the shards are from
        self._unproven = False  # an attempt started from kept shards and has not trained yet

    def ask(self, actors: Sequence[Any], nodes: Sequence[str]) -> None:
        """The attempt trains: ask its ranks (by world rank; ``nodes``: each one's node id) for what
        they read that is not kept yet."""
        self._unproven = False
        if len(actors) != self._workers:
            self.clear()
            self._workers = len(actors)
        for name in self._names:
            if name in self._kept or name in self._asked:
                continue
            count = len(actors) if name in self._split else 1
            calls = [actor.shard_read_whole.options(num_returns=2).remote(name) for actor in actors[:count]]
            self._asked[name] = ([flag for flag, _ in calls], [columns for _, columns in calls], list(nodes[:count]))

    def answered(self) -> bool:
        """Every rank asked has answered, or died (its answer is then an error): what it read is
        kept, or known to be lost."""
        flags = [flag for asked, _, _ in self._asked.values() for flag in asked]
        if not flags:
            return True
        ready, _ = ray.wait(flags, num_returns=len(flags), timeout=0, fetch_local=False)
        return len(ready) == len(flags)

    def all_whole(self) -> bool:
        """Once :meth:`answered`: whether every rank asked said it had read its shards whole (a rank
        that died is no answer to wait for)."""
        flags = [flag for asked, _, _ in self._asked.values() for flag in asked]
        try:
            return all(ray.get(flags, timeout=0))
        except (RayActorError, GetTimeoutError):
            return True

    def ask_again(self, actors: Sequence[Any]) -> None:
        """Ask again each rank (by world rank) that has not said it read a shard whole: asked while
        its loop was still reading (before the attempt's first step or report), it may have now."""
        for name, (flags, columns, _) in self._asked.items():
            for rank, flag in enumerate(flags):
                try:
                    whole = bool(ray.get(flag, timeout=0))
                except RayActorError:
                    continue  # gone: this dataset is split anew
                except GetTimeoutError:
                    whole = False  # not answered yet: its answer may be from before the read ended
                if not whole:
                    flags[rank], columns[rank] = actors[rank].shard_read_whole.options(num_returns=2).remote(name)

    def take(self, workers: int) -> dict[str, list[KeptShard]]:
        """At the start of an attempt of ``workers`` ranks: what it can read in place of a new split.

        Nothing when the size changed, or when the last attempt started from kept shards and
        ended before it trained (a kept shard that cannot be read must not fail every retry).
        """
        for name, (flags, columns, nodes) in self._asked.items():
            try:
                if all(ray.get(flags, timeout=ANSWER_TIMEOUT_S)):
                    self._kept[name] = [KeptShard(ref) for ref in columns]
                    self._nodes[name] = nodes
            except (RayActorError, GetTimeoutError):
                pass  # a rank died before it answered: this dataset is split anew
        self._asked = {}
        if self._unproven or workers != self._workers:
            self._kept, self._nodes = {}, {}
        # The object store has the only copy, on the node of the rank that read it. (Ray's object
        # locations cannot tell: once a node is gone they name a live node that reconstruction
        # is trying, and fails, to fill.)
        alive = cluster.live_node_ids()
        for name in [n for n, nodes in self._nodes.items() if not alive.issuperset(nodes)]:
            logger.info("dataset %r: a node that held its kept shards is gone; splitting it anew", name)
            del self._kept[name], self._nodes[name]
        self._unproven = bool(self._kept)
        return dict(self._kept)

    def clear(self) -> None:
        self._kept, self._asked, self._nodes, self._unproven = {}, {}, {}, False

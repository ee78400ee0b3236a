"""The driver's side of data: each dataset cut into one iterator per worker rank.

Split datasets go through ``streaming_split(n, equal=True)`` with each rank's
node as its locality hint, made afresh for every attempt so a restarted group
never reads from a dead split (a warm restart gives each rank what its predecessor
read instead); the others are given whole to every rank.
Datasets are used through those two methods only, so this is tested with
stand-ins, without Ray.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional, Sequence


def split_for_ranks(
    datasets: Mapping[str, Any],
    split: Collection[str],
    node_ids: Sequence[str],
    kept: Optional[Mapping[str, Sequence[Any]]] = None,
) -> list[dict[str, Any]]:
    """Per world rank (``node_ids[r]`` is rank r's node), an iterator for each dataset.

    ``kept``: for some datasets, what the ranks of an earlier attempt read (data/shard.py,
    KeptShard), given in place of a new split: one per rank for a split dataset, one for all
    ranks for a whole one.
    """
    kept = kept or {}
    shards: list[dict[str, Any]] = [{} for _ in node_ids]
    for name, dataset in datasets.items():
        if name in kept:
            iterators = [kept[name][rank if name in split else 0] for rank in range(len(node_ids))]
        elif name in split:
            iterators = dataset.streaming_split(len(node_ids), equal=True, locality_hints=list(node_ids))
        else:
            iterators = [dataset.iterator() for _ in node_ids]
        for rank, iterator in enumerate(iterators):
            shards[rank][name] = iterator
    return shards

"""Finding the rank that stopped taking part. Pure: no Ray, no TensorFlow.

A collective waits for every rank. If one rank's ``train_fn`` returned, or
it sits in its own code, its peers wait inside TensorFlow, with no error and
no end. The driver sees each rank's :class:`~raytf._internal.protocol.Activity` at every
poll; a hang is some rank waiting in TensorFlow for ``hang_timeout_s`` while
another has been out of it (returned, or in its own Python code) as long.
The rank out of TensorFlow is the one named.

The same picture names the cause when a collective fails on a timeout
(``TensorflowConfig.collective_timeout_s``): the rank that timed out was the
one waiting; the peer that had returned or was idle in Python is the cause.
"""

from __future__ import annotations

import time
from typing import Mapping, Optional

from raytf._internal.protocol import Activity, ActivityKind
from raytf.errors import FailureKind, WorkerFailure

# A peer at least this long out of TensorFlow when a collective fails is taken as its cause.
IDLE_BLAME_S = 2.0


def _ranks_wait(ranks: list[int], still: str = "") -> str:
    """ "rank 0 waits" or "ranks 0, 2 wait"."""
    one = len(ranks) == 1
    return f"{'rank' if one else 'ranks'} {', '.join(map(str, ranks))} {still}{'waits' if one else 'wait'}"


def _failure(rank: int, activity: Activity, waiting: list[int], node_ip: str, why: str) -> WorkerFailure:
    if activity.kind == ActivityKind.FINISHED:
        return WorkerFailure(
            rank=rank,
            kind=FailureKind.RETURNED_EARLY,
            error_type="ReturnedEarly",
            message=(
                f"train_fn returned {activity.seconds:.0f} s ago while {_ranks_wait(waiting, 'still ')} "
                f"in a TensorFlow collective, which needs every rank ({why}). Every rank must run "
                "the same steps and collectives: an early return, or a rank with fewer batches, "
                "leaves the others waiting"
            ),
            traceback="",
            time=time.time(),
            node_ip=node_ip,
        )
    return WorkerFailure(
        rank=rank,
        kind=FailureKind.STALLED,
        error_type="Stalled",
        message=(
            f"stopped taking part: it has been in its own code, outside TensorFlow, for "
            f"{activity.seconds:.0f} s (at {activity.where or 'an unknown line'}) while "
            f"{_ranks_wait(waiting)} in a TensorFlow collective for it ({why})"
        ),
        traceback="",
        time=time.time(),
        node_ip=node_ip,
    )


def _out(activity: Activity, at_least_s: float) -> bool:
    return activity.kind == ActivityKind.FINISHED or (
        activity.kind == ActivityKind.PYTHON and activity.seconds >= at_least_s
    )


def find_hangs(
    activities: Mapping[int, Activity], timeout_s: Optional[float], node_ips: Mapping[int, str]
) -> list[WorkerFailure]:
    """The ranks that stopped taking part while others wait, once both have lasted ``timeout_s``."""
    if timeout_s is None:
        return []
    waiting = sorted(r for r, a in activities.items() if a.kind == ActivityKind.TENSORFLOW and a.seconds >= timeout_s)
    if not waiting:
        return []
    why = f"FailureConfig.hang_timeout_s={timeout_s:g}"
    return [
        _failure(rank, activity, waiting, node_ips.get(rank, ""), why)
        for rank, activity in sorted(activities.items())
        if _out(activity, timeout_s)
    ]


def blame_collective(
    failed: WorkerFailure, activities: Mapping[int, Activity], node_ips: Mapping[int, str]
) -> list[WorkerFailure]:
    """When ``failed`` is a collective error, the peers that had stopped taking part, if any."""
    why = f"its collective then failed with {failed.error_type}"
    return [
        _failure(rank, activity, [failed.rank], node_ips.get(rank, ""), why)
        for rank, activity in sorted(activities.items())
        if rank != failed.rank and _out(activity, IDLE_BLAME_S)
    ]

"""An elastic group that runs below its maximum grows back while it trains.

While an attempt of ``num_workers=(min, max)`` trains with fewer than ``max`` workers, the
driver keeps a placement group for the missing workers' bundles waiting in the cluster. It
holds nothing while it waits; it is the demand an autoscaler sees (Ray's autoscaler launches
nodes for pending placement groups), and it is ready as soon as the room is there: a node the
autoscaler added, a node back from a drain, another job's workers gone. Then the driver lets
it go and asks the group to checkpoint and stop, as a preemption does (``result.failures`` has
it as kind "resized", counted against neither max_failures nor max_preemptions), and
the next attempt places ``max`` workers and resumes from that checkpoint; with
``DataConfig(exactly_once=True)`` the interrupted epoch goes on exactly where it stood
(data/position.py), now cut over more workers.

A group that tried to grow and was placed below ``max`` again (the room was not there for the
group's placement strategy, or was taken meanwhile) waits twice as long before the next try,
up to a minute. A node that comes and goes would make a group that grows and shrinks without
end, a restart each time: the scaling policy's ``growth_hold_s`` spaces growths out
(``DefaultScalingPolicy``: a growth within ten minutes of the last waits 30 s after it, and each
further one twice as long, up to ten minutes), said once per wait.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.members import GroupView
from raytf.errors import ConfigError, FailureKind
from raytf.policies import ScalingPolicy

logger = logging.getLogger(__name__)

_CHECK_S = 2.0  # how often a group below its maximum looks whether the room is there
_MAX_BACKOFF = 30  # times _CHECK_S


def growth_hold_s(policy: ScalingPolicy, grown_at: list[float], now: float) -> float:
    """The policy's wait after the last growth before the next (inf: no more growth), checked."""
    hold = policy.growth_hold_s(tuple(grown_at), now)
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or math.isnan(hold) or hold < 0:
        raise ConfigError(
            f"{type(policy).__name__}.growth_hold_s returned {hold!r}: seconds >= 0 (float('inf'): grow no more)"
        )
    return float(hold)


class GrowBack(GroupCallback):
    """Grow an elastic group to its maximum once the cluster has room for the rest, as the
    scaling policy paces it."""

    def __init__(self, policy: ScalingPolicy, check_s: float = _CHECK_S):
        self._policy = policy
        self._check_s = check_s
        self._checked_at = 0.0
        self._backoff = 1
        self._probe: Any = None  # the missing bundles' placement group, waiting for room
        self._probe_ready: Any = None  # its ready() reference, asked for once
        self._grew_from: Optional[int] = None  # the size that asked to grow, until the next placement
        self._grown_at: list[float] = []  # when each growth was asked for (the driver's clock)
        self._first_seen: Optional[float] = None  # the first answers' time: what a hold before any growth counts from
        self._holding_until: Optional[float] = None  # a flapping node's wait, once said

    def after_placement(self, group: GroupView) -> None:
        if self._grew_from is not None:
            grew = group.num_workers > self._grew_from
            self._backoff = 1 if grew else min(self._backoff * 2, _MAX_BACKOFF)
            if not grew:
                logger.warning(
                    "elastic group: placed %d workers again (of %d); the next try to grow in %.0f s",
                    group.num_workers,
                    group.elastic.max_workers,
                    self._check_s * self._backoff,
                )
            self._grew_from = None

    def on_answers(self, group: GroupView, now: float) -> None:
        missing = group.elastic.max_workers - group.num_workers
        if (
            missing <= 0
            or group.preempt_reason
            or group.watch is None
            or group.watch.trained_since() is None
            or now - self._checked_at < self._check_s * self._backoff
        ):
            return
        if self._first_seen is None:
            self._first_seen = now
        hold = growth_hold_s(self._policy, self._grown_at, now)
        since = self._grown_at[-1] if self._grown_at else self._first_seen  # the last growth, or the run's start
        if hold and now < since + hold:
            if self._holding_until != since + hold:  # said once per wait
                self._holding_until = since + hold
                by = f"{type(self._policy).__name__}.growth_hold_s"
                if not math.isfinite(hold):
                    group.notify(f"elastic group: {by} allows no further growth")
                elif self._grown_at:
                    group.notify(
                        f"elastic group: lost workers again after growing; the next growth waits until "
                        f"{hold:.0f} s after the last ({by})"
                    )
                else:
                    group.notify(
                        f"elastic group: growing waits until {hold:.0f} s after training began below its maximum ({by})"
                    )
            return
        self._checked_at = now
        bundle = next(role.bundle for role in group.roles if role.name == group.shape.train_role)
        if self._probe is None:
            self._probe = placement_group([dict(bundle)] * missing, strategy="SPREAD")
            self._probe_ready = self._probe.ready()
        ready, _ = ray.wait([self._probe_ready], timeout=0)
        if not ready:
            return
        self._remove_probe()  # its room, for the next attempt's placement
        self._grew_from = group.num_workers
        self._grown_at.append(now)
        group.notify(f"room for {missing} more worker(s) of {bundle}: growing to {group.elastic.max_workers}")
        group.preempt(
            group.trainer_index,
            f"the cluster has room for {missing} more worker(s) of {bundle} (ScalingConfig.num_workers="
            f"({group.elastic.min_workers}, {group.elastic.max_workers})); growing from "
            f"{group.num_workers} to {group.elastic.max_workers} workers",
            FailureKind.RESIZED,
        )

    def before_shutdown(self, group: GroupView) -> None:
        self._remove_probe()

    def on_close(self, group: GroupView) -> None:
        self._remove_probe()

    def _remove_probe(self) -> None:
        if self._probe is not None:
            remove_placement_group(self._probe)
            self._probe = self._probe_ready = None

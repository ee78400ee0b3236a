"""How many workers each attempt asks for, and for how long: the scaling policy's placement tries,
checked and labelled for the messages that say how long has gone. Pure: no Ray.

The policy is ``ScalingConfig(policy=...)``'s (raytf.policies), ``DefaultScalingPolicy`` without
one: a fixed group asks for its size for ``placement_timeout_s``; an elastic group,
``num_workers=(min, max)``, asks for ``max`` for ``resize_timeout_s`` (a lost node's capacity may
come back, or the autoscaler replace it); then for each smaller size down to ``min`` in turn,
briefly, and for ``min`` as long as a fixed group would wait.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NamedTuple, Optional, cast

from raytf.errors import ConfigError
from raytf.policies import DefaultScalingPolicy, PlacementTry, ScalingPolicy


class Try(NamedTuple):
    """One size to place, how long to wait for it (None: for ever), and what set that wait (for
    the messages that say how long has gone)."""

    workers: int
    timeout_s: Optional[float]
    set_by: str


@dataclass(frozen=True)
class ElasticPolicy:
    min_workers: int
    max_workers: int
    placement_timeout_s: Optional[float]
    resize_timeout_s: float
    config: str = "ScalingConfig"  # the class whose settings these are, as messages name them
    policy: ScalingPolicy = field(default_factory=DefaultScalingPolicy)
    scaling: Any = None  # the ScalingConfig the policy is handed, where the group has one

    def tries(self) -> list[Try]:
        """The sizes in the order to try them, as the policy says, each checked."""
        # The run's ScalingConfig; a parameter-server group's sizes in its fields' names (its policy is the default).
        settings = self.scaling or SimpleNamespace(
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            placement_timeout_s=self.placement_timeout_s,
            resize_timeout_s=self.resize_timeout_s,
        )
        name = f"{type(self.policy).__name__}.placement_tries"
        raw = list(self.policy.placement_tries(cast(Any, settings)))
        if not raw:
            raise ConfigError(f"{name} returned no size to place: return at least one PlacementTry")
        tries = [self._checked(item, name) for item in raw]
        if type(self.policy).placement_tries is not DefaultScalingPolicy.placement_tries:
            return [Try(t.workers, t.timeout_s, name) for t in tries]
        placement = f"{self.config}.placement_timeout_s"
        if len(tries) == 1:
            return [Try(tries[0].workers, tries[0].timeout_s, placement)]
        shrink = f"{type(self.policy).__name__}.shrink_try_s"
        first = Try(tries[0].workers, tries[0].timeout_s, f"{self.config}.resize_timeout_s")
        last = Try(tries[-1].workers, tries[-1].timeout_s, placement)
        return [first] + [Try(t.workers, t.timeout_s, shrink) for t in tries[1:-1]] + [last]

    def _checked(self, item: Any, name: str) -> PlacementTry:
        if not isinstance(item, PlacementTry):
            raise ConfigError(f"{name} returned {item!r}: each try is a raytf.PlacementTry(workers, timeout_s)")
        workers, timeout_s = item.workers, item.timeout_s
        if (
            isinstance(workers, bool)
            or not isinstance(workers, int)
            or not self.min_workers <= workers <= self.max_workers
        ):
            raise ConfigError(
                f"{name} asked for {workers!r} workers: each try's workers must be an int from "
                f"{self.config}.num_workers' min to its max ({self.min_workers} to {self.max_workers})"
            )
        if timeout_s is not None and (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or math.isnan(timeout_s)
            or timeout_s <= 0
        ):
            raise ConfigError(f"{name} gave {workers} workers a wait of {timeout_s!r}: seconds > 0, or None for ever")
        return PlacementTry(workers, timeout_s)

    @staticmethod
    def shrunk(workers: int, first: Try) -> Optional[str]:
        """What to tell the user when the group starts with fewer workers than its first try asked for."""
        if workers == first.workers or first.timeout_s is None:
            return None
        return (
            f"{first.workers} workers could not be placed within {first.timeout_s:g} s "
            f"({first.set_by}); training with {workers}"
        )

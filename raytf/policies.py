"""Policies a run takes as objects: what a failure leads to, and how many workers to place and when
to grow. Imports neither Ray nor TensorFlow; both run on the driver, between polls, and must not block.

``FailureConfig(policy=...)`` takes a :class:`FailurePolicy`, ``ScalingConfig(policy=...)`` a
:class:`ScalingPolicy`. Without one, a run uses :class:`DefaultFailurePolicy` and
:class:`DefaultScalingPolicy`, which are raytf's behaviour as the configs' settings describe it
(``max_failures``, ``retry_on_exception``, ``max_preemptions``; ``placement_timeout_s``,
``resize_timeout_s``); subclass them to change one decision and keep the rest::

    class BackOff(raytf.DefaultFailurePolicy):
        \"\"\"Retry as the defaults do, waiting longer after each lost worker.\"\"\"

        def decide(self, failure, history):
            decision = super().decide(failure, history)
            if decision.retry and failure.kind in ("died", "unresponsive"):
                return raytf.FailureDecision(retry=True, delay_s=min(10 * 2 ** history.counted, 300))
            return decision

    raytf.FailureConfig(max_failures=5, policy=BackOff())
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Optional, Sequence

from raytf.errors import FailureKind, WorkerFailure

if TYPE_CHECKING:
    from raytf.config import FailureConfig, ScalingConfig

__all__ = [
    "DefaultFailurePolicy",
    "DefaultScalingPolicy",
    "FailureDecision",
    "FailureHistory",
    "FailurePolicy",
    "PlacementTry",
    "ScalingPolicy",
]


@dataclass(frozen=True)
class FailureDecision:
    """What a :class:`FailurePolicy` decided about a failure: restart the group (``retry``) after
    ``delay_s`` seconds, or end the run with ``raytf.TrainingFailedError``; ``reason`` is said in
    the driver's log either way. ``FailureDecision.RETRY`` and ``FailureDecision.RAISE`` are the
    plain ones."""

    retry: bool
    delay_s: float = 0.0
    reason: str = ""

    RETRY: ClassVar["FailureDecision"]
    RAISE: ClassVar["FailureDecision"]

    def __post_init__(self) -> None:
        from raytf.errors import ConfigError

        if not isinstance(self.retry, bool):
            raise ConfigError(f"FailureDecision.retry must be True or False, got {self.retry!r}")
        delay = self.delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
            raise ConfigError(f"FailureDecision.delay_s must be a number of seconds >= 0, got {delay!r}")


FailureDecision.RETRY = FailureDecision(retry=True)
FailureDecision.RAISE = FailureDecision(retry=False)


@dataclass(frozen=True)
class FailureHistory:
    """What a :class:`FailurePolicy` sees besides the failure it decides: the run's failures so
    far, that one last (``failures``); how many of them count against ``max_failures`` as the
    default policy counts (``counted``: preemptions, growths and the first few port races do not,
    nor the end of a replacement that did not come up, which continues a failure already
    counted); the preemptions among them; and the run's ``FailureConfig``."""

    failures: tuple[WorkerFailure, ...]
    counted: int
    preemptions: int
    config: "FailureConfig"


class FailurePolicy(abc.ABC):
    """Decides what each failure of a run leads to. Subclass it and implement :meth:`decide`.

    It is called on the driver once per failure that ends an attempt (the failure that explains
    the others: a lost worker rather than the collective errors its loss caused in its peers), and
    once per parameter-server worker that is to be replaced in place. It is never called for a run
    that stops because the driver was stopped or lost its lease."""

    @abc.abstractmethod
    def decide(self, failure: WorkerFailure, history: FailureHistory) -> FailureDecision:
        """Retry (``FailureDecision.RETRY``, or with a ``delay_s``) or raise (``FailureDecision.RAISE``,
        or with a ``reason``)."""


# A launched script whose server lost raytf's port handover is retried with new ports this many
# times without counting; past it, every further race counts against max_failures as a failure
# (a machine where ports are taken that often has a problem no number of retries fixes).
FREE_PORT_RACES = 3


class DefaultFailurePolicy(FailurePolicy):
    """raytf's policy, as ``FailureConfig`` describes it: an exception in ``train_fn`` (or a rank
    whose ``train_fn`` returned before its peers') ends the run unless ``retry_on_exception``;
    anything else is retried while ``max_failures`` allows (``-1``: no limit); preemptions have a
    budget of their own (``max_preemptions``); an elastic group's growth is always retried (its
    pace is the scaling policy's); a launched script's lost port race is free
    ``FREE_PORT_RACES`` times, then counts."""

    def __init__(self) -> None:
        """No settings of its own: it reads its limits from the run's ``FailureConfig``
        (``history.config``) at each decision."""

    def decide(self, failure: WorkerFailure, history: FailureHistory) -> FailureDecision:
        config = history.config
        if failure.kind == FailureKind.RESIZED:
            return FailureDecision.RETRY
        if failure.kind == FailureKind.PREEMPTED:
            limit = config.max_preemptions
            if limit != -1 and history.preemptions > limit:
                return FailureDecision(retry=False, reason=f"FailureConfig.max_preemptions={limit} used up")
            return FailureDecision.RETRY
        exhausted = config.max_failures != -1 and history.counted > config.max_failures
        if failure.kind in (FailureKind.EXCEPTION, FailureKind.RETURNED_EARLY) and not config.retry_on_exception:
            # The training code's doing: a retry would do it again, unless the user says otherwise.
            return FailureDecision(retry=False, reason="FailureConfig.retry_on_exception=False")
        if exhausted:
            return FailureDecision(retry=False, reason=f"FailureConfig.max_failures={config.max_failures} used up")
        return FailureDecision.RETRY


@dataclass(frozen=True)
class PlacementTry:
    """One size a (re)start asks the cluster for, and how long it waits for it (None: for ever,
    as an autoscaling cluster may need)."""

    workers: int
    timeout_s: Optional[float]


class ScalingPolicy(abc.ABC):
    """Decides how many workers each (re)start asks for, and when an elastic group that runs
    below its maximum grows back. Subclass it (or :class:`DefaultScalingPolicy`).

    :meth:`placement_tries` is called at every (re)start of a group: the sizes to try in turn,
    each between ``ScalingConfig.min_workers`` and ``max_workers``, and how long each may wait
    for the cluster; the group starts with the first that fits, and the run fails with
    ``PlacementTimeoutError`` when none does. :meth:`growth_hold_s` is called, while a group
    trains below its maximum, before each look for room for the rest: the seconds after the last
    growth (or, before any, after the run started training) that the next must wait (0: grow as
    soon as the room is there; ``float("inf")``: never grow)."""

    @abc.abstractmethod
    def placement_tries(self, scaling: "ScalingConfig") -> Sequence[PlacementTry]:
        """The sizes to place in turn, largest first as a rule, each with its wait."""

    def growth_hold_s(self, grown_at: Sequence[float], now: float) -> float:
        """``grown_at``: when each earlier growth of this run was asked for, on the clock ``now``
        is read from (seconds, monotonic)."""
        return 0.0


class DefaultScalingPolicy(ScalingPolicy):
    """raytf's policy: a fixed group asks for its size for ``placement_timeout_s``; an elastic one,
    ``num_workers=(min, max)``, for ``max`` for ``resize_timeout_s`` (a lost node's capacity may
    come back, or the autoscaler replace it), then for each size between for ``shrink_try_s``, and
    for ``min`` for ``placement_timeout_s``. Growth is damped against a node that comes and goes:
    a growth within ``flap_window_s`` of an earlier one waits ``flap_hold_s`` after it, doubled for
    each further growth in the window, at most ``flap_window_s``."""

    def __init__(self, shrink_try_s: float = 5.0, flap_window_s: float = 600.0, flap_hold_s: float = 30.0):
        from raytf.errors import ConfigError

        for name, value in (
            ("shrink_try_s", shrink_try_s),
            ("flap_window_s", flap_window_s),
            ("flap_hold_s", flap_hold_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == math.inf:
                raise ConfigError(f"DefaultScalingPolicy.{name} must be a number of seconds > 0, got {value!r}")
        self.shrink_try_s = float(shrink_try_s)
        self.flap_window_s = float(flap_window_s)
        self.flap_hold_s = float(flap_hold_s)

    def placement_tries(self, scaling: "ScalingConfig") -> Sequence[PlacementTry]:
        low, high = scaling.min_workers, scaling.max_workers
        if low == high:
            return [PlacementTry(high, scaling.placement_timeout_s)]
        tries = [PlacementTry(high, scaling.resize_timeout_s)]
        tries += [PlacementTry(workers, self.shrink_try_s) for workers in range(high - 1, low, -1)]
        return tries + [PlacementTry(low, scaling.placement_timeout_s)]

    def growth_hold_s(self, grown_at: Sequence[float], now: float) -> float:
        recent = [t for t in grown_at if now - t < self.flap_window_s]
        return min(self.flap_hold_s * 2 ** (len(recent) - 1), self.flap_window_s) if recent else 0.0

    def __repr__(self) -> str:
        return (
            f"DefaultScalingPolicy(shrink_try_s={self.shrink_try_s:g}, flap_window_s={self.flap_window_s:g}, "
            f"flap_hold_s={self.flap_hold_s:g})"
        )

"""How many workers each attempt asks for, and for how long: the elastic policy. Pure: no Ray.

A fixed group asks for its size for ``placement_timeout_s``. An elastic group,
``num_workers=(min, max)``, asks for ``max`` for ``resize_timeout_s`` (a lost
node's capacity may come back, or the autoscaler replace it); then for each
smaller size down to ``min`` in turn, briefly, and for ``min`` as long as a
fixed group would wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

SHRINK_TRY_S = 5.0  # how long each size between max and min gets to be placed


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
    shrink_try_s: float = SHRINK_TRY_S
    config: str = "ScalingConfig"  # the class whose settings these are, as messages name them

    def tries(self) -> list[Try]:
        """The sizes in the order to try them: a fixed group its size for placement_timeout_s; an
        elastic one max for resize_timeout_s, each size between for shrink_try_s, min for
        placement_timeout_s."""
        placement = f"{self.config}.placement_timeout_s"
        if self.min_workers == self.max_workers:
            return [Try(self.max_workers, self.placement_timeout_s, placement)]
        tries = [Try(self.max_workers, self.resize_timeout_s, f"{self.config}.resize_timeout_s")]
        for workers in range(self.max_workers - 1, self.min_workers, -1):
            tries.append(Try(workers, self.shrink_try_s, "raytf's wait at each size between num_workers' max and min"))
        tries.append(Try(self.min_workers, self.placement_timeout_s, placement))
        return tries

    def shrunk(self, workers: int) -> Optional[str]:
        """What to tell the user when the group starts with fewer than ``max`` workers."""
        if workers == self.max_workers:
            return None
        return (
            f"{self.max_workers} workers could not be placed within {self.resize_timeout_s:g} s "
            f"({self.config}.resize_timeout_s); training with {workers}"
        )

"""How many workers each attempt asks for, and for how long: the elastic policy. Pure: no Ray.

A fixed group asks for its size for ``placement_timeout_s``. An elastic group,
``num_workers=(min, max)``, asks for ``max`` for ``resize_timeout_s`` (a lost
node's capacity may come back, or the autoscaler replace it); then for each
smaller size down to ``min`` in turn, briefly, and for ``min`` as long as a
fixed group would wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

SHRINK_TRY_S = 5.0  # how long each size between max and min gets to be placed


@dataclass(frozen=True)
class ElasticPolicy:
    min_workers: int
    max_workers: int
    placement_timeout_s: Optional[float]
    resize_timeout_s: float
    shrink_try_s: float = SHRINK_TRY_S

    def tries(self) -> list[tuple[int, Optional[float]]]:
        """(workers, how long to wait for them) in the order to try them."""
        if self.min_workers == self.max_workers:
            return [(self.max_workers, self.placement_timeout_s)]
        tries: list[tuple[int, Optional[float]]] = [(self.max_workers, self.resize_timeout_s)]
        for workers in range(self.max_workers - 1, self.min_workers - 1, -1):
            tries.append((workers, self.placement_timeout_s if workers == self.min_workers else self.shrink_try_s))
        return tries

    def shrunk(self, workers: int) -> Optional[str]:
        """What to tell the user when the group starts with fewer than ``max`` workers."""
        if workers == self.max_workers:
            return None
        return (f"{self.max_workers} workers could not be placed within {self.resize_timeout_s:g} s "
                f"(ScalingConfig.resize_timeout_s); training with {workers}")

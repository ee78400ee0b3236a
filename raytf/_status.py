"""What workers tell the driver, as plain data: reports and per-poll status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from raytf.errors import WorkerFailure


@dataclass(frozen=True)
class Report:
    """One ``raytf.report`` call: its metrics and the rank and attempt it came from."""

    rank: int
    seq: int
    metrics: dict[str, Any]
    time: float
    attempt: int = 0
    checkpoint: Optional[dict[str, Any]] = None  # a CheckpointEntry, uploaded and awaiting commit


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer to a poll: reports since the last poll, its phase, its error."""

    rank: int
    phase: str
    reports: tuple[Report, ...] = ()
    failure: Optional[WorkerFailure] = None
    preempt_reason: Optional[str] = None  # set once this worker was asked to stop for a preemption

    @property
    def finished(self) -> bool:
        return self.phase == "finished"


@dataclass(frozen=True)
class GroupStatus:
    """The whole group's answer to a poll.

    ``finished``: every worker's ``train_fn`` returned. ``stopped``: every
    worker is done, some because they stopped for a preemption.
    ``preempting``: a preemption was requested (a node is draining, a worker
    got SIGTERM), with ``preempt_reason``.
    """

    reports: tuple[Report, ...] = ()
    failures: tuple[WorkerFailure, ...] = ()
    finished: bool = False
    phases: dict[int, str] = field(default_factory=dict)
    preempting: bool = False
    preempt_reason: Optional[str] = None
    stopped: bool = False

"""What workers tell the driver, as plain data: reports and per-poll status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from raytf.errors import WorkerFailure

# What the driver adds to every history entry; raytf.report refuses metrics of these names.
HISTORY_KEYS = ("attempt", "driver_start", "report_seq", "checkpoint")


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
class Activity:
    """What a worker's training thread has been doing, continuously, as sampled at each poll.

    ``kind``: ``"tensorflow"`` (inside a TensorFlow call: computing, or
    waiting in a collective for its peers), ``"raytf"`` (raytf's own work:
    reading a shard, uploading a checkpoint, waiting for its commit),
    ``"python"`` (the user's own code, outside TensorFlow) or
    ``"finished"`` (``train_fn`` returned). ``where`` is the innermost line
    of the user's code on the thread's stack.
    """

    kind: str
    seconds: float
    where: str = ""


@dataclass(frozen=True)
class Progress:
    """Where a worker's training is, as far as raytf can see it: ``raytf.keras.fit``,
    ``ReportCallback`` and reported ``epoch`` / ``step`` metrics keep it.

    ``epoch`` is the epoch in progress, ``step`` the steps done in it (of
    ``steps`` per epoch, when known), ``global_step`` the steps done in the
    run, ``global_batch`` the rows one step trains on across all workers.
    """

    epoch: Optional[int] = None
    epochs: Optional[int] = None
    step: Optional[int] = None
    steps: Optional[int] = None
    global_step: Optional[int] = None
    global_batch: Optional[int] = None


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's answer to a poll: reports since the last poll, its phase, its error."""

    rank: int
    phase: str
    reports: tuple[Report, ...] = ()
    failure: Optional[WorkerFailure] = None
    preempt_reason: Optional[str] = None  # set once this worker was asked to stop for a preemption
    activity: Optional[Activity] = None
    progress: Optional[Progress] = None

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
    progress: Optional[Progress] = None  # rank 0's, as last heard

"""The exceptions raytf raises.

One small tree under :class:`RaytfError`. Every class keeps its constructor
arguments in ``args`` so instances survive pickling across Ray actors.
"""

from __future__ import annotations

from dataclasses import dataclass


class RaytfError(Exception):
    """Base class of every error raytf raises."""


class ConfigError(RaytfError, ValueError):
    """A setting is invalid; the message names it, the value received and the fix."""


class PlacementTimeoutError(RaytfError):
    """The worker group's placement group could not be placed in time."""


class WorkerStartError(RaytfError):
    """A worker actor did not come up (import error, died while starting)."""


class RunInUseError(RaytfError):
    """Another driver holds the run's lease, or took the run over from this driver."""


@dataclass(frozen=True)
class WorkerFailure:
    """What went wrong on one rank, as plain data that crosses the actor boundary.

    ``kind`` is one of:

    - ``"exception"``: ``train_fn`` raised;
    - ``"collective"``: a TensorFlow collective failed because a peer did not
      answer (Unavailable, DeadlineExceeded, Cancelled, Aborted): the loss of a
      peer seen from this side;
    - ``"died"``: the worker process or its node went away;
    - ``"unresponsive"``: it stopped answering the driver;
    - ``"not_started"``: it never joined the group (start timeout);
    - ``"returned_early"``: its ``train_fn`` returned while its peers waited
      for it in a collective;
    - ``"stalled"``: it sat in its own code, outside TensorFlow, while its
      peers waited for it in a collective (``FailureConfig.hang_timeout_s``);
    - ``"preempted"``: its node was drained or it got SIGTERM; not a failure,
      and not counted against ``max_failures``.

    ``time`` is when the worker caught the error, or when the driver noticed.
    """

    rank: int
    kind: str
    error_type: str
    message: str
    traceback: str
    time: float
    node_ip: str = ""

    def describe(self) -> str:
        where = (f"rank {self.rank}" if self.rank >= 0 else "a worker") + (
            f" on {self.node_ip}" if self.node_ip else ""
        )
        if self.kind == "preempted" and self.rank < 0:
            return f"preempted: {self.message}"
        if self.kind not in ("exception", "collective"):
            return f"{where}: worker {self.kind.replace('_', ' ')}: {self.message}"
        return f"{where}: {self.error_type}: {self.message}"


class TrainingFailedError(RaytfError):
    """Training stopped because a worker failed and no retry was left or allowed.

    ``failure`` is the root cause (the rank that failed first, or died);
    ``attempts`` lists the cause of every attempt's end, oldest first.
    """

    def __init__(self, failure: WorkerFailure, attempts: tuple[WorkerFailure, ...] = ()):
        self.failure = failure
        self.attempts = tuple(attempts) or (failure,)
        super().__init__(failure, self.attempts)

    @property
    def rank(self) -> int:
        return self.failure.rank

    @property
    def worker_traceback(self) -> str:
        return self.failure.traceback

    def __str__(self) -> str:
        lines = [f"Training failed on {self.failure.describe()}"]
        if len(self.attempts) > 1:
            lines.append(f"{len(self.attempts)} attempts, each ended by:")
            lines += [f"  attempt {i}: {f.describe()}" for i, f in enumerate(self.attempts)]
        if self.failure.traceback:
            lines.append(f"Traceback from rank {self.failure.rank}:")
            lines.append(self.failure.traceback.rstrip())
        return "\n".join(lines)

"""The exceptions raytf raises.

One small tree under :class:`RaytfError`. Every class keeps its constructor
arguments in ``args`` so instances survive pickling across Ray actors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional


class RaytfError(Exception):
    """Base class of every error raytf raises."""


class CheckpointError(RaytfError):
    """No usable checkpoint where one was expected, or a checkpoint that cannot be stored as given."""


class DatasetShardError(RaytfError, ValueError):
    """A dataset shard was asked for with a setting that does not fit its data."""


class ConfigError(RaytfError, ValueError, TypeError):
    """A setting or argument is invalid; the message names it, the value received and the fix.
    A ValueError and a TypeError too, as Python's own checks of an argument raise."""


class DataError(RaytfError, ValueError):
    """A data file or record cannot be read as asked: truncated, compressed, or not matching the
    feature spec, the columns asked for, or the other files of the source; the message names the file."""


class PlacementTimeoutError(RaytfError):
    """The worker group's placement group could not be placed in time."""


class WorkerStartError(RaytfError):
    """A worker actor did not come up (import error, died while starting)."""


class StorageError(RaytfError, OSError):
    """The run's storage refused a write (read-only, full, unreachable); the message names the path
    and the cause. An ``OSError`` too, for code that catches those."""


class RunInUseError(RaytfError):
    """Another driver holds the run's lease, or took the run over from this driver."""


class FailureKind(str, enum.Enum):
    """What ended a worker's part in an attempt. A str, so ``kind == "died"`` reads as it says."""

    EXCEPTION = "exception"  # train_fn raised
    # A TensorFlow collective failed because a peer did not answer (Unavailable,
    # DeadlineExceeded, Cancelled, Aborted): the loss of a peer seen from this side.
    COLLECTIVE = "collective"
    DIED = "died"  # the worker process or its node went away
    UNRESPONSIVE = "unresponsive"  # it stopped answering the driver
    NOT_STARTED = "not_started"  # it never joined the group (start timeout)
    RETURNED_EARLY = "returned_early"  # train_fn returned while its peers waited for it in a collective
    # It sat in its own code while its peers waited for it, or (parameter servers) the chief's
    # coordinator was held without end: reconnecting, or no scheduled step ending (hang_timeout_s).
    STALLED = "stalled"
    PREEMPTED = "preempted"  # its node was drained or it got SIGTERM: not counted against max_failures
    # An elastic group (ScalingConfig.num_workers=(min, max)) below max found room for the rest and
    # stopped to grow: counted against neither max_failures nor max_preemptions.
    RESIZED = "resized"
    # A launched script could not bind the port raytf held for it (another process took it in the
    # moment between): retried with new ports, not counted against max_failures.
    PORT_TAKEN = "port_taken"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class WorkerFailure:
    """What went wrong on one rank, as plain data that crosses the actor boundary.

    ``kind`` is a :class:`FailureKind`. ``time`` is when the worker caught the
    error, or when the driver noticed. ``exit_code``: a launched script's exit status.
    """

    rank: int
    kind: FailureKind
    error_type: str
    message: str
    traceback: str
    time: float
    node_ip: str = ""
    exit_code: Optional[int] = None
    task: str = ""  # "worker 1", "ps 0", ... in a parameter-server group, where ranks are not the roles

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FailureKind(self.kind))  # a plain string from older code reads the same

    def describe(self) -> str:
        where = (self.task or (f"rank {self.rank}" if self.rank >= 0 else "a worker")) + (
            f" on {self.node_ip}" if self.node_ip else ""
        )
        if self.kind == FailureKind.PREEMPTED and self.rank < 0:
            return f"preempted: {self.message}"
        if self.kind not in (FailureKind.EXCEPTION, FailureKind.COLLECTIVE):
            return f"{where}: worker {self.kind.value.replace('_', ' ')}: {self.message}"
        return f"{where}: {self.error_type}: {self.message}"


class TrainingFailedError(RaytfError):
    """Training stopped because a worker failed and no retry was left or allowed.

    ``failure`` is the root cause (the rank that failed first, or died);
    ``attempts`` lists the cause of every attempt's end, oldest first; ``reason`` is why the
    failure policy did not retry it, where it said (raytf's default names the setting:
    ``FailureConfig.max_failures=1 used up``).
    """

    def __init__(self, failure: WorkerFailure, attempts: tuple[WorkerFailure, ...] = (), reason: str = ""):
        self.failure = failure
        self.attempts = tuple(attempts) or (failure,)
        self.reason = reason  # why the failure policy did not retry it, where it said
        super().__init__(failure, self.attempts, reason)

    @property
    def rank(self) -> int:
        return self.failure.rank

    @property
    def worker_traceback(self) -> str:
        return self.failure.traceback

    def __str__(self) -> str:
        lines = [f"Training failed on {self.failure.describe()}"]
        if self.reason:
            lines.append(f"Not retried: {self.reason}")
        if self.failure.kind == FailureKind.PREEMPTED:
            lines.append(
                "Preemptions are retried up to FailureConfig.max_preemptions times (default 100); "
                "this one was past it. Raise it, or -1 for no limit"
            )
        if len(self.attempts) > 1:
            lines.append(f"{len(self.attempts)} attempts, each ended by:")
            lines += [f"  attempt {i}: {f.describe()}" for i, f in enumerate(self.attempts)]
        if self.failure.traceback:
            lines.append(f"Traceback from {self.failure.task or f'rank {self.failure.rank}'}:")
            lines.append(self.failure.traceback.rstrip())
        return "\n".join(lines)


class HookError(RaytfError):
    """A TensorFlow, Keras or tf-keras internal that a raytf feature stands on is not in the
    installed version; the message names it, the versions, and the option that turns it off."""

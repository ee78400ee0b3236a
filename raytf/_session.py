"""The worker-side API that ``train_fn`` calls: context, strategy, report.

One session per worker actor process, installed by the actor before
``train_fn`` starts. Calling these functions anywhere else is an error that
says so, rather than a silent no-op.
"""

from __future__ import annotations

import numbers
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from raytf._status import Report
from raytf.errors import RaytfError


@dataclass(frozen=True)
class TrainContext:
    """Who this worker is. Attribute and ``get_*`` spellings both work (Ray Train uses the latter)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    attempt: int
    run_name: str
    run_path: str
    tf_config: str

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.run_name

    @property
    def is_chief(self) -> bool:
        return self.world_rank == 0


class WorkerSession:
    """The state behind the public functions in one worker process."""

    def __init__(self, context: TrainContext, strategy: Any, sink: Callable[[Report], None]):
        self.context = context
        self.strategy = strategy
        self._sink = sink
        self._seq = 0
        self._lock = threading.Lock()

    def report(self, metrics: dict[str, Any]) -> None:
        if not isinstance(metrics, dict):
            raise TypeError(f"raytf.report(metrics): metrics must be a dict, got {type(metrics).__name__}")
        clean = {}
        for key, value in metrics.items():
            if not isinstance(key, str):
                raise TypeError(f"raytf.report(metrics): metric names must be str, got {key!r}")
            clean[key] = to_plain(value, key)
        with self._lock:
            report = Report(
                rank=self.context.world_rank,
                seq=self._seq,
                metrics=clean,
                time=time.time(),
                attempt=self.context.attempt,
            )
            self._seq += 1
        self._sink(report)


def to_plain(value: Any, name: str) -> Any:
    """A metric as JSON-friendly Python: tensors and NumPy values become numbers and lists."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if hasattr(value, "numpy") and callable(value.numpy):  # tf.Tensor, tf.Variable
        return to_plain(value.numpy(), name)
    if hasattr(value, "tolist") and callable(value.tolist):  # NumPy scalars and arrays
        return to_plain(value.tolist(), name)
    if isinstance(value, (list, tuple)):
        return [to_plain(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): to_plain(v, f"{name}.{k}") for k, v in value.items()}
    raise TypeError(
        f"raytf.report(metrics): metric {name!r} is a {type(value).__name__}; "
        "report numbers, strings, tensors or lists of them"
    )


_session: Optional[WorkerSession] = None


def install(session: Optional[WorkerSession]) -> None:
    global _session
    _session = session


def _current(function: str) -> WorkerSession:
    if _session is None:
        raise RaytfError(
            f"raytf.{function}() works only inside the train_fn that raytf.Trainer runs on its workers"
        )
    return _session


def get_context() -> TrainContext:
    """This worker's ranks, world size, attempt number and run."""
    return _current("get_context").context


def strategy() -> Any:
    """This worker group's ``tf.distribute.MultiWorkerMirroredStrategy``, already connected."""
    return _current("strategy").strategy


def report(metrics: dict[str, Any]) -> None:
    """Send metrics to the driver, which logs them and keeps rank 0's as the run's history."""
    _current("report").report(metrics)

"""What ``Trainer.fit()`` returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Result:
    """The outcome of a run.

    ``metrics`` is rank 0's last report, ``history`` every report rank 0 made
    (each with ``attempt`` and ``report_seq`` added), ``path`` the run's
    directory or URI, ``attempts`` how many times the worker group started,
    ``checkpoint`` the latest committed checkpoint, ``failures`` what ended
    each attempt before the last (a ``WorkerFailure`` each; preemptions have
    kind ``"preempted"``, an elastic group's growth ``"resized"``). ``startup``: where each attempt's start-up went, in
    seconds per phase from ``fit()`` placing the group (``placement``; the
    actors' processes, ``actors``; loading ``train_fn`` and importing
    TensorFlow, ``loading``; the strategy's connection, ``connect``; until
    rank 0's first step, ``first_step``, or its first report, ``first_report``,
    where the loop tells raytf of no step; and the ``total``), one dict per
    attempt, with ``restored_from`` (``"memory"`` or ``"storage"``) where the
    attempt resumed from a checkpoint (``CheckpointConfig.restore_from_memory``),
    and ``kept_processes``, how many of its workers were the last attempt's
    processes (``FailureConfig.keep_survivors``), on a restart.
    """

    metrics: dict[str, Any]
    history: list[dict[str, Any]] = field(default_factory=list)
    path: str = ""
    attempts: int = 1
    checkpoint: Any = None  # the latest committed raytf.Checkpoint, or None
    failures: list[Any] = field(default_factory=list)
    startup: list[dict[str, Any]] = field(default_factory=list)

    @property
    def metrics_dataframe(self) -> Any:
        """``history`` as a pandas DataFrame (pandas comes with Ray Data)."""
        import pandas as pd

        return pd.DataFrame(self.history)

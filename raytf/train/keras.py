"""``ray.train.tensorflow.keras`` on raytf: ``ReportCheckpointCallback``."""

from __future__ import annotations

from typing import Any, Optional, Union

from raytf.errors import ConfigError
from raytf.keras import ReportCallback

__all__ = ["ReportCheckpointCallback"]


class ReportCheckpointCallback(ReportCallback):
    """Ray Train's callback: each epoch's logs reported with a checkpoint of the model and optimizer.

    ``metrics`` as in Ray Train: a list of log names, or a dict of reported
    name to log name. Reporting at batch ends has no counterpart (it would
    be an all-reduce per batch under the strategy); raytf reports at epoch ends.
    """

    def __init__(
        self,
        checkpoint_on: Union[str, list] = "epoch_end",
        report_metrics_on: Union[str, list] = "epoch_end",
        metrics: Union[str, list, dict, None] = None,
        keras: Any = None,
    ):
        for setting, value in (("checkpoint_on", checkpoint_on), ("report_metrics_on", report_metrics_on)):
            if value not in ("epoch_end", ["epoch_end"]):
                raise ConfigError(
                    f"raytf.train.keras.ReportCheckpointCallback({setting}={value!r}): raytf reports and "
                    "checkpoints at epoch ends; use 'epoch_end' and report within the epoch with raytf.report"
                )
        if isinstance(metrics, str):
            metrics = [metrics]
        self._renamed: Optional[dict[str, str]] = dict(metrics) if isinstance(metrics, dict) else None
        super().__init__(checkpoint=True, metrics=None if isinstance(metrics, dict) else metrics)

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self._renamed:  # {reported name: Keras log name}
            logs = {name: (logs or {})[log] for name, log in self._renamed.items() if log in (logs or {})}
        super().on_epoch_end(epoch, logs)

"""``raytf.launch``: an unmodified TF_CONFIG script on Ray actors.

Scripts written for ``tf.distribute`` (TensorFlow's multi-worker tutorials,
TFJob) read TF_CONFIG and build their own strategy. ``launch`` places N
actors as the Trainer places workers, gives each the script as a subprocess
with its own TF_CONFIG (its port held by the actor until the script starts),
its GPUs, and ``RAYTF_CHECKPOINT_DIR`` / ``RAYTF_RUN_DIR`` in the run's shared
storage, so the script's ``BackupAndRestore`` resumes after a restart. A
rank that dies, or its node, restarts every rank (up to
``FailureConfig.max_failures``); a script that fails stops the run with its
exit status.
"""

from __future__ import annotations

from typing import Optional, Sequence

from raytf._internal.protocol import PayloadKind
from raytf.config import RunConfig, ScalingConfig, TensorflowConfig
from raytf.errors import ConfigError
from raytf.result import Result
from raytf.trainer import Trainer

__all__ = ["Launcher", "launch"]


def _no_train_fn() -> None:
    raise AssertionError("a launched run has no train_fn")


class Launcher(Trainer):
    """A Trainer whose workers run ``command`` instead of a ``train_fn``."""

    payload_kind = PayloadKind.SUBPROCESS

    def __init__(self, command: Sequence[str], *, scaling: Optional[ScalingConfig] = None,
                 run: Optional[RunConfig] = None, tensorflow: Optional[TensorflowConfig] = None):
        if isinstance(command, str) or not command or not all(isinstance(w, str) and w for w in command):
            raise ConfigError(
                f"raytf launch: the command must be a non-empty list of words (after --), got {command!r}"
            )
        super().__init__(_no_train_fn, scaling=scaling, run=run, tensorflow=tensorflow)
        self.command = list(command)

    def _payload(self) -> bytes:
        from ray import cloudpickle

        return cloudpickle.dumps(self.command)


def launch(command: Sequence[str], *, scaling: Optional[ScalingConfig] = None, run: Optional[RunConfig] = None,
           tensorflow: Optional[TensorflowConfig] = None) -> Result:
    """Run ``command`` on ``scaling.num_workers`` actors, each with its TF_CONFIG; raise
    TrainingFailedError (its failure's ``exit_code`` the script's status) when it fails."""
    return Launcher(command, scaling=scaling, run=run, tensorflow=tensorflow).fit()

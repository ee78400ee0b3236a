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

import dataclasses
from typing import Optional, Sequence

from raytf._internal.protocol import PayloadKind, UserCode
from raytf.config import RunConfig, ScalingConfig, TensorflowConfig
from raytf.errors import ConfigError
from raytf.parameter_server import ParameterServerScaling, ParameterServerTrainer
from raytf.result import Result
from raytf.trainer import Trainer

__all__ = ["Launcher", "ParameterServerLauncher", "launch"]


def _no_train_fn() -> None:
    raise AssertionError("a launched run has no train_fn")


def _check_command(command: Sequence[str]) -> None:
    if isinstance(command, str) or not command or not all(isinstance(w, str) and w for w in command):
        raise ConfigError(f"raytf launch: the command must be a non-empty list of words (after --), got {command!r}")


class Launcher(Trainer):
    """A Trainer whose workers run ``command`` instead of a ``train_fn``."""

    _payload_kind = PayloadKind.SUBPROCESS
    _warm_standby_works = False

    def __init__(
        self,
        command: Sequence[str],
        *,
        scaling: Optional[ScalingConfig] = None,
        run: Optional[RunConfig] = None,
        tensorflow: Optional[TensorflowConfig] = None,
    ):
        _check_command(command)
        super().__init__(_no_train_fn, scaling=scaling, run=run, tensorflow=tensorflow)
        if self.tensorflow.gradient_compression is not None:
            raise ConfigError(
                "TensorflowConfig.gradient_compression applies to a train_fn's optimizers; a launched script "
                "builds its own and all-reduces in its own process: leave it unset for raytf.launch"
            )
        self.command = list(command)

    def _payload(self) -> bytes:
        from ray import cloudpickle

        return cloudpickle.dumps(UserCode(command=tuple(self.command)))


class ParameterServerLauncher(ParameterServerTrainer):
    """Every task of a parameter-server cluster (chief, workers, ps, evaluator) runs ``command``,
    as TFJob's replica specs do: the script reads its role from TF_CONFIG. A lost worker is
    replaced in place at its old address (the script's coordinator reconnects to it); the run
    ends when the chief's script does, and the evaluator's is stopped then."""

    _role_payloads = {role: PayloadKind.SUBPROCESS for role in ("chief", "worker", "ps", "evaluator")}
    _finishing_roles = ("chief",)

    def __init__(
        self,
        command: Sequence[str],
        *,
        scaling: Optional[ParameterServerScaling] = None,
        run: Optional[RunConfig] = None,
        tensorflow: Optional[TensorflowConfig] = None,
    ):
        _check_command(command)
        scaling = scaling or ParameterServerScaling()
        # The script evaluates in its evaluator task: there is no evaluate_fn to ask for.
        super().__init__(
            _no_train_fn, scaling=dataclasses.replace(scaling, num_evaluators=0), run=run, tensorflow=tensorflow
        )
        self.scaling = scaling
        self.command = list(command)

    def _payload(self) -> bytes:
        from ray import cloudpickle

        return cloudpickle.dumps(UserCode(command=tuple(self.command)))


def launch(
    command: Sequence[str],
    *,
    scaling: Optional[ScalingConfig | ParameterServerScaling] = None,
    run: Optional[RunConfig] = None,
    tensorflow: Optional[TensorflowConfig] = None,
) -> Result:
    """Run ``command`` on ``scaling.num_workers`` actors, each with its TF_CONFIG (with a
    :class:`ParameterServerScaling`, on every task of a parameter-server cluster); raise
    TrainingFailedError (its failure's ``exit_code`` the script's status) when it fails."""
    if isinstance(scaling, ParameterServerScaling):
        return ParameterServerLauncher(command, scaling=scaling, run=run, tensorflow=tensorflow).fit()
    return Launcher(command, scaling=scaling, run=run, tensorflow=tensorflow).fit()

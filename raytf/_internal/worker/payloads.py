"""What an actor runs, one class per :class:`~raytf._internal.protocol.PayloadKind`.

The actor (actor.py) holds the port, answers polls and keeps the phase; a
payload does the role's work in the actor's worker thread and moves the phase
forward through the :class:`Host` it is given. Today's payload runs
``train_fn`` under MultiWorkerMirroredStrategy; a TensorFlow server that waits
(parameter servers) and a subprocess that reads TF_CONFIG are further payloads.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import asdict
from typing import Any, Callable, Optional, Protocol

from ray import cloudpickle

from raytf._internal.protocol import Phase, PayloadKind, Report, RunSpec, WorkerSpec
from raytf._internal.worker import session as _session
from raytf._internal.worker import strategy as _strategy
from raytf._internal.worker import tensorflow as _tensorflow
from raytf._internal.worker.session import WorkerSession
from raytf.session import TrainContext

logger = logging.getLogger(__name__)


class Host(Protocol):
    """What a payload may ask of its actor."""

    node_ip: str

    def set_phase(self, phase: Phase) -> None: ...

    def wait_for_go(self) -> None: ...  # every peer is ready

    def release_port(self) -> None: ...  # just before TensorFlow's server binds it

    def sink(self, report: Report) -> None: ...

    def preempt_requested(self) -> bool: ...


class TrainFnPayload:
    """``train_fn(config)`` in the worker thread, under this group's MultiWorkerMirroredStrategy."""

    def __init__(self) -> None:
        self.session: Optional[WorkerSession] = None

    @property
    def preempted(self) -> bool:
        return self.session is not None and self.session.preempted

    def run(self, run: RunSpec, spec: WorkerSpec, host: Host) -> None:
        if "tensorflow" in sys.modules:
            logger.warning(
                "TensorFlow was imported in this worker before raytf set TF_CONFIG and the thread "
                "settings; import it inside train_fn, not at the top of a module the worker loads first"
            )
        os.environ.update(_tensorflow.worker_environment(run, spec))
        _tensorflow.check_storage_visible(run, host.node_ip)
        # Loading the payload may import the user's modules, and with them TensorFlow.
        train_fn, config = cloudpickle.loads(run.payload)
        _tensorflow.configure_tensorflow(run)
        _tensorflow.configure_keras(run)
        host.set_phase(Phase.READY)
        host.wait_for_go()
        host.set_phase(Phase.CONNECTING)
        host.release_port()
        strategy = _strategy.make_strategy(run.communication, run.collective_timeout_s)
        _strategy.install(strategy)
        context = TrainContext(**asdict(spec.rank), attempt=spec.attempt, run_name=run.run_name,
                               run_path=run.run_path, tf_config=spec.tf_config)
        self.session = WorkerSession(
            context, strategy, host.sink, spec.datasets, spec.resume, run.storage,
            save_every=run.save_every, lease_token=run.lease_token, split=run.split,
            preempt_requested=host.preempt_requested,
        )
        _session.install(self.session)
        host.set_phase(Phase.TRAINING)
        _tensorflow.call_train_fn(train_fn, config)


PAYLOADS: dict[PayloadKind, Callable[[], Any]] = {PayloadKind.TRAIN_FN: TrainFnPayload}

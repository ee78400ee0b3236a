"""The worker actor: holds a port, answers the driver's polls, runs its role's payload in a thread.

The driver polls it; it never calls the driver. What it runs (``train_fn``
under a strategy, today) is a payload (payloads.py); TensorFlow's set-up is in
tensorflow.py. Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import ray

from raytf._internal.background import Background
from raytf._internal.checkpoint import memory
from raytf._internal.data import diagnose
from raytf._internal.protocol import PayloadKind, Phase, Report, RunSpec, WorkerAddress, WorkerSpec, WorkerStatus
from raytf._internal.worker import logs as _logs
from raytf._internal.worker.activity import ActivityTracker
from raytf._internal.worker.loading import on_a_deep_stack
from raytf._internal.worker.payloads import ScriptFailed, SubprocessPayload, TrainFnPayload
from raytf._internal.worker.ps_payloads import ChiefPayload, EvaluatorPayload, ServerPayload
from raytf._internal.worker.tensorflow import adopt_gpus, failure_kind, reserve_port
from raytf.errors import WorkerFailure

logger = logging.getLogger(__name__)

# What an actor runs for each kind of role (protocol.RoleSpec.payload).
PAYLOADS: dict[PayloadKind, Callable[[], Any]] = {
    PayloadKind.TRAIN_FN: TrainFnPayload,
    PayloadKind.SUBPROCESS: SubprocessPayload,
    PayloadKind.CHIEF: ChiefPayload,
    PayloadKind.SERVER: ServerPayload,
    PayloadKind.EVALUATOR: EvaluatorPayload,
}


class TrainWorker:
    """One actor of the worker group (a training worker, today). The driver polls it; it never
    calls the driver."""

    def __init__(self) -> None:
        self._reuses = 0  # attempts this process trained after its first (worker/recycle.py)
        self._output = _logs.OutputFilter()
        self._output.install()  # before TensorFlow is imported: its first lines are the noisiest
        self._fresh()
        self._catch_sigterm()

    def _fresh(self) -> None:
        """This actor's state for one attempt: as new, or after ``recycle``."""
        self._sock: Optional[socket.socket] = None
        self._address: Optional[WorkerAddress] = None
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._reports: list[Report] = []
        self._phase = Phase.CREATED
        self._failure: Optional[WorkerFailure] = None
        self._rank = -1
        self._payload: Any = None
        self._preempt_reason: Optional[str] = None
        self._halted = False  # the run is stopping (halt): report raises
        self._go = threading.Event()  # set by connect(): every peer is ready to build the strategy
        self._go_message: Any = None
        self._task = ""  # "ps 0", "worker 1", ... in a parameter-server group; "" in a synchronous one
        self.warmed = False  # warm() ran: TensorFlow and train_fn are loaded, before any rank
        self._activity = ActivityTracker()

    def _catch_sigterm(self) -> None:
        """A node about to go away (a cloud preemption, `ray stop`) sends its
        processes SIGTERM: ask train_fn to save and stop rather than dying.

        Handlers can only be set from the main thread, where actor methods run.
        TensorFlow's coordination service puts its own C-level SIGTERM handler
        in place when the strategy is created (for its PreemptionCheckpointHandler),
        which silently replaces this one, so every poll puts it back: one
        sigaction call.
        """
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self.preempt("the worker process got SIGTERM")

    def connect(self, message: Any = None) -> None:
        """Every worker is ready: build the strategy now (``message``: what the payload needs for it,
        such as the parameter-server chief's shard manifests).

        Creating MultiWorkerMirroredStrategy blocks until every peer's server
        is up, and holds the GIL while it waits (this actor answers nothing
        meanwhile). The driver therefore releases all workers together once
        each says it is ready, so that wait is short, and a worker that never
        gets ready is named as such instead of hiding behind peers that wait
        for it.
        """
        self._go_message = message
        self._go.set()

    def preempt(self, reason: str) -> None:
        """Ask ``train_fn`` to checkpoint and stop: ``raytf.preemption_requested()`` turns True."""
        if self._preempt_reason is None:
            self._preempt_reason = reason

    def reserve(self, port: int = 0, gpu_ids: Optional[Sequence[str]] = None) -> WorkerAddress:
        """Reserve a port for TensorFlow's server and say where this worker is. ``port``: the one
        a replaced actor held, taken again when it is free, so the cluster's address list holds.
        ``gpu_ids``: a warm standby's, the GPUs of the bundle it is handed (see adopt_gpus)."""
        import ray

        if gpu_ids is not None:
            adopt_gpus(gpu_ids)
        if self._address is None:
            try:
                self._sock = reserve_port(port)
            except OSError:
                self._sock = reserve_port()
            assigned = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
            self._address = WorkerAddress(
                node_id=ray.get_runtime_context().get_node_id(),
                node_ip=ray.util.get_node_ip_address(),
                port=self._sock.getsockname()[1],
                gpu_ids=tuple(str(g) for g in (gpu_ids if gpu_ids is not None else assigned)),
                pid=os.getpid(),
            )
        return self._address

    def warm(self, run: RunSpec) -> None:
        """As a standby (FailureConfig.warm_standby): do now what a start would do first, so that a
        restart handed this actor skips it. Sets the run's environment (all of it but TF_CONFIG,
        which comes with a rank, and is read only when the strategy is built), imports TensorFlow
        (which initializes no device until used), Keras and Ray Data (which a rank's dataset
        iterators need, unpickled with its start), and loads ``train_fn`` and its modules.

        All of it in a thread of the lowest CPU priority (Linux; a thread's own nice value): the
        standby takes only the CPU the training workers beside it leave idle, and none of its
        priority outlives the load (TensorFlow makes its thread pools later, from the thread
        that trains)."""
        import os

        from raytf._internal.worker.loading import paused_collector
        from raytf._internal.worker.tensorflow import load_keras, run_environment

        def load() -> None:
            with paused_collector():
                import ray.data  # noqa: F401

                from ray import cloudpickle

                cloudpickle.loads(run.payload)
                load_keras(run)  # TensorFlow, and the Keras that tf.keras is here

        os.environ.update(run_environment(run))
        self._output.level, self._output.use_gpu = run.tensorflow.log_level, run.tensorflow.use_gpu
        in_background(on_a_deep_stack(load), "raytf-warm")
        self.warmed = True

    def recycle(self, timeout_s: float) -> Optional[str]:
        """The attempt ended and the driver keeps this process for the next one (worker/recycle.py):
        stop this attempt's ``train_fn``, undo what it set up, and wait, as a warm standby waits,
        for ``reserve`` and ``start``; a parameter-server worker's server keeps serving. None once
        done; else why it cannot be kept (the driver then kills it)."""
        from raytf._internal.worker import recycle

        if getattr(self._payload, "serves", False):
            # A parameter-server worker: its server goes on, as the same task, serving the next
            # attempt's chief, whose start and connect then find it running (driver/survivors.py).
            return None if self._phase == Phase.TRAINING else f"its server is not serving ({self._phase.value})"
        if self._reuses >= recycle.MAX_REUSES:
            return f"it trained {self._reuses + 1} attempts already"
        self._halted = True  # raytf.report raises from now on
        self._go.set()  # a worker still at the start barrier goes no further
        why = recycle.stop(self._payload, self._thread, timeout_s) or recycle.reset()
        if why is None:
            self.release_port()
            self._fresh()
            self.warmed = True
            self._reuses += 1
        return why

    def start(self, run: RunSpec, spec: WorkerSpec, payload: PayloadKind) -> None:
        """Start the role's payload in a thread and return at once; the driver polls for progress."""
        if self._thread is not None:
            return  # the driver's call again, after Ray said this actor was briefly unavailable
        self._rank = spec.rank.world_rank
        self._task = str(spec.task) if spec.task is not None else ""
        self._output.level, self._output.use_gpu = run.tensorflow.log_level, run.tensorflow.use_gpu
        _logs.name_in_log_prefix(f"raytf {self._task}" if self._task else f"raytf rank {self._rank}")
        self._payload = PAYLOADS[payload]()
        context = ray.get_runtime_context()
        owner = spec.placement_group or context.get_placement_group_id() or ""
        memory.configure(context.gcs_address, owner, _live_placement_groups)
        self._phase = Phase.STARTING
        self._thread = threading.Thread(
            target=on_a_deep_stack(self._run), args=(run, spec), name="raytf-train", daemon=True
        )
        self._thread.start()

    def poll(self) -> WorkerStatus:
        activity = held = None
        if self._phase == Phase.TRAINING:
            self._catch_sigterm()
            activity = self._activity.sample(self._thread.ident if self._thread else None)
            coordinator_held = getattr(self._payload, "coordinator_held", None)  # a parameter-server chief's
            held = coordinator_held() if coordinator_held is not None else None
        elif self._phase == Phase.FINISHED:
            activity = self._activity.finished()
        with self._lock:
            reports, self._reports = tuple(self._reports), []
        session = self._session
        return WorkerStatus(
            rank=self._rank,
            phase=self._phase,
            reports=reports,
            failure=self._failure,
            preempt_reason=self._preempt_reason,
            activity=activity,
            progress=session.progress() if session is not None else None,
            coordinator_held=held,
        )

    def shard_read_whole(self, name: str) -> tuple[bool, Any]:
        """For warm restarts: whether this worker read its shard of ``name`` whole, and its columns.
        The driver calls it with two returns, so it reads the flag and leaves the columns in the
        object store, where a restarted rank reads them (data/shard.py, KeptShard)."""
        session = self._session
        arrays = session.shard_read_whole(name) if session is not None else None
        return arrays is not None, arrays

    def acknowledge(self, seq: int, error: Optional[str] = None) -> None:
        session = self._session
        if session is not None:
            session.acknowledge(seq, error)

    # The Host a payload is given (payloads.py).

    @property
    def node_ip(self) -> str:
        return self._address.node_ip if self._address else ""

    def set_phase(self, phase: Phase) -> None:
        self._phase = phase

    def wait_for_go(self) -> Any:
        self._go.wait()
        return self._go_message

    def sink(self, report: Report) -> None:
        with self._lock:
            self._reports.append(report)

    def release_port(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def preempt_requested(self) -> bool:
        return self._preempt_reason is not None

    def halt(self) -> bool:
        """The run is stopping: ``raytf.report`` raises from now on (an upload in flight goes on).
        Whether a checkpoint is on its way to storage: none can set out after this answer
        (session.py, ``uploading``)."""
        self._halted = True
        session = self._session
        return bool(session is not None and session.uploading())

    def halted(self) -> bool:
        return self._halted

    @property
    def _session(self) -> Any:
        """The payload's WorkerSession (a train_fn's); None for a server, a launched script, or before a start."""
        return getattr(self._payload, "session", None)

    # Parameter-server groups (ps_payloads.py): what the driver asks of a chief, a worker, an evaluator.

    def shard_files(self) -> Any:
        """A parameter-server worker's manifest of the shard files it wrote."""
        return getattr(self._payload, "shard_files", None)

    def retarget(self, task_type: str, task_index: int, host_port: str) -> bool:
        """The chief: a replaced task will listen at ``host_port``. False: too late (worker/ps.py)."""
        return self._payload.retarget(task_type, task_index, host_port)

    def finish(self) -> None:
        """The evaluator: training ended; evaluate the last committed checkpoint and stop."""
        self._payload.finish()

    def close(self) -> None:
        """Before the group kills this actor: remove what it keeps on its node."""
        close = getattr(self._payload, "close", None)
        if close is not None:
            close()

    def drop_checkpoint_copies(self, storage: Any) -> None:
        """The run ended: remove its checkpoint copies in this node's memory (checkpoint/memory.py)."""
        if storage is not None:
            memory.drop(storage)

    def _run(self, run: RunSpec, spec: WorkerSpec) -> None:
        try:
            self._payload.run(run, spec, self)
            self._phase = self._ended()
        except SystemExit as exit_:
            if exit_.code in (None, 0):
                self._phase = self._ended()
            else:
                self._fail(spec, exit_)
        except BaseException as error:  # noqa: BLE001 - every error goes to the driver as data
            self._fail(spec, error)

    def _ended(self) -> Phase:
        """PREEMPTED when the payload returned because raytf.preemption_requested() said so."""
        return Phase.PREEMPTED if getattr(self._payload, "preempted", False) else Phase.FINISHED

    def _fail(self, spec: WorkerSpec, error: BaseException) -> None:
        message = str(error)
        try:  # a TFRecord read that failed: which file and record (TensorFlow's message names neither)
            where = diagnose.explain(error, getattr(self._session, "cursors", {}) or {})
        except Exception as problem:  # noqa: BLE001 - the failure itself is what matters
            where = None
            logger.warning("raytf: could not look for the record that failed: %s", problem)
        if where:
            message += f"\n(raytf: the failing record is in {where})"
        self._failure = WorkerFailure(
            rank=spec.rank.world_rank,
            kind=error.kind if isinstance(error, ScriptFailed) else failure_kind(error),
            exit_code=error.exit_code if isinstance(error, ScriptFailed) else None,
            error_type=type(error).__qualname__,
            message=message,
            traceback="".join(traceback.format_exception(error)),
            time=time.time(),
            node_ip=self.node_ip,
            task=self._task,
        )
        self._phase = Phase.FAILED


def _live_placement_groups() -> set[str]:
    """The ids of the cluster's placement groups that are not removed (checkpoint/memory.py's sweep)."""
    table = ray.util.placement_group_table()
    return {pg_id for pg_id, info in table.items() if info.get("state") != "REMOVED"}


def in_background(work: Any, name: str) -> None:
    """Run ``work`` to its end in a thread of the lowest CPU priority (where the OS gives threads
    their own: Linux), raising what it raised."""
    Background(work, name, low_priority=True).result()

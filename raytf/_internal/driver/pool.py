"""Worker processes kept between runs: a ``fit()`` starts its CPU workers on the processes the last
``fit()`` of this driver left (``RAYTF_REUSE_WORKERS_S``).

A worker's start is seconds of CPU (its process, Ray's worker, TensorFlow's and Keras's import:
``startup["loading"]``), paid by every run's every rank, whatever the run then trains. A driver that
runs one ``fit()`` after another (a notebook, a sweep in one process, a script that pre-trains then
fine-tunes, a test suite) paid it each time. With ``RAYTF_REUSE_WORKERS_S`` above 0, a run that
ended well leaves its CPU workers recycled (worker/recycle.py, as ``FailureConfig.keep_survivors``
recycles the survivors of an attempt: ``train_fn`` ended, the session and strategy undone, Keras's
session cleared, TensorFlow's eager context new) and parked here, outside any placement group and
holding no resources, for that many seconds. The next run's first attempt hands each bundle a
parked process on the bundle's node (driver/survivors.py) before it starts a new one, and reports
how many it took as ``startup["reused_processes"]``.

A parked process serves only a run whose workers' environment, the one set before TensorFlow is
imported (its thread counts, its Keras, ``TensorflowConfig.worker_env``: worker/tensorflow.py's
``run_environment``), is the same as the run it last trained: the key below. What a process keeps
from run to run is what a kept survivor keeps from attempt to attempt (worker/recycle.py): every
module imported, and what they hold. Off by default: a process parked here holds its memory (a
worker's TensorFlow, about a GiB) until a run takes it or its time is up. GPU workers are never
parked (they hold their GPUs in the placement group, and die with it), nor are the processes of a
run that failed or was stopped.

The pool belongs to the driver's process and its Ray job: the parked actors are the driver's, and
die with it as any actor it owns does; one whose node went away is found dead when handed, and a
new worker starts in its place (actors.reserve).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Parked:
    """A recycled worker process waiting for the next run of this driver."""

    actor: Any
    name: str  # its Ray actor name (raytf:<run>:<attempt>:<bundle>, the run that started it)
    node_id: str
    key: tuple  # the environment it was last started with (environment_key)
    since: float  # time.monotonic() when it was parked


def environment_key(environment: Mapping[str, str]) -> tuple:
    """What a parked process must share with the run it is handed to: the environment its
    TensorFlow and Keras were imported under (worker/tensorflow.py's run_environment)."""
    return tuple(sorted(environment.items()))


class WorkerPool:
    """The parked processes of one driver and Ray job, each for ``keep_s`` seconds at most."""

    def __init__(
        self,
        job_id: str,
        kill: Callable[[list[Any]], None],
        clock: Callable[[], float] = time.monotonic,
        timer: Optional[Callable[[float, Callable[[], Any]], Any]] = None,
    ):
        self.job_id = job_id
        self._kill = kill
        self._clock = clock
        self._timer = timer if timer is not None else _daemon_timer
        self._lock = threading.Lock()
        self._parked: list[Parked] = []

    def park(self, entries: list[Parked], keep_s: float) -> None:
        """Keep ``entries`` for the next run, for ``keep_s`` seconds; then end them."""
        if not entries:
            return
        with self._lock:
            self._parked.extend(entries)
        self._timer(keep_s, lambda: self.expire(keep_s))

    def take(self, key: tuple, node_id: str) -> Optional[Parked]:
        """A parked process on ``node_id`` started with ``key``'s environment, or None."""
        with self._lock:
            found = next((p for p in self._parked if p.key == key and p.node_id == node_id), None)
            if found is not None:
                self._parked.remove(found)
            return found

    def evict(self, which: Callable[[Parked], bool]) -> int:
        """End the parked processes ``which`` picks (and wait until they are gone); how many."""
        with self._lock:
            gone = [p for p in self._parked if which(p)]
            self._parked = [p for p in self._parked if not which(p)]
        if gone:
            self._kill([p.actor for p in gone])
        return len(gone)

    def expire(self, keep_s: float) -> int:
        """End the processes parked for ``keep_s`` seconds or more."""
        now = self._clock()
        return self.evict(lambda p: now - p.since >= keep_s)

    def names(self) -> set[str]:
        """The parked actors' names."""
        with self._lock:
            return {p.name for p in self._parked}

    def __len__(self) -> int:
        with self._lock:
            return len(self._parked)


def _daemon_timer(delay_s: float, fn: Callable[[], Any]) -> Any:
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - Ray shut down meanwhile: its actors are gone with it
            logger.debug("ending parked worker processes failed", exc_info=True)

    timer = threading.Timer(delay_s, run)
    timer.daemon = True
    timer.start()
    return timer


_pool: Optional[WorkerPool] = None
_pool_lock = threading.Lock()


def driver_pool() -> WorkerPool:
    """This driver's pool, for its current Ray job (a new one after ``ray.shutdown()`` and
    ``ray.init()``: the old job's actors went with it)."""
    global _pool
    import ray

    from raytf._internal.driver.actors import kill_and_wait

    job_id = ray.get_runtime_context().get_job_id()
    with _pool_lock:
        if _pool is None or _pool.job_id != job_id:
            _pool = WorkerPool(job_id, lambda actors: kill_and_wait(actors, "parked worker"))
        return _pool


def free_name(name: str) -> None:
    """End the parked process named ``name``, if any, before a new worker takes that name: a run
    named as the one that started a parked process names its workers alike (raytf:<run>:<attempt>:<bundle>)."""
    with _pool_lock:
        pool = _pool
    if pool is not None:
        pool.evict(lambda parked: parked.name == name)


def parked_names() -> set[str]:
    """The names of the worker actors parked in this driver now (none where no pool was made)."""
    with _pool_lock:
        pool = _pool
    return pool.names() if pool is not None else set()

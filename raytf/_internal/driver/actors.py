"""What every worker group does with its actors through Ray: create one by name, poll a round of
them without waiting on any one, kill them and wait until they are gone."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from raytf._internal import env as _env
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import WorkerStatus
from raytf._internal.worker.actor import TrainWorker
from raytf.errors import ConfigError, WorkerStartError

logger = logging.getLogger(__name__)

_RemoteWorker = ray.remote(TrainWorker)
_POLL_WAIT_S = 0.05  # how long one poll waits for answers before returning what it has
UNAVAILABLE_RETRY_S = 0.5  # between calls to an actor Ray calls briefly unavailable


def new_worker(run_name: str, name: str, **options: Any) -> Any:
    """A worker actor named ``name`` (for the dashboard and ``ray.get_actor``). Names hold the run's
    name, so two runs of one name at once in one driver (one Ray namespace) would clash: that is
    an error naming the fix, not Ray's ActorAlreadyExistsError."""
    from ray.exceptions import ActorAlreadyExistsError

    try:
        return _RemoteWorker.options(name=name, **options).remote()
    except ActorAlreadyExistsError:
        raise ConfigError(
            f"another run named {run_name!r} is training in this driver (its worker actor {name!r} exists "
            "in this Ray namespace): give each run that trains at the same time its own RunConfig.name"
        ) from None


def kill_and_wait(actors: Sequence[Any], what: str) -> None:
    """Kill ``actors`` and wait, up to RAYTF_SHUTDOWN_TIMEOUT_S in all, until Ray knows each gone."""
    for actor in actors:
        ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + _env.get_float(_env.SHUTDOWN_TIMEOUT_S)
    for actor in actors:
        try:
            ray.get(actor.poll.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except RayActorError:
            pass  # gone, as asked
        except GetTimeoutError:
            logger.warning("a killed %s actor is still alive after the shutdown timeout", what)


def call_each(actors: Sequence[Any], method: str, args_of: Callable[[int], tuple], what: str,
              timeout_s: float) -> list:
    """``actors[i].method(*args_of(i))`` on every actor, retried where Ray says an actor is only
    briefly unavailable (a fresh process whose RPC server is not up yet): the methods called this
    way (start, retarget) may safely run twice. Anything else that stops one is a WorkerStartError."""
    deadline = time.monotonic() + timeout_s
    results: list = [None] * len(actors)
    pending = list(range(len(actors)))
    while pending:
        refs = {i: getattr(actors[i], method).remote(*args_of(i)) for i in pending}
        pending = []
        for i, ref in refs.items():
            try:
                results[i] = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            except ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise WorkerStartError(f"a worker actor stayed unavailable: cannot {what}") from None
                pending.append(i)
            except GetTimeoutError:
                raise WorkerStartError(f"worker actors did not {what} within {timeout_s:g} s "
                                       "(FailureConfig.start_timeout_s); check the actors' logs") from None
            except RayActorError as error:
                raise WorkerStartError(f"a worker actor died: cannot {what}: {error}") from None
        if pending:
            time.sleep(UNAVAILABLE_RETRY_S)
    return results


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def poll_round(actors: Sequence[Any], in_flight: dict[int, tuple[Any, float]], watch: GroupWatch,
               answer: Callable[[int, WorkerStatus], WorkerStatus] = lambda index, status: status) -> float:
    """One round of polls over ``actors`` (by index), without waiting on any one of them; returns
    when the round began.

    Each actor has at most one poll in flight (``in_flight``: index -> (ref, sent at)). A poll
    that has not come back is silence, which after ``worker_timeout_s`` makes that worker lost;
    so is one Ray answers with "actor unavailable" (a transient error: the connection to it
    broke, and Ray does not know it dead), which is sent again. A dead actor is a death.
    ``answer`` sees each worker's status before the watch does.
    """
    now = time.monotonic()
    for index, actor in enumerate(actors):
        if index not in in_flight:
            in_flight[index] = (actor.poll.remote(), now)
    refs = [ref for ref, _ in in_flight.values()]
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=_POLL_WAIT_S)[0])
    for index, (ref, sent) in list(in_flight.items()):
        if ref not in ready:
            watch.silent(index, sent)
            continue
        del in_flight[index]
        try:
            status = ray.get(ref)
        except ActorUnavailableError:  # not an answer yet: FailureConfig.worker_timeout_s decides
            in_flight[index] = (actors[index].poll.remote(), sent)
            watch.silent(index, sent)
            continue
        except RayActorError as error:
            watch.died(index, type(error).__name__, _first_line(error))
            continue
        watch.heard(index, answer(index, status))
    return now

"""What a worker group does with actors through Ray: create a worker by name or a poll relay, call
a method on several, kill them and wait until they are gone."""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from raytf._internal import env as _env
from raytf._internal.driver.forkserver import start_options
from raytf._internal.driver.relay import ActorRelay, PollRelay, ThreadRelay
from raytf._internal.protocol import RunSpec
from raytf._internal.worker.actor import TrainWorker
from raytf.errors import ConfigError, WorkerStartError

logger = logging.getLogger(__name__)

_RemoteWorker = ray.remote(TrainWorker)
UNAVAILABLE_RETRY_S = 0.5  # between calls to an actor Ray calls briefly unavailable


def new_worker(run: RunSpec, name: str, **options: Any) -> Any:
    """A worker actor of ``run`` named ``name`` (for the dashboard and ``ray.get_actor``), started
    through its node's fork server where the run's workers do (driver/forkserver.py). Names hold
    the run's name, so two runs of one name at once in one driver (one Ray namespace) would clash:
    that is an error naming the fix, not Ray's ActorAlreadyExistsError (a ValueError before Ray 2.51)."""
    run_name = run.run_name
    try:
        starting = start_options(run, ray.get_runtime_context().runtime_env or {})
        return _RemoteWorker.options(name=name, **starting, **options).remote()
    except ValueError as error:  # ActorAlreadyExistsError subclasses it
        if "already" not in str(error):
            raise
        raise ConfigError(
            f"another run named {run_name!r} is training in this driver (its worker actor {name!r} exists "
            "in this Ray namespace): give each run that trains at the same time its own RunConfig.name"
        ) from None


# Resources Ray hands an actor one by one, by id (a device it makes visible to the process): the
# actor must hold them itself. GPU, and Ray's custom_unit_instance_resources (2.60's list; 2.50's
# is its first five).
_ASSIGNED_BY_ID = frozenset({"GPU", "neuron_cores", "TPU", "NPU", "HPU", "RBLN", "FURIOSA", "TTNPU", "MBLT"})


def floats(bundle: Mapping[str, float]) -> bool:
    """Whether a worker for ``bundle`` can run outside its placement group, pinned to the bundle's
    node while the bundle reserves what it holds: one with no GPU or other device that Ray assigns
    by id, since Ray names an actor its devices only from resources the actor itself holds. CPUs,
    memory and a user's own resources (a node label such as ``{"spot": 1}``) the bundle reserves."""
    return not _ASSIGNED_BY_ID & set(bundle)


def scheduling(bundle: Mapping[str, float], group: Any, index: int, floating_on: Optional[str]) -> dict[str, Any]:
    """Ray's options for a worker of bundle ``index`` of placement group ``group``: it holds the
    bundle's resources inside the group; or, ``floating_on`` a node, it runs outside the group,
    pinned there, and the bundle reserves its CPUs (as a warm standby runs: the process can outlive
    the group, and a restart hands it a bundle of the next group on its node)."""
    if floating_on is not None:
        return dict(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(floating_on, soft=False))
    return dict(
        num_cpus=bundle.get("CPU", 0),
        num_gpus=bundle.get("GPU", 0),
        resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index),
    )


# Groups up to this many members are polled from a thread of the driver (relay.ThreadRelay); larger
# ones through a relay actor, so that the driver's calls per round stay one whatever their size.
IN_DRIVER_MAX = 8


def new_relay(interval_s: float) -> Any:
    """A poll relay actor (relay.py) on the driver's node, holding no resources."""
    node = ray.get_runtime_context().get_node_id()
    return (
        ray.remote(PollRelay)
        .options(num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=True))
        .remote(interval_s)
    )


def relay_for(members: int, interval_s: float) -> "ThreadRelay | ActorRelay":
    """The relay a group of at most ``members`` members polls through."""
    if members <= IN_DRIVER_MAX:
        return ThreadRelay(interval_s)
    return ActorRelay(new_relay(interval_s))


SILENT_END_TIMEOUT_S = 5.0  # how long the tasks that end silent actors' processes get


def kill_and_wait(actors: Sequence[Any], what: str, silent: Sequence[Any] = ()) -> None:
    """Kill ``actors`` and wait, up to RAYTF_SHUTDOWN_TIMEOUT_S in all, until Ray knows each gone;
    then end the processes at ``silent`` (the addresses of those found unresponsive), which Ray's
    kill may have left (:func:`end_silent_processes`)."""
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
    if silent:
        end_silent_processes(silent, timeout_s=SILENT_END_TIMEOUT_S)


def end_process(pid: int) -> bool:
    """SIGKILL ``pid`` if it is still the process of a raytf worker actor (Ray titles it
    ``ray::TrainWorker``); whether it was. Linux only: elsewhere, nothing to read it by."""
    import signal

    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"TrainWorker" not in f.read():
                return False
        os.kill(pid, signal.SIGKILL)
    except OSError:  # gone meanwhile, or no /proc
        return False
    return True


_end_process = ray.remote(num_cpus=0, max_retries=0)(end_process)


def end_silent_processes(addresses: Sequence[Any], timeout_s: float) -> None:
    """End the processes of actors that stopped answering, on their nodes, once Ray was told to
    kill them. Ray's kill asks an actor's process to exit, and one that answers nothing (stopped,
    thrashing, stuck in native code) may never: on Ray 2.50 it then keeps its bundle's resources,
    and the next attempt's actors never start. Newer Rays end it themselves; this is then a no-op."""
    refs = [
        _end_process.options(scheduling_strategy=NodeAffinitySchedulingStrategy(a.node_id, soft=False)).remote(a.pid)
        for a in addresses
        if a.pid
    ]
    try:
        ended = sum(ray.get(refs, timeout=timeout_s))
    except (GetTimeoutError, RayTaskError, RayActorError) as error:  # a node gone with its process
        logger.warning("could not make sure unresponsive workers' processes ended: %s", type(error).__name__)
        return
    if ended:
        logger.warning("ended %d unresponsive worker process(es) Ray's kill had left", ended)


@ray.remote(num_cpus=0, max_retries=0)
def _drop_copies(storage: Any) -> None:
    from raytf._internal.checkpoint import memory

    memory.drop(storage)


def drop_copies_on(nodes: Sequence[str], storage: Any, *, timeout_s: float) -> None:
    """Remove the run's checkpoint copies in memory on each of ``nodes`` (ids), where no worker of
    the run is left to do it; a best effort, like :func:`ask_each`."""
    refs = [
        _drop_copies.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(storage)
        for node in nodes
    ]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


def call_each(
    actors: Sequence[Any],
    method: str,
    args_of: Callable[[int], tuple],
    what: str,
    timeout_s: float,
    setting: str = "FailureConfig.start_timeout_s",
) -> list:
    """``actors[i].method(*args_of(i))`` on every actor, retried where Ray says an actor is only
    briefly unavailable (a fresh process whose RPC server is not up yet): the methods called this
    way (start, retarget) may safely run twice. Anything else that stops one is a WorkerStartError;
    ``setting`` is the one that set ``timeout_s``, named when it runs out."""
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
                raise WorkerStartError(
                    f"worker actors did not {what} within {timeout_s:g} s ({setting}); check the actors' logs"
                ) from None
            except RayActorError as error:
                raise WorkerStartError(f"a worker actor died: cannot {what}: {error}") from None
        if pending:
            time.sleep(UNAVAILABLE_RETRY_S)
    return results


CLOSE_TIMEOUT_S = 5.0  # how long members asked to close() (remove what they keep on their node) get before the kill


def ask_each(actors: Sequence[Any], method: str, *args: Any, timeout_s: float) -> None:
    """``actor.method(*args)`` on every actor, waiting up to ``timeout_s`` for them all; a best
    effort (an actor that died or does not answer in time is left as it is)."""
    refs = [getattr(actor, method).remote(*args) for actor in actors]
    if refs:
        ray.wait(refs, num_returns=len(refs), timeout=timeout_s)


def reserve(members: Sequence[Any], timeout_s: float, new_actor: Callable[[Any], Any], attempt: int) -> None:
    """Each member's address, once its actor reserved its port. A warm process (a standby, or a
    survivor of the last attempt) found dead (an OOM kill, a stray ``ray.kill``) or a standby
    unable to take its bundle's GPUs is replaced by a cold
    actor: a slower start, never a lost attempt. Another actor that dies: WorkerStartError."""
    deadline = time.monotonic() + timeout_s
    pending = {m.actor.reserve.remote(**m.reserve_args): m for m in members}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise WorkerStartError(
                f"worker actors did not start within {timeout_s:g} s (FailureConfig.start_timeout_s); "
                "check the actors' logs for import errors or a slow runtime environment"
            )
        member = pending.pop(ready[0])
        try:
            member.address = ray.get(ready[0])
        except ActorUnavailableError:  # a fresh process whose RPC server is not up yet: ask again
            time.sleep(UNAVAILABLE_RETRY_S)
            pending[member.actor.reserve.remote(**member.reserve_args)] = member
        except (RayActorError, RayTaskError) as error:
            if not member.warm:
                why = error if isinstance(error, RayActorError) else error.cause
                raise WorkerStartError(f"a worker actor could not start: {why}") from None
            why = f"cannot take it ({error.cause})" if isinstance(error, RayTaskError) else "is dead"
            logger.warning(
                "attempt %d: the warm process for bundle %d (a standby, or the last attempt's, kept) %s; "
                "starting a new worker there instead",
                attempt,
                member.bundle,
                why,
            )
            ray.kill(member.actor, no_restart=True)
            member.warm, member.reserve_args = False, {}
            member.actor = new_actor(member)
            pending[member.actor.reserve.remote()] = member

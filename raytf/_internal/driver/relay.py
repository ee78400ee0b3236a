"""The poll relay: polls a group's actors and hands the driver everything they said in one call
per round; an asynchronous actor on the driver's node (``ActorRelay``), or for a group of up to
eight members the same code on a thread of the driver (``ThreadRelay``).

Polling each worker from the driver costs the driver one actor call per worker per round (at
RAYTF_POLL_INTERVAL_S = 0.1 s: 10 x N calls a second, 41,000 at 4,096 workers), on the thread that
also commits checkpoints and decides failures. The relay takes those calls: it keeps at most one
poll in flight per actor, and the driver's :meth:`PollRelay.take` returns the answers that came in
since the last take, the actors that died, and how long each unanswered poll has been out; the
driver's calls per second stay at one per round, whatever N is (bench/poll_cost.py).

Nothing about a poll's meaning changes: a worker's status is its answer to a poll, as before
(which is also when its SIGTERM handler is put back, on its main thread); an actor Ray calls
briefly unavailable is asked again, with the silence counted from the first ask; a dead actor
is a death, said once (the actor is not polled again). The driver feeds all of it to the group's watch (:func:`feed`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import WorkerStatus

HEARD, DIED = "heard", "died"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class PollRelay:
    """Polls the actors it is told to watch, every ``interval_s``; an asyncio actor (ray.remote)."""

    def __init__(self, interval_s: float):
        self._interval_s = interval_s
        self._actors: dict[int, Any] = {}  # index -> actor handle
        self._tokens: dict[int, int] = {}  # index -> which actor at that index an answer must be from
        self._next_token = 0
        self._in_flight: dict[int, float] = {}  # index -> when its unanswered poll was first sent
        self._events: list[tuple[int, str, Any]] = []  # (index, HEARD, status) or (index, DIED, (type, message))
        self._loop_task: Any = None

    def watch(self, actors: Mapping[int, Any]) -> None:
        """Poll these actors (index -> handle) from now on, and none other; forget what others said."""
        self._actors, self._tokens, self._in_flight, self._events = {}, {}, {}, []
        for index, actor in actors.items():
            self.replace(index, actor)
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def replace(self, index: int, actor: Any) -> None:
        """``index`` has a new actor: answers from the old one are dropped."""
        self._next_token += 1
        self._actors[index], self._tokens[index] = actor, self._next_token
        self._in_flight.pop(index, None)
        self._events = [event for event in self._events if event[0] != index]

    def take(self) -> tuple[list[tuple[int, str, Any]], dict[int, float]]:
        """What came in since the last take, in order, and each unanswered poll's age in seconds."""
        now = time.monotonic()
        events, self._events = self._events, []
        return events, {index: now - sent for index, sent in self._in_flight.items()}

    async def _loop(self) -> None:
        while True:
            now = time.monotonic()
            for index, actor in list(self._actors.items()):
                if index not in self._in_flight:
                    self._in_flight[index] = now
                    asyncio.ensure_future(self._poll(index, actor, self._tokens[index]))
            await asyncio.sleep(self._interval_s)

    async def _poll(self, index: int, actor: Any, token: int) -> None:
        from ray.exceptions import ActorUnavailableError, RayActorError

        while True:
            try:
                event: tuple[int, str, Any] = (index, HEARD, await actor.poll.remote())
            except ActorUnavailableError:  # not an answer yet: FailureConfig.worker_timeout_s decides
                await asyncio.sleep(self._interval_s)
                if self._tokens.get(index) != token:
                    return
                continue
            except RayActorError as error:
                event = (index, DIED, (type(error).__name__, first_line(error)))
            break
        if self._tokens.get(index) != token:
            return
        self._in_flight.pop(index, None)
        self._events.append(event)
        if event[1] == DIED:  # once: a death is final, and is not polled again
            del self._actors[index]


class ThreadRelay:
    """A :class:`PollRelay` on an event loop in a thread of the driver: what a small group polls
    through (``relay_for``), with no process of its own to start and no call per round across
    processes. Up to ``IN_DRIVER_MAX`` members the polls cost the driver little (bench/poll_cost.py:
    0.5 ms a round on its main thread, 2-4 % of a core in all at 2-8 workers); past it the relay
    is an actor."""

    def __init__(self, interval_s: float):
        self._loop = asyncio.new_event_loop()
        self._relay = PollRelay(interval_s)
        self._thread = threading.Thread(target=self._loop.run_forever, name="raytf-poll-relay", daemon=True)
        self._thread.start()

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        async def call() -> Any:  # on the loop, as PollRelay's methods expect
            return method(*args)

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def watch(self, actors: Mapping[int, Any]) -> None:
        self._call(self._relay.watch, actors)

    def replace(self, index: int, actor: Any) -> None:
        self._call(self._relay.replace, index, actor)

    def take(self, timeout_s: float) -> tuple[list[tuple[int, str, Any]], dict[int, float]]:
        return self._call(self._relay.take)

    def close(self) -> None:
        async def stop() -> None:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            self._loop.call_soon(self._loop.stop)

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(timeout=5)


class ActorRelay:
    """A :class:`PollRelay` actor (``actors.new_relay``): for large groups, whose polls would cost
    the driver's thread a call per member per round."""

    def __init__(self, actor: Any):
        self._actor = actor

    def watch(self, actors: Mapping[int, Any]) -> None:
        self._actor.watch.remote(actors)

    def replace(self, index: int, actor: Any) -> None:
        self._actor.replace.remote(index, actor)

    def take(self, timeout_s: float) -> tuple[list[tuple[int, str, Any]], dict[int, float]]:
        """Raises RayActorError or GetTimeoutError when the relay itself is gone."""
        import ray

        return ray.get(self._actor.take.remote(), timeout=timeout_s)

    def close(self) -> None:
        import ray

        ray.kill(self._actor, no_restart=True)


def feed(
    watch: GroupWatch,
    events: Sequence[tuple[int, str, Any]],
    unanswered: Mapping[int, float],
    now: float,
    answer: Callable[[int, WorkerStatus], WorkerStatus] = lambda index, status: status,
) -> None:
    """One take's news into the watch: answers (``answer`` sees each status first), deaths, and
    the silence of polls unanswered (by age, as of ``now``)."""
    for index, kind, payload in events:
        if kind == HEARD:
            watch.heard(index, answer(index, payload))
        else:
            watch.died(index, *payload)
    for index, age in unanswered.items():
        watch.silent(index, now - age)

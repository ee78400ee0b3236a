"""The poll relay (driver/relay.py): it polls a group's actors, and the driver takes everything they
said in one call a round. Run here on asyncio with fake actors (no Ray processes)."""

import asyncio
import threading
import time

from ray.exceptions import ActorUnavailableError, RayActorError

from raytf._internal.driver.actors import IN_DRIVER_MAX, relay_for
from raytf._internal.driver.relay import DIED, HEARD, PollRelay, ThreadRelay, feed
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import Phase, WorkerStatus
from raytf.errors import FailureKind


class _Method:
    def __init__(self, answer):
        self._answer = answer
        self.calls = 0

    def remote(self):
        self.calls += 1
        return asyncio.ensure_future(self._answer())


class _Actor:
    """``poll.remote()`` awaits ``answer()``: a status, an exception, or never."""

    def __init__(self, answer):
        self.poll = _Method(answer)


def _status(rank, phase=Phase.TRAINING):
    async def answer():
        return WorkerStatus(rank=rank, phase=phase)
    return answer


async def _never():
    await asyncio.sleep(3600)


async def _dead():
    raise RayActorError()


def _run(relay, actors, done, at_least_s=0.0, timeout_s=60.0):
    """Watch ``actors`` until ``done()`` holds and ``at_least_s`` has passed (however slow the
    machine: never a fixed sleep), then take what the relay gathered."""
    async def go():
        loop = asyncio.get_running_loop()
        start = loop.time()
        relay.watch(actors)
        while not (done() and loop.time() - start >= at_least_s):
            assert loop.time() - start < timeout_s, "the relay never got there"
            await asyncio.sleep(0.01)
        return relay.take()
    return asyncio.run(go())


def test_one_take_returns_every_actors_answers_and_the_age_of_unanswered_polls():
    relay = PollRelay(interval_s=0.01)
    a, b, silent = _Actor(_status(0)), _Actor(_status(1)), _Actor(_never)
    events, unanswered = _run(relay, {0: a, 1: b, 2: silent}, lambda: min(a.poll.calls, b.poll.calls) >= 3,
                              at_least_s=0.05)
    heard = {index for index, kind, _ in events if kind == HEARD}
    assert heard == {0, 1}
    assert a.poll.calls >= 3  # polled again each interval once answered
    assert silent.poll.calls == 1  # at most one poll in flight per actor
    assert set(unanswered) == {2} and unanswered[2] >= 0.05


def test_a_dead_actor_is_a_death_and_a_briefly_unavailable_one_is_asked_again():
    tries = []

    async def unavailable_once():
        tries.append(1)
        if len(tries) == 1:
            raise ActorUnavailableError("connection reset", None)
        return WorkerStatus(rank=1, phase=Phase.TRAINING)

    relay = PollRelay(interval_s=0.01)
    # A third poll: the relay handled the second one's answer.
    events, _ = _run(relay, {0: _Actor(_dead), 1: _Actor(unavailable_once)}, lambda: len(tries) >= 3)
    assert [kind for index, kind, _ in events if index == 0] == [DIED]  # said once, not polled again
    assert next(payload for index, kind, payload in events if kind == DIED)[0] == "RayActorError"
    assert (1, HEARD) in {(index, kind) for index, kind, _ in events}
    assert not any(index == 1 and kind == DIED for index, kind, _ in events)


def test_answers_from_an_actor_that_was_replaced_are_dropped():
    async def late():  # the old actor answers after it was replaced
        await asyncio.sleep(0.05)
        return WorkerStatus(rank=0, phase=Phase.FAILED)

    async def go():
        relay = PollRelay(interval_s=0.01)
        relay.watch({0: _Actor(late)})
        await asyncio.sleep(0.02)  # the old actor's poll is out
        relay.replace(0, _Actor(_status(0, Phase.STARTING)))
        await asyncio.sleep(0.1)
        return relay.take()

    events, _ = asyncio.run(go())
    phases = {payload.phase for index, kind, payload in events if kind == HEARD}
    assert phases == {Phase.STARTING}


def test_fed_to_the_watch_a_death_and_a_long_silence_are_failures():
    watch = GroupWatch({0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"}, start_timeout_s=120, worker_timeout_s=5,
                       hang_timeout_s=None)
    now = time.monotonic()
    feed(watch, [(2, HEARD, WorkerStatus(rank=2, phase=Phase.TRAINING))], {}, now - 7.0)  # joined, then silent
    feed(watch, [(0, HEARD, WorkerStatus(rank=0, phase=Phase.TRAINING)), (1, DIED, ("RayActorError", "gone"))],
         {2: 6.0}, now)
    status = watch.round(None)
    kinds = {f.rank: f.kind for f in status.failures}
    assert kinds == {1: FailureKind.DIED, 2: FailureKind.UNRESPONSIVE}
    assert status.phases[0] == Phase.TRAINING


def test_a_small_group_is_polled_from_a_thread_of_the_driver_that_ends_with_the_relay():
    relay = relay_for(IN_DRIVER_MAX, interval_s=0.01)
    assert isinstance(relay, ThreadRelay)
    a, silent = _Actor(_status(0)), _Actor(_never)
    relay.watch({0: a, 1: silent})
    time.sleep(0.1)
    events, unanswered = relay.take(timeout_s=1)
    assert {index for index, kind, _ in events if kind == HEARD} == {0} and a.poll.calls >= 3
    assert set(unanswered) == {1} and unanswered[1] >= 0.05
    relay.replace(0, _Actor(_status(0, Phase.FINISHED)))
    time.sleep(0.05)
    events, _ = relay.take(timeout_s=1)
    assert {payload.phase for _, kind, payload in events if kind == HEARD} == {Phase.FINISHED}
    relay.close()
    assert not any(t.name == "raytf-poll-relay" and t.is_alive() for t in threading.enumerate())

"""The driver's control plane against the number of workers: raytf's controller, group watch and
failure policy over a simulated group of N workers, no Ray and no TensorFlow.

    python bench/control_plane.py [--workers 64,256,1024] [--seconds 60]

What the driver does between its relay's answers is what grows with N: the simulated group hands
the real :class:`Controller` what raytf's ``WorkerGroup.poll`` hands it, made the same way (each
round's answers unpickled as the driver's ``ray.get`` of the relay's take unpickles them, fed to a
real ``GroupWatch`` through the relay's ``feed``, then summed up by ``watch.round``), with the
statuses N training workers send (phase, activity, rank 0's progress
and a report every second). The clock is simulated, a round every RAYTF_POLL_INTERVAL_S (0.1 s);
the driver's CPU is measured for real (``time.process_time``, less what making the simulated
answers took). Each N runs one attempt that starts
(workers ready at random rounds within the first 5 s), trains for ``--seconds``, loses a worker,
and a second attempt that starts and finishes. One JSON line per N:

- ``driver_core_share``: the driver's CPU per simulated second while training, as a share of one
  core (its goal: under 5% at 1,024 workers);
- ``calls_per_s``: the Ray calls the driver makes per simulated second while training (one relay
  ``take`` a round, plus an acknowledgement per checkpoint report): flat in N by design, counted
  here so that a change that adds per-worker calls shows;
- ``startup_rounds``: rounds from the group's start to the release of the barrier, and how many
  rounds after the round in which the last worker became ready that came (0: in that round);
- ``decision_rounds`` and ``decision_ms``: rounds from the loss to the restart decision, and the
  driver's CPU for that round.

The relay itself (an actor on the driver's node polling N workers, driver/relay.py) and the
workers are not in it: bench/poll_cost.py measures real actors polled by a real relay.
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import sys
import time

from raytf import FailureConfig
from raytf._internal.driver.controller import Controller, Finished, Restarting, Running
from raytf._internal.driver.failure import FailureBook
from raytf._internal.driver.relay import DIED, HEARD, feed
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import Activity, ActivityKind, Phase, Progress, Report, WorkerStatus

INTERVAL_S = 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class SimulatedGroup:
    """N workers as the controller sees them through a relay: one ``take`` a round."""

    def __init__(self, n: int, clock: Clock, train_s: float, seed: int = 0):
        self.n, self.clock, self.train_s = n, clock, train_s
        self.random = random.Random(seed)
        self.calls = 0  # Ray calls the driver would make: relay takes and acknowledgements
        self.rounds = 0
        self.simulation_s = 0.0  # CPU spent making the workers' answers (not the driver's)
        self.log: list[tuple[str, int, float]] = []  # (event, round, driver CPU seconds of that round)

    def start(self, attempt: int, resume) -> None:
        self.attempt, self.rounds_in_attempt, self.released_at = attempt, 0, None
        self.ready_round = {rank: self.random.randrange(50) for rank in range(self.n)}  # within 5 s
        self.trained_rounds = 0
        self.watch = GroupWatch({r: f"10.0.{r // 256}.{r % 256}" for r in range(self.n)}, start_timeout_s=120,
                                worker_timeout_s=30, hang_timeout_s=300, clock=self.clock)
        self.log.append(("start", self.rounds, 0.0))

    def _status(self, rank: int) -> WorkerStatus:
        if self.released_at is None:
            phase = Phase.READY if self.rounds_in_attempt >= self.ready_round[rank] else Phase.STARTING
            return WorkerStatus(rank=rank, phase=phase)
        steps = self.trained_rounds
        last = self.attempt == 1 and steps * INTERVAL_S >= self.train_s / 4
        reports = ()
        if rank == 0 and steps and steps % 10 == 0:  # a metrics report every second
            reports = (Report(rank=0, seq=steps, metrics={"step": steps, "loss": 1.0 / steps}, time=self.clock(),
                              attempt=self.attempt),)
        return WorkerStatus(
            rank=rank, phase=Phase.FINISHED if last else Phase.TRAINING, reports=reports,
            activity=Activity(ActivityKind.TENSORFLOW, self.clock()),
            progress=Progress(epoch=0, step=steps, global_step=steps) if rank == 0 else None)

    def poll(self):
        self.calls += 1  # the relay's take
        self.rounds += 1
        self.rounds_in_attempt += 1
        if self.released_at is not None:
            self.trained_rounds += 1
        made = time.process_time()  # the simulation's own work, not the driver's: counted apart
        events = [(rank, HEARD, self._status(rank)) for rank in range(self.n)]
        if self.attempt == 0 and self.trained_rounds * INTERVAL_S >= self.train_s:
            events[self.n // 2] = (self.n // 2, DIED, ("RayActorError", "the actor died unexpectedly"))
            self.log.append(("lost", self.rounds, 0.0))
        taken = pickle.dumps((events, {}))  # what the relay's take returns, as Ray carries it
        self.simulation_s += time.process_time() - made
        events, unanswered = pickle.loads(taken)  # the driver's ray.get of the take: deserializing N answers
        feed(self.watch, events, unanswered, self.clock())
        return self.watch.round(None)

    def connect(self) -> None:
        self.released_at = self.rounds
        self.watch.released = True
        self.log.append(("released", self.rounds, max(self.ready_round.values())))

    def acknowledge(self, rank, seq, error) -> None:
        self.calls += 1

    def shutdown(self) -> None:
        self.log.append(("shutdown", self.rounds, 0.0))

    close = shutdown

    def halt(self) -> None:
        pass

    def can_replace(self, failure) -> bool:
        return False

    def replace(self, failure) -> None:
        raise AssertionError("a MultiWorkerMirroredStrategy group is not replaced in place")


def measure(n: int, train_s: float) -> dict:
    clock = Clock()
    group = SimulatedGroup(n, clock, train_s)
    controller = Controller(group, FailureBook(FailureConfig(max_failures=1)), lambda report: None,
                            poll_interval_s=INTERVAL_S, failure_grace_s=3.0, sleep=clock.sleep, clock=clock)
    training_cpu, training_rounds, calls_at = 0.0, 0, None
    decision = None
    while not isinstance(controller.state, Finished):
        before_state, cpu, simulated = controller.state, time.process_time(), group.simulation_s
        calls = group.calls
        _, after = controller.step()
        spent = time.process_time() - cpu - (group.simulation_s - simulated)
        if isinstance(before_state, Running) and group.attempt == 0 and group.released_at is not None:
            if isinstance(after, Restarting):
                lost = next(r for e, r, _ in group.log if e == "lost")
                decision = (group.rounds - lost, spent)
            elif group.trained_rounds > 20:  # steady training: the start-up's rounds left out
                training_cpu += spent
                training_rounds += 1
                calls_at = (calls_at or 0) + group.calls - calls
    released = [(r, last_ready) for e, r, last_ready in group.log if e == "released"]
    starts = [r for e, r, _ in group.log if e == "start"]
    seconds = training_rounds * INTERVAL_S
    return {
        "workers": n,
        "training_rounds": training_rounds,
        "driver_ms_per_round": round(1000 * training_cpu / training_rounds, 3),
        "driver_core_share": round(training_cpu / seconds, 4),
        "calls_per_s": round((calls_at or 0) / seconds, 2),
        "startup_rounds": [r - s for (r, _), s in zip(released, starts)],
        "release_rounds_after_last_ready": [r - s - int(last) for (r, last), s in zip(released, starts)],
        "decision_rounds": decision[0] if decision else None,
        "decision_ms": round(1000 * decision[1], 3) if decision else None,
        "attempts": controller.state.attempt + 1,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="64,256,1024")
    parser.add_argument("--seconds", type=float, default=60.0, help="simulated seconds of training before the loss")
    args = parser.parse_args(argv)
    results = [measure(int(n), args.seconds) for n in args.workers.split(",")]
    for result in results:
        print(json.dumps(result), flush=True)
    first, last = results[0], results[-1]
    print(json.dumps({"summary": {
        "workers": [r["workers"] for r in results],
        "driver_core_share": [r["driver_core_share"] for r in results],
        "calls_per_s": [r["calls_per_s"] for r in results],
        "core_share_per_worker_growth": round(last["driver_core_share"] / first["driver_core_share"]
                                              / (last["workers"] / first["workers"]), 3),
        "python": sys.version.split()[0],
    }}))


if __name__ == "__main__":
    main()

"""The driver's cost per poll round against the number of workers.

    python bench/poll_cost.py [--fake 2,16,128,1024,4096] [--actors 2,4,8,16] [--rounds 50]

Two parts, JSON lines, then a summary line:

- ``fake``: what the driver does with one round's answers, with no Ray: N workers' statuses
  (training, each with an activity and rank 0 with progress) heard by the group's watch, then the
  round summed up (failures, hangs, readiness, start-up milestones). Milliseconds per round.
- ``actors``: real worker actors (raytf's TrainWorker, no TensorFlow loaded: they answer polls
  before any start), polled three ways: ``direct``, a poll per worker from the driver each round
  (how raytf polled before the relay); ``relay``, a relay actor on the driver's node polls them and
  the driver takes all answers in one call a round (how groups of more than IN_DRIVER_MAX members
  poll, driver/relay.py); ``thread``, the same relay on a thread of the driver (how smaller groups
  poll: no process to start). The driver's milliseconds per round, its process's share of a core,
  and its actor calls per second at RAYTF_POLL_INTERVAL_S (0.1 s): direct, 10 x N; through the
  relay actor, 10 whatever N is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def fake_round_ms(n: int, rounds: int) -> float:
    from raytf._internal.driver.watch import GroupWatch
    from raytf._internal.protocol import Activity, ActivityKind, Phase, Progress, WorkerStatus

    watch = GroupWatch({rank: f"10.0.{rank // 256}.{rank % 256}" for rank in range(n)}, start_timeout_s=120,
                       worker_timeout_s=30, hang_timeout_s=300)
    watch.released = True
    times = []
    for step in range(rounds):
        started = time.perf_counter()
        for rank in range(n):
            watch.heard(rank, WorkerStatus(
                rank=rank, phase=Phase.TRAINING, activity=Activity(ActivityKind.TENSORFLOW, 0.01 * step),
                progress=Progress(epoch=0, step=step, global_step=step) if rank == 0 else None))
        watch.round(None)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def direct_round(actors, in_flight: dict, watch) -> None:
    """One round the way raytf's driver polled before the relay: a poll per worker from the driver."""
    import ray

    now = time.monotonic()
    for index, actor in enumerate(actors):
        if index not in in_flight:
            in_flight[index] = (actor.poll.remote(), now)
    refs = [ref for ref, _ in in_flight.values()]
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=0.05)[0])
    for index, (ref, sent) in list(in_flight.items()):
        if ref in ready:
            del in_flight[index]
            watch.heard(index, ray.get(ref))
        else:
            watch.silent(index, sent)


def actor_round_ms(n: int, rounds: int) -> dict:
    """Real worker actors, polled three ways: directly from the driver, through a relay actor, and
    through a relay on a thread of the driver (how groups of up to IN_DRIVER_MAX poll). For each,
    the driver's milliseconds per round on its own thread, and the share of a core the driver's
    process used meanwhile (its threads' CPU over the wall time, the thread relay's polls included)."""
    import ray

    from raytf._internal.driver.actors import kill_and_wait, new_relay, new_worker
    from raytf._internal.driver.relay import ActorRelay, ThreadRelay, feed
    from raytf._internal.driver.watch import GroupWatch

    actors = [new_worker("bench-poll", f"raytf:bench-poll:{n}:{i}", num_cpus=0, max_restarts=0) for i in range(n)]
    ray.get([a.__ray_ready__.remote() for a in actors])

    def new_watch() -> GroupWatch:
        return GroupWatch({rank: "127.0.0.1" for rank in range(n)}, start_timeout_s=120, worker_timeout_s=30,
                          hang_timeout_s=300)

    def timed(one_round) -> tuple[list, float]:
        times, cpu, wall = [], time.process_time(), time.monotonic()
        for _ in range(rounds):
            started = time.perf_counter()
            one_round()
            times.append(time.perf_counter() - started)
            time.sleep(0.1)
        return times, (time.process_time() - cpu) / (time.monotonic() - wall)

    figures: dict = {}
    try:
        watch, in_flight = new_watch(), {}

        def direct() -> None:
            direct_round(actors, in_flight, watch)
            watch.round(None)

        times, share = timed(direct)
        figures.update(direct_ms=round(1000 * statistics.median(times), 2), direct_calls_per_s=n / 0.1,
                       direct_cpu_share=round(share, 3))
        for name, relay in (("relay", ActorRelay(new_relay(0.1))), ("thread", ThreadRelay(0.1))):
            watch, heard = new_watch(), []

            def relayed() -> None:
                events, unanswered = relay.take(30)
                feed(watch, events, unanswered, time.monotonic())
                assert not watch.round(None).failures
                heard.append(len(events))

            relay.watch(dict(enumerate(actors)))
            time.sleep(0.1)
            try:
                times, share = timed(relayed)
            finally:
                relay.close()
            figures.update({f"{name}_ms": round(1000 * statistics.median(times), 2),
                            f"{name}_cpu_share": round(share, 3),
                            f"{name}_answers_per_round": round(statistics.mean(heard), 1)})
        figures["relay_calls_per_s"] = 1 / 0.1
    finally:
        kill_and_wait(actors, "bench")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", default="2,16,128,1024,4096")
    parser.add_argument("--actors", default="2,4,8,16")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    summary: dict = {"fake_ms": {}, "actors": {}}
    for n in [int(v) for v in args.fake.split(",") if v]:
        ms = fake_round_ms(n, args.rounds)
        summary["fake_ms"][n] = round(ms, 3)
        print(json.dumps({"part": "fake", "workers": n, "ms_per_round": round(ms, 3)}), flush=True)
    counts = [int(v) for v in args.actors.split(",") if v]
    if counts:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        for n in counts:
            figures = actor_round_ms(n, args.rounds)
            summary["actors"][n] = figures
            print(json.dumps({"part": "actors", "workers": n, **figures}), flush=True)
        ray.shutdown()
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

"""The driver's cost per poll round against the number of workers.

    python bench/poll_cost.py [--fake 2,16,128,1024,4096] [--actors 2,4,8,16] [--rounds 50]

Two parts, JSON lines, then a summary line:

- ``fake``: what the driver does with one round's answers, with no Ray: N workers' statuses
  (training, each with an activity and rank 0 with progress) heard by the group's watch, then the
  round summed up (failures, hangs, readiness, start-up milestones). Milliseconds per round.
- ``actors``: real worker actors (raytf's TrainWorker, no TensorFlow loaded: they answer polls
  before any start) polled the way the group polls them (``poll_round``): milliseconds per round
  and the actor calls the driver sends per second at RAYTF_POLL_INTERVAL_S (0.1 s).

Each round sends one poll per worker: the calls per second grow as N does. That is the figure to
bring down (polls batched per node), and this script is its yardstick.
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


def actor_round_ms(n: int, rounds: int) -> tuple[float, float]:
    import ray

    from raytf._internal.driver.actors import kill_and_wait, new_worker, poll_round
    from raytf._internal.driver.watch import GroupWatch

    actors = [new_worker("bench-poll", f"raytf:bench-poll:{n}:{i}", num_cpus=0, max_restarts=0) for i in range(n)]
    ray.get([a.__ray_ready__.remote() for a in actors])
    watch = GroupWatch({rank: "127.0.0.1" for rank in range(n)}, start_timeout_s=120, worker_timeout_s=30,
                       hang_timeout_s=300)
    in_flight: dict = {}
    times = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            poll_round(actors, in_flight, watch)
            watch.round(None)
            times.append(time.perf_counter() - started)
    finally:
        kill_and_wait(actors, "bench")
    return 1000 * statistics.median(times), n / 0.1  # one poll per worker per round, a round each 0.1 s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", default="2,16,128,1024,4096")
    parser.add_argument("--actors", default="2,4,8,16")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    summary: dict = {"fake_ms": {}, "actor_ms": {}, "calls_per_s": {}}
    for n in [int(v) for v in args.fake.split(",") if v]:
        ms = fake_round_ms(n, args.rounds)
        summary["fake_ms"][n] = round(ms, 3)
        print(json.dumps({"part": "fake", "workers": n, "ms_per_round": round(ms, 3)}), flush=True)
    counts = [int(v) for v in args.actors.split(",") if v]
    if counts:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        for n in counts:
            ms, calls = actor_round_ms(n, args.rounds)
            summary["actor_ms"][n], summary["calls_per_s"][n] = round(ms, 2), calls
            print(json.dumps({"part": "actors", "workers": n, "ms_per_round": round(ms, 2),
                              "calls_per_s": calls}), flush=True)
        ray.shutdown()
    print(json.dumps({"summary": summary}))


if __name__ == "__main__":
    main()

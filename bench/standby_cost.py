"""What warm standbys cost (``FailureConfig(warm_standby=True)``): memory, CPU, and a fault-free run's time.

    python bench/standby_cost.py [--epochs 3] [--gpus-per-worker 0] [--repeats 3]

Runs W1 as ``bench/recovery.py`` does (tf-keras ``model.fit``, 2 workers, a checkpoint per epoch)
without a fault, once without standbys and once with, in one invocation (``--repeats``: that pair
that many times, round by round, every line saying its ``repeat``), and samples every
worker process (``ray::TrainWorker``) from ``/proc`` every 0.2 s (Linux). Prints one JSON line per
run and a summary:

- ``wall_s``: ``fit()``'s wall time; ``wall_with_standbys_vs_without``: the slowdown a fault-free
  run pays for standbys (their TensorFlow import competes for the node's CPUs);
- ``standby_rss_mb`` / ``worker_rss_mb``: each standby's and each training worker's resident
  memory at its peak;
- ``standby_cpu_s``: the CPU seconds each standby used (its start: the process, TensorFlow's
  import, ``train_fn`` unpickled; then it waits); ``standby_ready_s``: from the standby's process
  appearing to its CPU use settling (under 0.02 s per sample), about when a restart could take it
  without waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import recovery  # noqa: E402
import w1  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _workers() -> dict[int, tuple[float, float]]:
    """pid -> (resident MB, CPU seconds) of every ray::TrainWorker process now."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if not f.read().startswith(b"ray::TrainWorker"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/statm") as f:
                resident = int(f.read().split()[1]) * _PAGE / 2**20
        except OSError:
            continue
        found[int(pid)] = (resident, (int(fields[11]) + int(fields[12])) / _TICK)
    return found


def sample(stop: threading.Event, seen: dict) -> None:
    """Until ``stop``: every worker process's first-seen time and (time, MB, CPU s) samples."""
    while not stop.is_set():
        now = time.monotonic()
        for pid, (mb, cpu) in _workers().items():
            seen.setdefault(pid, {"first": now, "samples": []})["samples"].append((now, mb, cpu))
        stop.wait(0.2)


def _ready_s(process: dict) -> float:
    """From the process's appearance to the last sample where its CPU time still grew by 0.02 s."""
    samples = process["samples"]
    last = process["first"]
    for (_, _, before), (at, _, cpu) in zip(samples, samples[1:]):
        if cpu - before > 0.02:
            last = at
    return round(last - process["first"], 2)


def run(dataset, workdir: str, warm: bool) -> dict:
    while _workers():  # the previous run's processes, on their way out
        time.sleep(0.2)
    stop, seen = threading.Event(), {}
    sampler = threading.Thread(target=sample, args=(stop, seen), daemon=True)
    sampler.start()
    marks = tempfile.mkdtemp(dir=workdir, prefix=f"marks-{warm}-")
    try:
        outcome = recovery.run_raytf(dataset, workdir, marks, None, warm_standby=warm)
    finally:
        stop.set()
        sampler.join()
    # The training workers appear first (one per rank); standbys after the first step.
    order = sorted(seen, key=lambda pid: seen[pid]["first"])
    workers, standbys = order[:2], order[2:]
    line = {"standbys": warm, "wall_s": round(outcome["wall_s"], 2),
            "worker_rss_mb": [round(max(s[1] for s in seen[p]["samples"])) for p in workers]}
    if standbys:
        line["standby_rss_mb"] = [round(max(s[1] for s in seen[p]["samples"])) for p in standbys]
        line["standby_cpu_s"] = [round(seen[p]["samples"][-1][2], 2) for p in standbys]
        line["standby_ready_s"] = [_ready_s(seen[p]) for p in standbys]
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=w1.EPOCHS)
    parser.add_argument("--gpus-per-worker", type=float, default=0, help=w1.GPU_FLAG_HELP)
    parser.add_argument("--repeats", type=int, default=1, help="the pair of runs this many times, round by round")
    args = parser.parse_args()
    w1.use_gpus(args.gpus_per_worker)
    w1.EPOCHS = args.epochs

    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(w1)
    cloudpickle.register_pickle_by_value(recovery)
    ray.init(address="local", num_cpus=4, runtime_env={"env_vars": w1.WORKER_ENV}, log_to_driver=False,
             include_dashboard=False)
    dataset = w1.ray_dataset()
    ratios = []
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            pair = {}
            for warm in (False, True):  # each round a directory of its own: a run of the same name would resume
                pair[warm] = run(dataset, tempfile.mkdtemp(dir=workdir, prefix=f"round{repeat}-"), warm=warm)
                print(json.dumps({**pair[warm], "repeat": repeat} if args.repeats > 1 else pair[warm]), flush=True)
            if not pair[True].get("standby_rss_mb"):  # nothing measured: say so rather than print it
                raise SystemExit("standby_cost: no standby appeared in the run with standbys")
            ratios.append(pair[True]["wall_s"] / pair[False]["wall_s"])
    print(json.dumps({"summary": "standby_cost", "wall_with_standbys_vs_without": round(statistics.median(ratios), 2),
                      "repeats": args.repeats, **{k: pair[True].get(k) for k in
                                                  ("standby_rss_mb", "standby_cpu_s", "standby_ready_s", "worker_rss_mb")}}))


if __name__ == "__main__":
    main()

"""raytf's benchmarks by suite, each invocation kept as a record.

    python -m bench list                  # the suites and the commands each runs
    python -m bench cpu-quick             # W1 against its anchors, a few minutes on 2 CPUs
    python -m bench cpu-full              # every CPU benchmark the docs quote (an hour or more)
    python -m bench gpu                   # the GPU benchmarks (one machine with a GPU)
    python -m bench cpu-full --steps w2   # some of a suite's steps, by name (into the suite's record)
    python -m bench reproduces cpu-quick  # did its newest run land in the ranges the README states?

A suite runs its benchmark scripts (``bench/*.py``, each comparing raytf with its anchors in one
invocation) one after the other, and appends every JSON line they print to
``bench/results/<suite>.jsonl`` (``--out`` for another file), each wrapped with what makes it
traceable: the invocation (its id, suite, step and command) and the environment (commit, date,
machine, cores, memory, library versions). The docs quote the newest invocation of a record;
the older ones stay, so a figure's history and spread can be read back.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from importlib import metadata
from typing import Iterator, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclasses.dataclass(frozen=True)
class Step:
    """One benchmark script run with its arguments; ``name`` is how the docs pick its lines."""

    name: str
    script: str
    args: tuple[str, ...] = ()

    def command(self) -> list[str]:
        return [sys.executable, os.path.join(HERE, self.script), *self.args]


# W1 (bench/w1.py) like for like: the same model, data, global batch and steps_per_execution for
# every system, three runs each; at 8 steps an execution also raytf's Keras 3 loop, which Ray Train
# cannot run (its tf-keras loop is the same as raytf's tf-keras one).
W1_SPE1 = Step("w1_spe1", "throughput.py", ("--systems", "raytf,plain_mwms,ray_train", "--repeats", "3"))
W1_SPE8 = Step("w1_spe8", "throughput.py", ("--systems", "raytf,plain_mwms,ray_train,raytf_keras3", "--repeats", "3",
                                            "--steps-per-execution", "8"))
SUITES: dict[str, tuple[Step, ...]] = {
    "cpu-quick": (W1_SPE1, W1_SPE8),
    "cpu-full": (
        W1_SPE1, W1_SPE8,
        Step("keras_paths", "keras_paths.py", ("--repeats", "3")),
        # W2's configurations the docs discuss, three runs each, on half of W2's rows (~25 min here).
        Step("w2", "w2.py", ("--repeats", "3", "--rows", "4096", "--configs", "plain_mwms,raytf,raytf_per_variable,"
                             "raytf_bfloat16_ef,raytf_float16_ef,raytf_accumulate4,raytf_local_sgd4,"
                             "raytf_bfloat16_ef_local_sgd4")),
        Step("ps", "ps.py", ("--steps-per-execution", "8", "--repeats", "3")),
        Step("recovery", "recovery.py"),
        Step("startup", "startup.py"),
        Step("ingest", "ingest.py"),
        # Three rounds of every path; Ray Data's to_tf anchors one pass a round (a few thousand rows/s).
        Step("file_ingest", "tfrecord_ingest.py", ("--files", "16", "--rows", "32768", "--repeats", "3",
                                                   "--ray-data-epochs", "1")),
        Step("large_files", "large_files.py", ("--gib", "4", "--object-store-gib", "2", "--ray-data", "--repeats", "3")),
        Step("w3_local", "w3.py", ("--gib", "1", "--storages", "local", "--repeats", "3")),
        # Checkpoints at the interval a large model is saved at (every 300 steps, about 30 s here).
        Step("w3_local_every300", "w3.py", ("--gib", "1", "--storages", "local", "--steps", "900", "--every", "300",
                                            "--systems", "raytf_async,ray_train_async", "--repeats", "3")),
        Step("w3_restores", "w3.py", ("--restores", "--gib", "1", "--steps", "10", "--every", "5", "--repeats", "3")),
        # W3's checkpoints to the loopback S3 server, raytf against both of Ray Train's report modes.
        # A checkpoint of W3's table as a Keras 3 and a tf-keras Embedding layer, and over two parameter servers.
        Step("w3_layers", "w3.py", ("--gib", "1", "--steps", "180", "--every", "60", "--storages", "local", "--systems",
                                    "raytf_async", "--table", "keras", "--repeats", "3")),
        Step("w3_layers_tf_keras", "w3.py", ("--gib", "1", "--steps", "180", "--every", "60", "--storages", "local",
                                             "--systems", "raytf_async", "--table", "keras", "--worker-env",
                                             "TF_USE_LEGACY_KERAS=1", "--repeats", "3")),
        Step("w3_ps", "w3_ps.py", ("--gib", "1", "--num-ps", "2", "--steps", "60", "--every", "20", "--repeats", "3")),
        Step("w3_s3", "w3.py", ("--gib", "1", "--storages", "s3", "--systems", "raytf_async,ray_train_async,ray_train_sync",
                                "--repeats", "3")),
        # The host allocator under a sparse table's copies: raytf's defaults, oneDNN off, and oneDNN off with
        # TensorFlow's own allocator, round by round.
        Step("w3_allocator", "w3.py", ("--gib", "1", "--steps", "180", "--every", "60", "--storages", "local",
                                       "--systems", "raytf_async", "--repeats", "3", "--conditions",
                                       ";TF_ENABLE_ONEDNN_OPTS=0;TF_ENABLE_ONEDNN_OPTS=0,TF_CPU_ALLOCATOR_USE_BFC=false")),
        # raytf's host copy of a 1 GiB table, four copies in each of three processes (a process's first maps its pages).
        Step("host_copy", "gpu_host_path.py", ("--gib", "1", "--tensorflow", "--processes", "3")),
        Step("host_copy_prewarm", "gpu_host_path.py", ("--gib", "1", "--tensorflow", "--prewarm", "--processes", "3")),
        Step("standby_cost", "standby_cost.py", ("--repeats", "3")),
        Step("poll_cost", "poll_cost.py", ("--fake", "")),  # its simulated part: control_plane's
        Step("control_plane", "control_plane.py", ("--workers", "64,256,1024,4096")),
        Step("restart_scaling", "restart_scaling.py", ("--workers", "2,4,8")),
        Step("growth", "growth.py", ("--repeats", "3")),
    ),
    "gpu": (
        Step("w1_gpu", "throughput.py", ("--gpus-per-worker", "0.5", "--systems",
                                         "plain_mwms,raytf,ray_train,raytf_keras3", "--repeats", "3")),
        Step("w2_gpu", "w2.py", ("--gpus-per-worker", "0.5", "--configs",
                                 "plain_mwms,raytf,raytf_float16_ef,raytf_local_sgd4,raytf_float16_ef_local_sgd4")),
        Step("recovery_gpu", "recovery.py", ("--gpus-per-worker", "0.5", "--systems", "raytf_warm,raytf",
                                             "--epochs", "10", "--kill-step", "1521")),
    ),
}
LIBRARIES = ("tensorflow", "keras", "tf-keras", "ray", "numpy", "pyarrow", "ml_dtypes")


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def _memory_gib() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _version(library: str) -> Optional[str]:
    try:
        return metadata.version(library)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict:
    """What a figure depends on besides raytf's code: the machine and the libraries."""
    return {
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"system": platform.platform(), "cpu": _cpu_model(), "cores": os.cpu_count(),
                    "memory_gib": _memory_gib(), "python": platform.python_version()},
        "versions": {library: _version(library) for library in LIBRARIES},
    }


def results(step: Step) -> Iterator[dict]:
    """The JSON objects ``step``'s script prints, as it prints them; its other output goes to stderr."""
    process = subprocess.Popen(step.command(), cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        line = line.strip()
        if line.startswith("{"):
            try:
                yield json.loads(line)
                continue
            except ValueError:
                pass
        print(line, file=sys.stderr)
    if process.wait() != 0:
        raise SystemExit(f"bench: {' '.join(step.command())} exited with status {process.returncode}")


def run(suite: str, out: str, only: Optional[list[str]] = None) -> None:
    steps = [step for step in SUITES[suite] if only is None or step.name in only]
    unknown = sorted(set(only or ()) - {step.name for step in SUITES[suite]})
    if unknown:
        raise SystemExit(f"bench: {suite} has no step {', '.join(unknown)} (python -m bench list)")
    invocation = {"id": uuid.uuid4().hex[:12], "suite": suite, "environment": environment()}
    started = time.monotonic()
    with open(out, "a") as record:
        for step in steps:
            command = " ".join(["python", f"bench/{step.script}", *step.args])
            print(f"bench {suite}: {command}", file=sys.stderr, flush=True)
            for result in results(step):
                line = {"invocation": invocation["id"], "suite": suite, "step": step.name, "command": command,
                        "environment": invocation["environment"], "result": result}
                record.write(json.dumps(line) + "\n")
                record.flush()
                print(json.dumps(result), flush=True)
    print(f"bench {suite}: {time.monotonic() - started:.0f} s, recorded in {os.path.relpath(out, ROOT)} "
          f"(invocation {invocation['id']})", file=sys.stderr)


def reproduces(suite: str) -> bool:
    """Each README figure that states a range from ``suite``'s record, against the record's newest
    invocation: its median inside the range the invocation before it gave (what the README stated
    when the newest run began), one JSON line each. True where every one is."""
    sys.path.insert(0, os.path.join(ROOT, "docs", "_hooks"))
    import records  # docs/_hooks/records.py: what renders the README's figures renders them here

    with open(os.path.join(ROOT, "README.md")) as f:
        checked = records.reproduced(ROOT, suite.replace("-", "_"), f.read())
    if not checked:
        raise SystemExit(f"bench: the README states no range from {suite}'s record")
    for figure in checked:
        print(json.dumps(figure))
    return all(figure["within"] for figure in checked)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=[*SUITES, "list", "reproduces"])
    parser.add_argument("of", nargs="?", choices=list(SUITES), help="reproduces: the suite whose newest run to check")
    parser.add_argument("--out", help="the record to append to (default: bench/results/<suite>.jsonl)")
    parser.add_argument("--steps", help="run only these steps of the suite, by name (comma-separated)")
    args = parser.parse_args(argv)
    if args.suite == "list":
        for name, steps in SUITES.items():
            print(name)
            for step in steps:
                print(f"  {step.name}: python bench/{step.script} {' '.join(step.args)}".rstrip())
        return
    if args.suite == "reproduces":
        if not args.of:
            parser.error("reproduces: name the suite, e.g. python -m bench reproduces cpu-quick")
        raise SystemExit(0 if reproduces(args.of) else 1)
    out = args.out or os.path.join(HERE, "results", f"{args.suite.replace('-', '_')}.jsonl")
    run(args.suite, out, args.steps.split(",") if args.steps else None)


if __name__ == "__main__":
    main()

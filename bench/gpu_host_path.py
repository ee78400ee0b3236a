"""What a large model's checkpoint costs on a GPU node's own hardware, without TensorFlow.

W3's figures for a 10 GiB state on a GPU node (docs/benchmarks/checkpoints.md) are built from
the rates this script measures on the node itself: an asynchronous ``raytf.report`` pauses for
the state's device-to-host copy into fresh host memory (``checkpoint/state.py`` makes fresh
copies per checkpoint), the background thread then writes the files (into ``/dev/shm`` when it
holds them), sums them (zlib's CRC32, ``checkpoint/files.py``) and uploads them, and a restart
that reads the checkpoint from memory copies it back host-to-device.

It runs where TensorFlow cannot be installed (a lent GPU machine with no package index): the GPU
copies go through PyTorch, which issues the same ``cudaMemcpy`` kinds TensorFlow does (pageable
host memory, fresh or reused, and pinned for comparison). One JSON line per measurement, then a
summary line; sizes in GiB, rates in GB/s.

    python bench/gpu_host_path.py --gib 10 [--dir /tmp] [--repeat 2]

``--tensorflow`` measures raytf's own copy instead (``checkpoint/state.py``'s ``host_copy`` of a
``--gib`` variable, on the GPU where TensorFlow sees one, else a host table in copy-on-read mode,
as an embedding's): the seconds of each of four copies and the pages each faulted in per GiB (1.0:
every page new; 0: memory TensorFlow's allocator had used before); with ``--prewarm`` after
``state.prewarm``, as ``ReportCallback`` has it done after a run's first step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import zlib

import numpy as np

GIB = 1 << 30


def _emit(record: dict) -> dict:
    print(json.dumps(record), flush=True)
    return record


def _timed(name: str, nbytes: int, fn, repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    best = min(times)
    return _emit({"measure": name, "gib": round(nbytes / GIB, 3), "seconds": [round(t, 3) for t in times],
                  "gb_per_s_best": round(nbytes / best / 1e9, 2)})


def _node() -> dict:
    info = {"cpus": os.cpu_count()}
    for mount in ("/dev/shm", "/tmp"):
        usage = shutil.disk_usage(mount) if os.path.isdir(mount) else None
        info[f"free_gib {mount}"] = round(usage.free / GIB, 1) if usage else None
    with open("/proc/meminfo") as meminfo:
        info["mem_total_gib"] = round(int(meminfo.readline().split()[1]) / (1 << 20), 1)
    try:
        query = "name,pcie.link.gen.current,pcie.link.width.current,memory.total"
        info["gpu"] = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    return _emit({"measure": "node", **info})


def _host(nbytes: int, repeat: int) -> tuple[list[dict], np.ndarray]:
    source = np.ones(nbytes, dtype=np.uint8)
    into = np.empty_like(source)
    into.fill(0)
    out = [_timed("host copy, fresh buffer", nbytes, lambda: source.copy(), repeat),
           _timed("host copy, reused buffer", nbytes, lambda: np.copyto(into, source), repeat)]
    del into
    one = memoryview(source[:min(GIB, nbytes)])
    out.append(_timed("crc32 (zlib, one core)", len(one), lambda: zlib.crc32(one), repeat))
    return out, source


def _storage(source: np.ndarray, directory: str, name: str) -> list[dict]:
    path = os.path.join(directory, "raytf-gpu-host-path.bin")
    chunk = 64 << 20
    view = memoryview(source)

    def write() -> None:
        with open(path, "wb", buffering=0) as f:
            for offset in range(0, len(view), chunk):
                f.write(view[offset:offset + chunk])
            os.fsync(f.fileno())

    def read() -> None:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass

    buffer = bytearray(chunk)
    out = [_timed(f"write + fsync {name}", source.nbytes, write, 1)]
    try:
        with open("/proc/sys/vm/drop_caches", "w") as caches:  # root only: a cold read
            caches.write("3\n")
        cold = True
    except OSError:
        cold = False
    out.append(_timed(f"read {name} ({'cold' if cold else 'page cache'})", source.nbytes, read, 1))
    os.unlink(path)
    return out


def _gpu(nbytes: int, repeat: int) -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return [_emit({"measure": "gpu", "skipped": "no CUDA device"})]
    device = torch.device("cuda")
    state = torch.ones(nbytes, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()

    def synced(fn):
        def run() -> None:
            fn()
            torch.cuda.synchronize()
        return run

    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(0)  # first touch: the pages exist
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    out = [
        _timed("device to host, fresh pageable buffer (report's pause)", nbytes,
               synced(lambda: state.to("cpu")), max(repeat, 3)),
        _timed("device to host, reused pageable buffer", nbytes, synced(lambda: pageable.copy_(state)), repeat),
        _timed("device to host, pinned buffer", nbytes, synced(lambda: pinned.copy_(state)), repeat),
        _timed("host to device, pageable (restore from memory)", nbytes, synced(lambda: state.copy_(pageable)),
               repeat),
        _timed("host to device, pinned", nbytes, synced(lambda: state.copy_(pinned)), repeat),
    ]
    del state, pageable, pinned
    torch.cuda.empty_cache()
    return out


def _tensorflow(nbytes: int, prewarm: bool) -> list[dict]:
    import resource

    import tensorflow as tf

    from raytf._internal.checkpoint import state as _state

    on_gpu = bool(tf.config.list_physical_devices("GPU"))
    rows = nbytes // (4 * 1024)
    with tf.device("/GPU:0" if on_gpu else "/CPU:0"):
        variable = tf.Variable(tf.zeros([rows, 1024]))
    if not on_gpu:  # a sparse update puts a host table in copy-on-read mode: report copies it
        variable.scatter_add(tf.IndexedSlices(tf.ones([1, 1024]), tf.constant([0], tf.int64)))
    out = []
    if prewarm:  # what ReportCallback does after the first step, where RAYTF_PREWARM_HOST_COPIES=1
        from raytf._internal import env as _env

        os.environ[_env.PREWARM_HOST_COPIES] = "1"
        start = time.perf_counter()
        _state.prewarm({"table": variable}).result()
        out.append(_emit({"measure": "raytf prewarm (background)", "gib": round(nbytes / GIB, 3),
                          "seconds": [round(time.perf_counter() - start, 3)]}))
    for copy in range(4):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        host = _state.host_copy({"table": variable})
        seconds = time.perf_counter() - start
        faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        out.append(_emit({"measure": f"raytf host copy {copy + 1} ({'GPU' if on_gpu else 'host'} variable)",
                          "gib": round(nbytes / GIB, 3), "seconds": [round(seconds, 3)],
                          "gb_per_s_best": round(nbytes / seconds / 1e9, 2),
                          "pages_faulted_per_gib_page": round(faulted * 4096 / nbytes, 2)}))
        host.release()
        del host
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=10.0, help="size of the state (GiB)")
    parser.add_argument("--dir", default="/tmp", help="local directory for the storage write")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU copies")
    parser.add_argument("--gpu-only", action="store_true", help="only the GPU copies")
    parser.add_argument("--tensorflow", action="store_true", help="raytf's own host copy (see above)")
    parser.add_argument("--prewarm", action="store_true", help="with --tensorflow: state.prewarm before the copies")
    parser.add_argument("--processes", type=int, default=1,
                        help="with --tensorflow: the copies in this many processes, one after the other (a process's "
                             "first copy maps its pages), each line saying its process as its repeat")
    args = parser.parse_args()
    nbytes = int(args.gib * GIB)
    if args.tensorflow and args.processes > 1:
        for repeat in range(args.processes):
            command = [sys.executable, os.path.abspath(__file__), "--gib", str(args.gib), "--tensorflow"]
            done = subprocess.run(command + (["--prewarm"] if args.prewarm else []), capture_output=True, text=True,
                                  check=True)
            for line in done.stdout.splitlines():
                if line.startswith("{"):
                    print(json.dumps({"repeat": repeat, **json.loads(line)}), flush=True)
        return
    if args.tensorflow:
        _tensorflow(nbytes, args.prewarm)
        return
    records = [_node()] if not args.gpu_only else []
    if not args.no_gpu:
        records += _gpu(nbytes, args.repeat)
    if args.gpu_only:
        return
    host, source = _host(nbytes, args.repeat)
    records += host
    if shutil.disk_usage("/dev/shm").free > nbytes * 1.1:
        records += _storage(source, "/dev/shm", "/dev/shm")
    records += _storage(source, args.dir, args.dir)
    summary = {r["measure"]: r.get("gb_per_s_best") for r in records if "gb_per_s_best" in r}
    _emit({"measure": "summary", "gib": args.gib, "gb_per_s": summary})


if __name__ == "__main__":
    main()

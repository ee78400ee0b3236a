"""Check every hook against the installed TensorFlow, Keras, tf-keras and Ray, for real.

    python -m raytf._internal.hooks            # every hook's probe and behaviour; exit 1 if any broke
    python -m raytf._internal.hooks --json     # one JSON object per hook, for a report
    python -m raytf._internal.hooks --address auto   # Ray's hooks against a running cluster

Each hook's behaviour check uses it as raytf does (it runs TensorFlow ops, so it runs here, in a
process of its own, never in a worker). Ray's ask a connected Ray: with no ``--address``, a local
one is started for them and stopped after. ``nox -s next`` runs this on the newest pre-releases.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Optional

from raytf._internal import hooks


def check(hook: hooks.Hook) -> dict:
    report = {
        "hook": hook.name,
        "library": hook.library,
        "version": hooks.version(hook.library),
        "probe": "ok",
        "behaviour": "ok" if hook.behaves is not None else "none",
    }
    try:
        hook.check()
    except Exception as error:  # noqa: BLE001 - reported, every hook checked
        report["probe"] = str(error)
    try:
        hook.check_behaviour()
    except Exception as error:  # noqa: BLE001 - as above
        report["behaviour"] = str(error)
    return report


def _ignoring_failure(behaves: Callable[[], None]) -> None:
    """Run a behaviour check ahead; a failure is not cached, so the hook's own check meets it again."""
    try:
        behaves()
    except Exception:  # noqa: BLE001 - reported by the hook's check
        pass


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytf._internal.hooks", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per hook")
    parser.add_argument("--address", help="a running Ray cluster for Ray's hooks (default: start a local one)")
    args = parser.parse_args(argv)
    # TensorFlow's first: the eager context starts before any Ray worker could want it otherwise. The
    # checks that run clusters of processes of their own start together, in threads, and are
    # waited for after the others (each such check runs once a process: a second hook's is cached).
    local = [h for h in hooks.all_hooks() if not h.needs_ray]
    apart = list({h.behaves: None for h in local if h.in_processes and h.behaves is not None})
    # The libraries load here, before the threads start: no thread then imports while another loads
    # TensorFlow, whose 2.16 imports distutils under the global import lock (run_check_script).
    for library in sorted({h.library for h in local}):
        hooks.version(library)
    with ThreadPoolExecutor(max(1, len(apart))) as pool:
        started = [pool.submit(_ignoring_failure, behaves) for behaves in apart]
        reports = [check(h) for h in local if not h.in_processes]
        wait(started)
    reports += [check(h) for h in local if h.in_processes]  # their checks' outcomes, from the cache
    with_ray = [h for h in hooks.all_hooks() if h.needs_ray]
    import ray

    ray.init(
        address=args.address or "local",
        num_cpus=None if args.address else 1,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        reports += [check(h) for h in with_ray]
    finally:
        ray.shutdown()
    broken = [r for r in reports if r["probe"] != "ok" or r["behaviour"] not in ("ok", "none")]
    for report in reports:
        if args.json:
            print(json.dumps(report, sort_keys=True))
        else:
            state = "ok" if report not in broken else "BROKEN"
            print(f"{state:6} {report['hook']:38} {report['library']} {report['version']}")
    for report in broken if not args.json else []:
        print(f"\n{report['hook']}:\n  probe: {report['probe']}\n  behaviour: {report['behaviour']}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

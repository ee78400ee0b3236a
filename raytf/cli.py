"""The ``raytf`` command.

    raytf launch --num-workers 2 [--gpus-per-worker G] ... -- python my_script.py ARGS
    raytf runs --storage-path ~/raytf_results
    raytf --version

Arguments are parsed into raytf's configs, then the same function a Python
user calls runs (``raytf.launch``); a bad argument is an error naming it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from raytf.config import PLACEMENT_STRATEGIES, KERAS_VERSIONS


def _parser() -> argparse.ArgumentParser:
    from raytf import __version__

    parser = argparse.ArgumentParser(prog="raytf", description="Distributed TensorFlow on Ray.")
    parser.add_argument("--version", action="version", version=f"raytf {__version__}")
    commands = parser.add_subparsers(dest="action", metavar="{launch,runs}")
    launch = commands.add_parser(
        "launch",
        help="run an unmodified TF_CONFIG script on Ray actors",
        usage="raytf launch --num-workers N [options] -- COMMAND [ARGS...]",
    )
    launch.add_argument("--num-workers", type=int, required=True)
    launch.add_argument("--gpus-per-worker", type=float, default=0)
    launch.add_argument("--cpus-per-worker", type=float, default=1)
    launch.add_argument(
        "--placement",
        default="PACK",
        choices=PLACEMENT_STRATEGIES + tuple(p.lower() for p in PLACEMENT_STRATEGIES),
        metavar="{" + ",".join(PLACEMENT_STRATEGIES) + "}",
    )
    launch.add_argument("--max-failures", type=int, default=0, help="lost ranks or nodes survived")
    launch.add_argument(
        "--storage-path",
        default=None,
        help="where the run's directories are (default: $RAYTF_STORAGE_PATH or ~/raytf_results)",
    )
    launch.add_argument("--name", default=None, help="run name; the same name resumes from the script's backup")
    launch.add_argument(
        "--keras",
        default="auto",
        choices=KERAS_VERSIONS,
        help="tf_keras: TF_USE_LEGACY_KERAS=1 (for scripts written for Keras 2's model.fit)",
    )
    launch.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the script (repeatable)",
    )
    launch.add_argument(
        "--ps",
        type=int,
        default=None,
        metavar="N",
        help="parameter servers: run the script as a parameter-server cluster (chief, workers, ps)",
    )
    launch.add_argument("--chief", action="store_true", help="a chief task (implied by --ps)")
    launch.add_argument("--evaluator", action="store_true", help="an evaluator task beside the cluster (with --ps)")
    launch.add_argument("--cpus-per-ps", type=float, default=1)
    launch.add_argument("script", nargs=argparse.REMAINDER, help="after --: the script and its arguments")
    runs = commands.add_parser("runs", help="the runs in a storage path: attempts, latest checkpoint, last metrics")
    runs.add_argument("--storage-path", default=None)
    return parser


def _launch(args: argparse.Namespace) -> int:
    import raytf

    command = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not command:
        raise raytf.ConfigError("raytf launch: give the command to run after --, e.g. -- python train.py")
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise raytf.ConfigError(f"raytf launch --env {item!r}: write NAME=VALUE")
        env[name] = value
    if args.ps is None and (args.chief or args.evaluator):
        raise raytf.ConfigError(
            "raytf launch: --chief and --evaluator are parameter-server tasks; add --ps N "
            "(the number of parameter servers)"
        )
    if args.ps is not None:
        scaling: raytf.ScalingConfig | raytf.ParameterServerScaling = raytf.ParameterServerScaling(
            num_workers=args.num_workers,
            num_ps=args.ps,
            num_evaluators=int(args.evaluator),
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            cpus_per_ps=args.cpus_per_ps,
            cpus_per_chief=args.cpus_per_ps,
            cpus_per_evaluator=args.cpus_per_ps,
            placement=args.placement,
        )
    else:
        scaling = raytf.ScalingConfig(
            num_workers=args.num_workers,
            cpus_per_worker=args.cpus_per_worker,
            gpus_per_worker=args.gpus_per_worker,
            placement=args.placement,
        )
    try:
        raytf.launch(
            command,
            scaling=scaling,
            run=raytf.RunConfig(
                name=args.name,
                storage_path=args.storage_path,
                failure_config=raytf.FailureConfig(max_failures=args.max_failures),
            ),
            tensorflow=raytf.TensorflowConfig(keras=args.keras, worker_env=env),
        )
    except raytf.TrainingFailedError as error:
        print(f"raytf launch: {error.failure.describe()}", file=sys.stderr)
        code = error.failure.exit_code
        return code if code is not None and code > 0 else 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    import raytf

    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.action == "launch":
            return _launch(args)
        if args.action == "runs":
            from raytf._internal.runs import print_runs

            print_runs(args.storage_path)
            return 0
    except raytf.ConfigError as error:
        parser.exit(2, f"raytf: error: {error}\n")
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())

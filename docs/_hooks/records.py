"""Benchmark tables rendered from the records ``python -m bench`` keeps (bench/results/<suite>.jsonl).

A page holds ``<!-- raytf:bench:<record>:<step> -->`` (``<!-- raytf:bench:cpu_quick:w1_spe1 -->``) where
the table goes: the newest invocation of that record, the step's systems with the median of their
runs and the range, each against raytf, and under it the command, commit, date, machine and versions
it ran with. No figure of such a table is typed by hand.
"""

from __future__ import annotations

import json
import os
import statistics

# What each system of bench/throughput.py is, as a table row says it.
SYSTEMS = {
    "raytf": "raytf, tf-keras `model.fit` on `get_dataset_shard`",
    "raytf_keras3": "raytf, Keras 3 `raytf.keras.fit` on `get_dataset_shard`",
    "plain_mwms": "plain MultiWorkerMirroredStrategy, tf-keras `model.fit`, data in memory, TF_CONFIG by hand",
    "ray_train": "Ray Train `TensorflowTrainer`, `to_tf`, tf-keras `model.fit` as raytf runs it",
    "ray_train_as_documented": "Ray Train `TensorflowTrainer`, `model.fit(to_tf(...))` as its examples do",
}


def newest_invocation(root: str, record: str, step: str = "") -> list[dict]:
    """The lines of the newest invocation in ``bench/results/<record>.jsonl`` (that ran ``step``,
    where one is named: ``python -m bench <suite> --steps`` runs part of a suite into its record)."""
    path = os.path.join(root, "bench", "results", f"{record}.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"docs: no benchmark record {path} (python -m bench writes it)")
    lines = [json.loads(line) for line in open(path) if line.strip()]
    if step:
        lines = [line for line in lines if line["step"] == step]
    if not lines:
        raise ValueError(f"docs: {path} holds no invocation" + (f" with runs of step {step!r}" if step else ""))
    newest = lines[-1]["invocation"]
    return [line for line in lines if line["invocation"] == newest]


# Steps whose lines are not samples/s per system: the columns their table shows, (result key,
# header, how its values read: "n" a number, "%" a share, shown in percent).
COLUMNS = {
    "control_plane": [
        ("workers", "workers (simulated)", "n"),
        ("driver_ms_per_round", "driver CPU per poll round, ms", "n"),
        ("driver_core_share", "driver's share of one core, training", "%"),
        ("calls_per_s", "driver's Ray calls per second", "n"),
        ("startup_rounds", "rounds to release the start barrier, per attempt", "n"),
        ("decision_rounds", "rounds from a loss to the restart decision", "n"),
        ("decision_ms", "driver CPU in that round, ms", "n"),
    ],
}


def _cell(value, kind: str = "n") -> str:
    if isinstance(value, list):
        return ", ".join(_cell(v, kind) for v in value)
    if kind == "%" and isinstance(value, (int, float)):
        return f"{value:.2%}"
    return _number(value) if isinstance(value, (int, float)) else str(value)


def _source(first: dict, record: str) -> str:
    environment = first["environment"]
    machine, versions = environment["machine"], environment["versions"]
    libraries = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    return (f"`{first['command']}` (`python -m bench {first['suite']}`, invocation `{first['invocation']}` in "
            f"`bench/results/{record}.jsonl`): commit `{environment['commit']}`, {environment['date'][:10]}, "
            f"{machine['cores']} cores ({machine['cpu'] or machine['system']}), {libraries}.")


def columns_table(lines: list[dict], record: str, step: str) -> str:
    """A step whose lines are rows (``COLUMNS``): each result line with a first column, as printed."""
    columns = COLUMNS[step]
    rows = [line["result"] for line in lines if columns[0][0] in line["result"]]
    if not rows:
        raise ValueError(f"docs: the newest invocation of {record} has no rows of step {step!r}")
    out = ["| " + " | ".join(header for _, header, _ in columns) + " |",
           "| " + " | ".join("---:" for _ in columns) + " |"]
    out += ["| " + " | ".join(_cell(row.get(key, ""), kind) for key, _, kind in columns) + " |" for row in rows]
    return "\n".join(out + ["", _source(lines[0], record)]) + "\n"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def bench_table(root: str, record: str, step: str) -> str:
    """The table of ``step`` in the newest invocation of ``record``, with where it comes from."""
    try:
        lines = newest_invocation(root, record, step)
    except ValueError:
        raise ValueError(f"docs: the newest invocation of {record} has no runs of step {step!r}") from None
    if step in COLUMNS:
        return columns_table(lines, record, step)
    runs: dict[str, list[dict]] = {}
    for line in lines:
        result = line["result"]
        if "system" in result and "samples_per_s" in result:
            runs.setdefault(result["system"], []).append(result)
    if not runs:
        raise ValueError(f"docs: the newest invocation of {record} has no runs of step {step!r}")
    median = {system: statistics.median(r["samples_per_s"] for r in rs) for system, rs in runs.items()}
    ours = "raytf" if "raytf" in median else next(iter(median))
    # raytf's row first; each row's ratio is raytf's samples/s over that row's, as the header says.
    out = ["| system | samples/s, median (range) | runs | final loss | first row's samples/s ÷ this row's |",
           "| --- | ---: | ---: | ---: | ---: |"]
    for system, rs in sorted(runs.items(), key=lambda kv: kv[0] != ours):
        speeds = [r["samples_per_s"] for r in rs]
        spread = f"{_number(median[system])} ({_number(min(speeds))}-{_number(max(speeds))})"
        loss = statistics.median(r["loss"] for r in rs if "loss" in r) if any("loss" in r for r in rs) else None
        ratio = "1.00" if system == ours else f"{median[ours] / median[system]:.2f}×"
        out.append(f"| {SYSTEMS.get(system, system)} | {spread} | {len(rs)} | "
                   f"{'' if loss is None else f'{loss:.3f}'} | {ratio} |")
    out += ["", _source(lines[0], record)]
    return "\n".join(out) + "\n"

"""Benchmark tables rendered from the records ``python -m bench`` keeps (bench/results/<suite>.jsonl).

A page holds ``<!-- raytf:bench:<record>:<step> -->`` (``<!-- raytf:bench:cpu_quick:w1_spe1 -->``) where
the table goes: the newest invocation of that record, the step's systems with the median of their
runs and the range, each against raytf, and under it the command, commit, date, machine and versions
it ran with. No figure of such a table is typed by hand.
"""

from __future__ import annotations

import json
import os
import re
import statistics
from typing import Optional

# What each system of bench/throughput.py is, as a table row says it.
SYSTEMS = {
    "raytf": "raytf, tf-keras `model.fit` on `get_dataset_shard`",
    "raytf_keras3": "raytf, Keras 3 `raytf.keras.fit` on `get_dataset_shard`",
    "plain_mwms": "plain MultiWorkerMirroredStrategy, tf-keras `model.fit`, data in memory, TF_CONFIG by hand",
    "ray_train": "Ray Train `TensorflowTrainer`, `to_tf`, tf-keras `model.fit` as raytf runs it",
    "ray_train_as_documented": "Ray Train `TensorflowTrainer`, `model.fit(to_tf(...))` as its examples do",
    "raytf_warm": "raytf, `FailureConfig(warm_standby=True)`",
}


def _keras_path(result: dict):
    if "path" not in result:
        return None
    loop = "tf-keras `model.fit`" if result["path"] == "tf_keras" else "Keras 3 `raytf.keras.fit`"
    return f"{loop}, steps_per_execution {result['steps_per_execution']}"


# What each path of bench/ingest.py is, as a table row says it.
INGEST_PATHS = {
    "raytf_planned_cached": "raytf, `cache=True`, exactly once (the default)",
    "raytf_planned_cached_shuffled": "raytf, `cache=True`, `shuffle=True`, exactly once",
    "raytf_planned_streaming": "raytf, `cache=False`, exactly once",
    "raytf_cached": "raytf, `cache=True`, `exactly_once=False` (`streaming_split`)",
    "raytf_cached_shuffled": "raytf, `cache=True`, `shuffle=True`, `exactly_once=False`",
    "raytf_streaming": "raytf, `cache=False`, `exactly_once=False`",
    "from_tensor_slices": "`tf.data.Dataset.from_tensor_slices(...).batch(...)` over the same arrays",
    "ray_to_tf": "Ray `DataIterator.to_tf`",
}

# What each configuration of bench/w2.py is, as a table row says it.
W2_CONFIGS = {
    "plain_mwms": "plain MultiWorkerMirroredStrategy, float32",
    "raytf": "raytf, float32 (one fused all-reduce, TensorFlow's default)",
    "raytf_per_variable": "raytf, `bytes_per_pack=1` (one all-reduce per variable)",
    "raytf_packs_4mb": "raytf, `bytes_per_pack=4 MiB`",
    "raytf_bfloat16": "raytf, `gradient_compression=\"bfloat16\"`",
    "raytf_bfloat16_ef": "raytf, bfloat16 + `error_feedback=True`",
    "raytf_float16_ef": "raytf, float16 + `error_feedback=True`",
    "raytf_accumulate4": "raytf, `accumulate_gradients(model, steps=4)`",
    "raytf_bfloat16_ef_accumulate4": "raytf, bfloat16 + error feedback + `accumulate_gradients(steps=4)`",
    "raytf_local_sgd2": "raytf, `local_sgd(model, steps=2)`",
    "raytf_local_sgd4": "raytf, `local_sgd(model, steps=4)`",
    "raytf_bfloat16_ef_local_sgd4": "raytf, bfloat16 + error feedback + `local_sgd(steps=4)`",
    "raytf_float16_ef_local_sgd4": "raytf, float16 + error feedback + `local_sgd(steps=4)`",
}


def _w2_config(result: dict):
    if "config" not in result:
        return None
    megabytes = result["allreduce_bytes_per_sample"] / 1e6
    return f"{W2_CONFIGS.get(result['config'], result['config'])}; {megabytes:.2f} MB all-reduced per sample"


def _phases(runs: list[dict]) -> str:
    """bench/startup.py's runs of one system: each phase's median seconds."""
    keys = [k for k in runs[0].get("phases", {}) if k not in ("attempt", "total")]
    return ", ".join(f"{k.replace('_', ' ')} {statistics.median(r['phases'][k] for r in runs):.2f}" for k in keys)


# What each path of bench/tfrecord_ingest.py is, as a table row says it.
FILE_PATHS = {
    "tf_tfrecord_dataset": "TensorFlow: `TFRecordDataset` + `batch` + `parse_example` + `prefetch`",
    "tf_tfrecord_parallel": "TensorFlow: the same with `num_parallel_reads` and `num_parallel_calls` AUTOTUNE",
    "tf_tfrecord_shuffled": "TensorFlow's shuffled recipe: files shuffled, `interleave`, `shuffle(8192)`, then as above",
    "raytf_tfrecord_files": "`raytf.data.tfrecord_files`, each worker reading its chunks",
    "raytf_tfrecord_files_shuffled": "`raytf.data.tfrecord_files`, `shuffle=True` (chunks reordered, rows permuted "
                                     "in windows of 8,192)",
    "raytf_parquet_files": "`raytf.data.parquet_files`",
    "raytf_parquet_files_shuffled": "`raytf.data.parquet_files`, `shuffle=True`",
    "raytf_read_rows_per_s": "`raytf.data.read_tfrecords` (Ray Data): its first read of the files",
    "raytf_planned_cached": "`raytf.data.read_tfrecords` (Ray Data, materialized), every epoch after the first "
                            "read, `cache=True`",
    "raytf_planned_streaming": "the same, `cache=False`",
    "ray_to_tf": "Ray Data's own `read_tfrecords` + `to_tf` (each Example parsed in Python)",
    "raytf_count_rows_per_s": "the driver counting the records (once per run, reading headers)",
}


# Steps whose runs are grouped by something other than ``system``: (the row a result belongs to, or
# None for a line that is no run, and the figure a row shows).
GROUPS = {
    "keras_paths": (_keras_path, "samples_per_s"),
    "ingest": (lambda r: INGEST_PATHS.get(r.get("path", "")), "rows_per_s"),
    "w2": (_w2_config, "samples_per_s"),
    "startup": (lambda r: r.get("system"), "to_first_step_s"),
    "file_ingest": (lambda r: FILE_PATHS.get(r.get("path", "")), "rows_per_s"),
}
# What a step's figure is called in its table's header (samples/s where not named here); the steps
# whose figure is a time (lower is better).
UNITS = {"to_first_step_s": "seconds to the first step"}
# A last column some steps add, from the runs of each row.
DETAILS = {"startup": ("phases, median s", _phases)}
# Steps whose table starts from an anchor's row, each row's ratio to it (the row's label).
ANCHORED = {"w2": W2_CONFIGS["plain_mwms"], "file_ingest": FILE_PATHS["tf_tfrecord_dataset"]}


def newest_invocation(root: str, record: str, step: str = "", before: int = 0) -> list[dict]:
    """The lines of the newest invocation in ``bench/results/<record>.jsonl`` (that ran ``step``,
    where one is named: ``python -m bench <suite> --steps`` runs part of a suite into its record);
    ``before``: of the one that many invocations older."""
    path = os.path.join(root, "bench", "results", f"{record}.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"docs: no benchmark record {path} (python -m bench writes it)")
    lines = [json.loads(line) for line in open(path) if line.strip()]
    if step:
        lines = [line for line in lines if line["step"] == step]
    if not lines:
        raise ValueError(f"docs: {path} holds no invocation" + (f" with runs of step {step!r}" if step else ""))
    invocations = list(dict.fromkeys(line["invocation"] for line in lines))
    if before >= len(invocations):
        raise ValueError(f"docs: {path} holds {len(invocations)} invocation(s)" + (f" of step {step!r}" if step else ""))
    chosen = invocations[-1 - before]
    return [line for line in lines if line["invocation"] == chosen]


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
    "poll_cost": [  # its "actors" part: real worker actors, polled three ways
        ("workers", "worker actors", "n"),
        ("direct_ms", "polling each worker: driver ms per round", "n"),
        ("direct_cpu_share", "its share of a core", "%"),
        ("direct_calls_per_s", "its calls per second", "n"),
        ("relay_ms", "relay actor: driver ms per round", "n"),
        ("relay_cpu_share", "its share of a core", "%"),
        ("thread_ms", "relay on a driver thread: ms per round", "n"),
        ("thread_cpu_share", "its share of a core", "%"),
    ],
    "restart_scaling": [
        ("workers", "workers (on 2 cores)", "n"),
        ("restart", "restart", "n"),
        ("kept_processes", "ranks kept in their processes", "n"),
        ("kill_to_first_step_s", "kill → first resumed step, s", "n"),
        ("components_s.detect", "detect", "n"),
        ("components_s.placement", "placement", "n"),
        ("components_s.actors", "actors", "n"),
        ("components_s.loading", "loading (TensorFlow, train_fn)", "n"),
        ("components_s.connect", "connect", "n"),
        ("components_s.first_step", "first step", "n"),
        ("first_start_s.total", "first attempt's start-up, s", "n"),
    ],
    "recovery": [  # each system's run with the kill
        ("system", "system", "n"),
        ("resume_s", "kill → first resumed step, s", "n"),
        ("steps_redone", "steps redone", "n"),
        ("steps_since_checkpoint", "steps since the checkpoint", "n"),
        ("retries", "retries", "n"),
        ("wall_vs_fault_free", "`fit()` wall vs fault-free", "n"),
        ("resume_components_s.detect", "detect", "n"),
        ("resume_components_s.stop", "stop", "n"),
        ("resume_components_s.placement", "placement", "n"),
        ("resume_components_s.actors", "actors", "n"),
        ("resume_components_s.loading", "loading", "n"),
        ("resume_components_s.connect", "connect", "n"),
        ("resume_components_s.dataset", "dataset shard", "n"),
        ("resume_components_s.model_and_restore", "model and restore", "n"),
        ("resume_components_s.first_step", "first step", "n"),
    ],
}
W3 = [  # bench/w3.py's runs: what each checkpoint cost the training
    ("system", "system", "n"),
    ("storage", "storage", "n"),
    ("blocked_s", "each checkpoint blocks rank 0, s", "n"),
    ("blocked_mean_s", "their mean, s", "n"),
    ("steps_per_s", "steps/s with checkpoints", "n"),
    ("steps_per_s_without", "steps/s without", "n"),
]
COLUMNS.update({
    "w3_ps": [  # bench/w3_ps.py: the table over parameter servers
        ("writer", "who writes the servers' parts", "n"),
        ("num_ps", "parameter servers", "n"),
        ("every", "a checkpoint every N steps", "n"),
        ("blocked_s", "each checkpoint blocks the chief, s", "n"),
        ("commit_s", "each one's commit, s", "n"),
        ("steps_per_s", "steps/s with checkpoints", "n"),
    ],
    "ps_faults": [  # bench/ps.py's runs with a worker killed
        ("system", "a worker killed", "n"),
        ("first_step_after_kill_s", "training goes on after, s (the other worker)", "n"),
        ("resume_s", "training goes on after, s (the group restarted)", "n"),
        ("replaced_s", "the replacement serves after, s", "n"),
        ("retries", "group restarts", "n"),
        ("steps_redone", "steps redone", "n"),
        ("steps", "steps run", "n"),
        ("scheduled", "steps scheduled", "n"),
    ],
    "large_files": [  # bench/large_files.py: one epoch over files larger than the object store
        ("reader", "reader", "n"),
        ("cache", "`get_dataset_shard(cache=...)` (blank: `True`, the default)", "n"),
        ("rows_trained_last_epoch", "rows trained", "n"),
        ("dataset_rows", "of", "n"),
        ("worker_peak_rss_mb", "each worker's peak memory, MB", "n"),
        ("rows_per_s", "rows/s", "n"),
        ("fit_wall_s", "`fit()` wall, s (the Ray Data path's includes reading the files into the object store)", "n"),
    ],
    "w3": W3,
    **{step: W3 for step in ("w3_local", "w3_local_every300", "w3_s3", "w3_layers", "w3_layers_tf_keras")},  # cpu-full's
    # runs that differ by it: a kept file's, and cpu-full's w3_allocator
    **{step: W3[:1] + [("worker_env", "worker environment", "n")] + W3[2:] for step in ("w3_env", "w3_allocator")},
    "w3_restores": [  # bench/w3.py --restores: a restart's restore of the checkpoint
        ("system", "system", "n"),
        ("storage", "storage", "n"),
        ("restore_s", "restore, s", "n"),
        ("steps_per_s", "steps/s after", "n"),
    ],
})
# The steps whose lines are bench/w3.py's, one per system's run.
W3_STEPS = ("w3", "w3_local", "w3_local_every300", "w3_s3", "w3_layers", "w3_layers_tf_keras", "w3_env", "w3_allocator",
            "w3_restores")
# Which result lines of such a step are rows (the others: another part, the summary).
ROWS = {"poll_cost": lambda result: result.get("part") == "actors", "recovery": lambda result: result.get("fault"),
        **{step: lambda result: "system" in result for step in W3_STEPS},
        "large_files": lambda result: "reader" in result, "ps_faults": lambda result: bool(result.get("fault")),
        "w3_ps": lambda result: "writer" in result}


# A system's name where a step's table means something narrower by it than W1's throughput does.
W3_SYSTEMS = {
    "raytf_async": 'raytf, `upload="async"` (the default)',
    "raytf_sync": 'raytf, `upload="sync"`',
    "ray_train_async": "Ray Train, `checkpoint_upload_mode` ASYNC",
    "ray_train_sync": "Ray Train, `checkpoint_upload_mode` SYNC",
    "raytf_memory": "raytf, from its copy in memory (the default)",
    "raytf_storage": "raytf, from storage (`restore_from_memory=False`)",
    "ray_train": "Ray Train, `get_checkpoint().as_directory()`",
    "local": "local directory",
    "s3": "loopback S3 (moto)",
}
PS_SYSTEMS = {"mwms": "`Trainer` (MWMS, ring all-reduce)", "raytf": "`Trainer` (MWMS, ring all-reduce)",
              "ps": "`ParameterServerTrainer`"}
STEP_SYSTEMS = {
    "w3_ps": {"chief": "the chief", "servers": "each server its own"},
    "ps": PS_SYSTEMS, "ps_faults": PS_SYSTEMS,
    "large_files": {"files": "`raytf.data.tfrecord_files` (each worker reads its chunks)",
                    "ray-data": "`raytf.data.read_tfrecords` (Ray Data, materialized)"},
    **{step: W3_SYSTEMS for step in W3_STEPS},
    "recovery": {"raytf": "raytf, cold restart (the default)"},
    "startup": {"raytf": "raytf `Trainer(...).fit()`, workers forked from the fork server (the default)",
                "raytf_spawn": "raytf `Trainer(...).fit()`, `start_method=\"spawn\"`",
                "plain_mwms": "plain MultiWorkerMirroredStrategy, two processes spawned with TF_CONFIG by hand"},
}


def _cell(value, kind: str = "n", names: Optional[dict] = None) -> str:
    if value is None:  # a setting that does not apply to the row
        return ""
    if isinstance(value, bool):  # a setting
        return f"`{value}`"
    if isinstance(value, dict):  # settings: a worker environment
        return ", ".join(f"`{k}={v}`" for k, v in value.items()) or "raytf's defaults"
    if isinstance(value, str):
        return (names or {}).get(value, SYSTEMS.get(value, value))
    if isinstance(value, list):
        return ", ".join(_cell(v, kind, names) for v in value)
    if kind == "%" and isinstance(value, (int, float)):
        return f"{value:.2%}"
    return _number(value) if isinstance(value, (int, float)) else str(value)


def _source(first: dict, record: str) -> str:
    if "kept" in first:
        return f"`{first['kept']}`, one line per run as the bench printed it (the machine: above)."
    environment = first["environment"]
    machine, versions = environment["machine"], environment["versions"]
    libraries = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    return (f"`{first['command']}` (`python -m bench {first['suite']}`, invocation `{first['invocation']}` in "
            f"`bench/results/{record}.jsonl`): commit `{environment['commit']}`, {environment['date'][:10]}, "
            f"{machine['cores']} cores ({machine['cpu'] or machine['system']}), {libraries}.")


def _get(result: dict, key: str):
    """``result[key]``, a dotted key reaching into nested objects (``.N`` into a list); "" where it
    is missing."""
    value: object = result
    for part in key.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return ""
    return value


def _round_ratios(results: list, key: str) -> list:
    """``field@by=a/b`` over ``results``: per round (the ``repeat`` a bench gives each run of a
    system, round by round), ``a``'s ``field`` over ``b``'s."""
    field, _, pair = key.partition("@")
    by, _, systems = pair.partition("=")
    a, _, b = systems.partition("/")
    rounds: dict = {}
    for result in results:
        if _is_number(result.get("repeat")) and _is_number(_get(result, field)):
            rounds.setdefault(result["repeat"], {})[str(_get(result, by))] = _get(result, field)
    return [r[a] / r[b] for _, r in sorted(rounds.items()) if a in r and b in r and r[b]]


def _median_and_range(values: list, show) -> str:
    """``values``' median shown, and their range where what is shown of them differs."""
    low, middle, high = (show(v) for v in (min(values), statistics.median(values), max(values)))
    return middle if low == high else f"{middle} ({low}-{high})"


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _spread(values: list, kind: str, names: Optional[dict]) -> str:
    """One cell over a row's runs: a number's median and, where the runs differ, its range; a list
    of numbers (one per checkpoint, per worker) the same, position by position."""
    if len(values) == 1 or not values:
        return _cell(values[0] if values else "", kind, names)
    if all(_is_number(v) for v in values):
        return _median_and_range(values, lambda v: _cell(v, kind))
    if all(isinstance(v, list) and v and all(_is_number(x) for x in v) for v in values) and len(
            {len(v) for v in values}) == 1:
        return ", ".join(_spread([v[i] for v in values], kind, names) for i in range(len(values[0])))
    return _cell(values[0], kind, names)


def columns_table(lines: list[dict], record: str, step: str) -> str:
    """A step whose lines are rows (``COLUMNS``): each result line with a first column, as printed;
    where a bench ran each row several times (``--repeats``: lines that say their ``repeat``, with
    the same settings in every column that is not a measure), one row of medians with their
    ranges, and the runs it is of."""
    columns = COLUMNS[step]
    keep = ROWS.get(step, lambda result: True)
    rows = [line["result"] for line in lines if columns[0][0] in line["result"] and keep(line["result"])]
    if not rows:
        raise ValueError(f"docs: the newest invocation of {record} has no rows of step {step!r}")
    groups: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        settings = [_get(row, key) for key, _, _ in columns]
        # A run the bench made again (its line says which ``repeat``) joins the row of its settings.
        same = json.dumps([v for v in settings if not _is_number(v) and not isinstance(v, list)], sort_keys=True)
        groups.setdefault(same if "repeat" in row else f"line {i}", []).append(row)
    repeated = any(len(runs) > 1 for runs in groups.values())
    measures = [_is_number(_get(rows[0], key)) or isinstance(_get(rows[0], key), list) for key, _, _ in columns]
    out = ["| " + " | ".join(header + (", median (range)" if repeated and measure else "")
                             for (_, header, _), measure in zip(columns, measures)) + (" | runs |" if repeated else " |"),
           "| " + " | ".join("---" if i == 0 and isinstance(_get(rows[0], key), str) else "---:"
                             for i, (key, _, _) in enumerate(columns)) + (" | ---: |" if repeated else " |")]
    names = STEP_SYSTEMS.get(step)
    for runs in groups.values():
        cells = [_spread([_get(run, key) for run in runs], kind, names) for key, _, kind in columns]
        out.append("| " + " | ".join(cells) + (f" | {len(runs)} |" if repeated else " |"))
    return "\n".join(out + ["", _source(lines[0], record)]) + "\n"


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def kept_lines(root: str, name: str) -> list[dict]:
    """The lines of ``bench/results/<name>.jsonl``, a bench's output kept as it printed it (before
    ``python -m bench`` wrapped each line with its invocation and environment), wrapped as a
    record's lines are; the page's text says where it ran."""
    path = os.path.join(root, "bench", "results", f"{name}.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"docs: no kept benchmark output {path}")
    # Only the JSON lines: some kept files hold a line Ray printed between the bench's own.
    return [{"kept": f"bench/results/{name}.jsonl", "result": json.loads(line)} for line in open(path)
            if line.startswith("{")]


def kept_table(root: str, name: str, step: str) -> str:
    """``<!-- raytf:kept:<name>:<step> -->``: the table of a kept output file, grouped and shown as
    ``step``'s runs are (``w1``: by system; ``w2``: by configuration, from the anchor)."""
    return bench_table(root, name, step, lines=kept_lines(root, name))


# Tables that show another part of a step's lines (a view: the table's name -> the step it reads).
VIEWS = {"ps_faults": "ps"}


def bench_table(root: str, record: str, step: str, lines: Optional[list[dict]] = None) -> str:
    """The table of ``step`` in the newest invocation of ``record`` (or of ``lines``, a kept
    file's: kept_table), with where it comes from."""
    if lines is None:
        try:
            lines = newest_invocation(root, record, VIEWS.get(step, step))
        except ValueError:
            raise ValueError(f"docs: the newest invocation of {record} has no runs of step {step!r}") from None
    if step in COLUMNS:
        return columns_table(lines, record, step)
    label, metric = GROUPS.get(step, (lambda r: r.get("system"), "samples_per_s"))
    unit = UNITS.get(metric, metric.replace("_per_s", "/s"))
    runs: dict[str, list[dict]] = {}
    for line in lines:
        result = line["result"]
        if label(result) is not None and metric in result:
            runs.setdefault(label(result), []).append(result)
    if not runs:
        raise ValueError(f"docs: the newest invocation of {record} has no runs of step {step!r}")
    median = {system: statistics.median(r[metric] for r in rs) for system, rs in runs.items()}
    anchor = next((s for s in median if step in ANCHORED and (s == ANCHORED[step] or s.startswith(ANCHORED[step] + ";"))),
                  None)
    ours = anchor or ("raytf" if "raytf" in median else next(iter(median)))
    # raytf's row first, each row's ratio raytf's samples/s over that row's; or, where the step has an
    # anchor (ANCHORED), the anchor's row first, each row's ratio its samples/s over the anchor's.
    losses = any("loss" in r for rs in runs.values() for r in rs)
    header = f"this row's {unit} ÷ the first row's" if anchor else f"first row's {unit} ÷ this row's"
    detail = DETAILS.get(step)
    out = [f"| system | {unit}, median (range) | runs |{' final loss |' if losses else ''} {header} |"
           + (f" {detail[0]} |" if detail else ""),
           "| --- | ---: | ---: |" + (" ---: |" if losses else "") + " ---: |" + (" --- |" if detail else "")]
    for system, rs in sorted(runs.items(), key=lambda kv: kv[0] != ours):
        speeds = [r[metric] for r in rs]
        # A line that is already a median (bench/ingest.py's) says of how many runs; it has no range here.
        spread = _number(median[system]) + (f" ({_number(min(speeds))}-{_number(max(speeds))})" if len(rs) > 1 else "")
        count = sum(r.get("samples", 1) for r in rs)
        loss = statistics.median(r["loss"] for r in rs if "loss" in r) if any("loss" in r for r in rs) else None
        ratio = "1.00" if system == ours else f"{(median[system] / median[ours]) if anchor else (median[ours] / median[system]):.2f}×"
        shown = f" {'' if loss is None else f'{loss:.3f}'} |" if losses else ""
        named = STEP_SYSTEMS.get(step, {}).get(system) or SYSTEMS.get(system, system)
        out.append(f"| {named} | {spread} | {count} |{shown} {ratio} |"
                   + (f" {detail[1](rs)} |" if detail else ""))
    out += ["", _source(lines[0], record)]
    return "\n".join(out) + "\n"


def _lines(root: str, name: str, step: str, before: int = 0) -> list[dict]:
    """A record's lines (its newest invocation that ran ``step``, or ``before`` older), or a kept
    output file's."""
    path = os.path.join(root, "bench", "results", f"{name}.jsonl")
    with open(path) as f:
        first = f.readline()
    if first.startswith("{") and "invocation" in json.loads(first):
        return newest_invocation(root, name, step, before)
    return kept_lines(root, name)


# One figure in prose (figure): <!-- raytf:figure:<file>:<where>:<key>[:<format>[:<mode>]] -->
FIGURE = re.compile(r"<!-- raytf:figure:(\w+):([^:>]*):([\w./|*@=]+)(?::([^:>]*))?(?::(\w+))? -->")


def figure(root: str, name: str, where: str, key: str, spec: str = "", mode: str = "") -> str:
    """``<!-- raytf:figure:<file>:<where>:<key>[:<format>[:<mode>]] -->``: one figure in a page's
    prose, read off ``bench/results/<file>.jsonl`` when the site is built, never typed.

    ``where``: ``name=value`` pairs, comma-separated, that pick the result lines (``step=`` picks a
    record's step; blank: every line with ``key``); ``key``: the field (dotted into nested objects,
    ``.N`` into a list, ``.*`` every number of a list), or ``a|b``, each line's ``a`` over its
    ``b``, or ``field@by=a/b``, round by round (the lines of one ``repeat``), the ``field`` of the
    line whose ``by`` is ``a`` over that of the line whose ``by`` is ``b`` (two systems of one
    invocation, each ratio from runs made minutes apart); ``name~=text`` picks lines whose field contains the text. ``format``: a format spec (``.2f``, ``.0%``, ``,.0f``), else 3 significant
    figures; ``mode``: the median of the lines picked (the default), ``range`` (their lowest and
    highest, ``0.06-0.11``), or ``both`` (``0.08 (0.06-0.11)``)."""
    values = figure_values(root, name, where, key)

    def show(value: float) -> str:
        return format(value, spec) if spec else _number(value)

    if mode == "range":
        low, high = show(min(values)), show(max(values))
        return low if low == high else f"{low}-{high}"
    if mode == "both":
        return _median_and_range(values, show)
    return show(statistics.median(values))


def figure_values(root: str, name: str, where: str, key: str, before: int = 0) -> list:
    """The numbers a figure marker's ``where`` and ``key`` pick (figure), from the newest
    invocation or the one ``before`` older."""
    pairs = dict(pair.split("=", 1) for pair in where.split(",") if pair)
    step = pairs.pop("step", "")
    # "name~=text": the field contains the text (a measure's label: bench/gpu_host_path.py's lines).
    contains = {name[:-1]: pairs.pop(name) for name in list(pairs) if name.endswith("~")}
    picked = [line["result"] for line in _lines(root, name, step, before)
              if all(str(_get(line["result"], k)) == v for k, v in pairs.items())
              and all(text in str(_get(line["result"], k)) for k, text in contains.items())]
    values = _round_ratios(picked, key) if "@" in key else []
    for result in picked if "@" not in key else []:
        if key.endswith(".*"):  # every number of a list: each run a bench made in one line
            listed = _get(result, key[:-2])
            values += [v for v in listed if _is_number(v)] if isinstance(listed, list) else []
            continue
        # "a|b": the line's a over its b (a run's speed with checkpoints over its speed without).
        parts = [_get(result, path) for path in key.split("|")]
        if all(_is_number(p) for p in parts) and all(parts[1:]):
            values.append(parts[0] / parts[1] if len(parts) == 2 else parts[0])
    if not values:
        raise ValueError(f"docs: no line of bench/results/{name}.jsonl where {where or 'any'} has a number {key!r}")
    return values


def reproduced(root: str, record: str, markdown: str) -> list[dict]:
    """Each figure of ``markdown`` that states a range from ``record`` (a FIGURE marker of mode
    ``both`` or ``range``), read off the record's invocation before the newest (what
    the page stated) and off the newest (a run since): whether the newest median falls in the range
    stated."""
    checked = []
    for found in FIGURE.finditer(markdown):
        name, where, key, spec, mode = (g or "" for g in found.groups())
        if name != record or mode not in ("both", "range"):
            continue
        stated, now = figure_values(root, name, where, key, before=1), figure_values(root, name, where, key)
        median = statistics.median(now)
        checked.append({"figure": f"{where}:{key}", "stated_range": [min(stated), max(stated)],
                        "median_now": median, "within": min(stated) <= median <= max(stated)})
    return checked

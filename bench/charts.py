"""The documentation's benchmark charts, drawn from the JSON lines the benches printed.

    python bench/charts.py --out DIR          # one SVG per chart into DIR

Each chart reads files in ``bench/results/`` (see its README for the command behind each) and
nothing else, so a figure on the site is the figure a bench printed. The docs build
(``mkdocs build``) draws them through ``docs/_hooks/generate.py``; a chart whose files are
missing is left out.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
from typing import Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
RAYTF, ANCHOR, OTHER = "#1f6feb", "#8b949e", "#d29922"


def lines(results: str, name: str) -> list[dict]:
    """The JSON objects of one results file (lines that are not JSON skipped), or [] if absent."""
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


def _medians(found: list[dict], systems: dict, value: Callable[[dict], Optional[float]], by: str = "system") -> dict:
    """Per system of ``systems`` (in its order; a line's ``by`` names it), the median of ``value``
    over its runs in ``found``."""
    runs: dict = {}
    for r in found:
        if r.get(by) in systems and value(r) is not None:
            runs.setdefault(r[by], []).append(value(r))
    return {system: statistics.median(runs[system]) for system in systems if system in runs}


def newest_step(results: str, record: str, step: str) -> list[dict]:
    """What ``step`` printed in the newest invocation of a ``python -m bench`` record that ran it."""
    ran = [line for line in lines(results, record) if line.get("step") == step]
    newest = ran[-1]["invocation"] if ran else None
    return [line["result"] for line in ran if line["invocation"] == newest]


def _svg(figure) -> bytes:  # noqa: ANN001 - a matplotlib Figure
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    plt.close(figure)
    return buffer.getvalue()


def _bars(title: str, unit: str, rows: list[tuple[str, float, str]], note: str = "") -> bytes:
    """Horizontal bars, one per (label, value, colour), top to bottom, each labelled with its value."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.3))
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    axes.barh(labels, values, color=[r[2] for r in rows][::-1])
    for y, value in enumerate(values):
        axes.text(value, y, f" {value:,.3g}" if value < 100 else f" {value:,.0f}", va="center", fontsize=9)
    axes.set_xlabel(unit)
    axes.set_title(title, fontsize=11, loc="left")
    axes.set_xlim(0, max(values) * 1.18)
    axes.spines[["top", "right"]].set_visible(False)
    if note:
        figure.text(0.01, 0.01, note, fontsize=8, color="#57606a")
    return _svg(figure)


def ingest(results: str) -> Optional[bytes]:
    found = {r["path"]: r["rows_per_s"] for r in newest_step(results, "cpu_full.jsonl", "ingest") if "path" in r}
    if not found:
        return None
    names = [("raytf_planned_cached", "raytf, cache=True (default)", RAYTF),
             ("raytf_planned_cached_shuffled", "raytf, cache=True, shuffle=True", RAYTF),
             ("raytf_planned_streaming", "raytf, cache=False", RAYTF),
             ("from_tensor_slices", "tf.data from_tensor_slices (arrays in memory)", ANCHOR),
             ("ray_to_tf", "Ray Data DataIterator.to_tf", OTHER)]
    return _bars("W1's rows into tf.data, one reader (bench/ingest.py)", "rows/s",
                 [(label, found[key], colour) for key, label, colour in names if key in found])


def file_ingest(results: str) -> Optional[bytes]:
    names = [("raytf_tfrecord_files", "raytf.data.tfrecord_files", RAYTF),
             ("raytf_tfrecord_files_shuffled", "raytf.data.tfrecord_files, shuffled", RAYTF),
             ("raytf_parquet_files", "raytf.data.parquet_files", RAYTF),
             ("tf_tfrecord_dataset", "TFRecordDataset + parse_example", ANCHOR),
             ("tf_tfrecord_parallel", "TFRecordDataset, parallel reads and parse", ANCHOR),
             ("tf_tfrecord_shuffled", "TFRecordDataset, interleave + shuffle buffer", ANCHOR),
             ("raytf_planned_cached", "raytf.data.read_tfrecords (object store, after one read)", RAYTF),
             ("ray_parquet_to_tf", "Ray Data read_parquet + to_tf", OTHER),
             ("ray_to_tf", "Ray Data read_tfrecords + to_tf", OTHER)]
    # Each path's median over the rounds of cpu-full's newest file_ingest run.
    found = _medians(newest_step(results, "cpu_full.jsonl", "file_ingest"), {key: None for key, _, _ in names},
                     lambda r: r.get("rows_per_s"), by="path")
    if not found:
        return None
    return _bars("Files into tf.data, one reader, medians of three rounds (bench/tfrecord_ingest.py)", "rows/s",
                 [(label, found[key], colour) for key, label, colour in names if key in found])


def w3_pause(results: str) -> Optional[bytes]:
    names = {"raytf_async": ("raytf (async, default)", RAYTF), "ray_train_async": ("Ray Train ASYNC", ANCHOR),
             "ray_train_sync": ("Ray Train SYNC", OTHER)}
    # Local disk, a checkpoint every 300 steps: each run's mean pause, the median of three runs.
    local = _medians(newest_step(results, "cpu_full.jsonl", "w3_local_every300"), names, lambda r: r.get("blocked_mean_s"))
    rows = [(f"{names[system][0]}, local", median, names[system][1]) for system, median in local.items()]
    # S3: each run's first checkpoint, the median of three runs.
    firsts = _medians(newest_step(results, "cpu_full.jsonl", "w3_s3"), names, lambda r: (r.get("blocked_s") or [None])[0])
    rows += [(f"{names[system][0]}, S3", median, names[system][1]) for system, median in firsts.items()]
    if not rows:
        return None
    return _bars("Training blocked by one 1 GiB checkpoint, W3 (bench/w3.py)", "seconds", rows,
                 "local: the mean pause of a run, a checkpoint every 300 steps; S3: a run's first checkpoint (later ones wait "
                 "for the previous upload to the loopback server); medians of three runs")


def w3_restore(results: str) -> Optional[bytes]:
    names = {"raytf_memory": ("raytf, from memory (default)", RAYTF), "raytf_storage": ("raytf, from storage", RAYTF),
             "ray_train": ("Ray Train, from storage", ANCHOR)}
    s3 = [r for r in newest_step(results, "cpu_full.jsonl", "w3_restores") if r.get("storage") == "s3"]
    medians = _medians(s3, names, lambda r: r.get("restore_s"))
    rows = [(names[system][0], median, names[system][1]) for system, median in medians.items()]
    if not rows:
        return None
    return _bars("Restoring 1 GiB after a restart, loopback S3, W3 (bench/w3.py --restores)", "seconds", rows,
                 "the median of three runs (python -m bench cpu-full --steps w3_restores)")


def recovery(results: str) -> Optional[bytes]:
    import matplotlib.pyplot as plt

    runs = []
    cpu = newest_step(results, "cpu_full.jsonl", "recovery")
    for found, machine in ((cpu, "2-core CPU"), (lines(results, "h100_recovery.jsonl"), "H100")):
        for r in found:
            if r.get("fault") and r.get("resume_components_s"):
                kind = "warm standbys" if r["system"].endswith("warm") else "cold restart"
                runs.append((f"{machine}, {kind}", r["resume_components_s"]))
    if not runs:
        return None
    parts = ["detect", "placement", "actors", "loading", "connect", "dataset", "model_and_restore", "first_step"]
    colours = plt.get_cmap("tab10").colors
    figure, axes = plt.subplots(figsize=(8, 0.5 * len(runs) + 1.8))
    for y, (_label, components) in enumerate(runs[::-1]):
        left = 0.0
        for i, part in enumerate(parts):
            width = components.get(part, 0.0)
            axes.barh(y, width, left=left, color=colours[i], label=part.replace("_", " ") if y == 0 else None)
            left += width
        axes.text(left, y, f" {left:.2f} s", va="center", fontsize=9)
    axes.set_yticks(range(len(runs)), [r[0] for r in runs][::-1])
    axes.set_xlabel("seconds from the kill to the first resumed step")
    axes.set_title("W1, a worker killed: where the restart's seconds go (bench/recovery.py)", fontsize=11, loc="left")
    axes.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
    axes.spines[["top", "right"]].set_visible(False)
    return _svg(figure)


def gpu_w2(results: str) -> Optional[bytes]:
    found = [r for r in lines(results, "h100_w2.jsonl") if "config" in r]
    if not found:
        return None
    names = {"plain_mwms": "plain MultiWorkerMirroredStrategy", "raytf": "raytf, float32",
             "raytf_float16_ef": "raytf, float16 + error feedback",
             "raytf_local_sgd4": "raytf, local SGD every 4 steps",
             "raytf_float16_ef_local_sgd4": "raytf, float16 + error feedback + local SGD 4"}
    base = next(r["loss"] for r in found if r["config"] == "plain_mwms")
    rows = [(f"{names.get(r['config'], r['config'])} (loss {r['loss'] / base:.2f}x)", r["samples_per_s"],
             ANCHOR if r["config"] == "plain_mwms" else RAYTF) for r in found]
    return _bars("W2 (20M parameters) on one H100, all-reduce bound (bench/w2.py)", "samples/s", rows)


def gpu_w1(results: str) -> Optional[bytes]:
    found = [r for r in lines(results, "h100_w1_throughput.jsonl") if "system" in r]
    if not found:
        return None
    names = {"plain_mwms": ("plain MultiWorkerMirroredStrategy, tf-keras fit", ANCHOR),
             "raytf": ("raytf, tf-keras fit", RAYTF), "ray_train": ("Ray Train TensorflowTrainer", OTHER),
             "raytf_keras3": ("raytf, Keras 3 raytf.keras.fit", RAYTF)}
    return _bars("W1 on one H100 (bench/throughput.py)", "samples/s",
                 [(names[r["system"]][0], r["samples_per_s"], names[r["system"]][1]) for r in found
                  if r["system"] in names])


CHARTS: dict[str, Callable[[str], Optional[bytes]]] = {
    "ingest": ingest, "file_ingest": file_ingest, "w3_pause": w3_pause, "w3_restore": w3_restore,
    "recovery": recovery, "gpu_w1": gpu_w1, "gpu_w2": gpu_w2,
}


def draw_all(results: str) -> dict[str, bytes]:
    """Every chart whose results are there: name -> SVG."""
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "raytf"  # the same SVG for the same figures
    out = {}
    for name, draw in CHARTS.items():
        svg = draw(results)
        if svg is not None:
            out[name] = svg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--results", default=os.path.join(HERE, "results"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for name, svg in draw_all(args.results).items():
        with open(os.path.join(args.out, f"{name}.svg"), "wb") as f:
            f.write(svg)
        print(os.path.join(args.out, f"{name}.svg"))


if __name__ == "__main__":
    main()

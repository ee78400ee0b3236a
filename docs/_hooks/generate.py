"""MkDocs hooks: the reference pages that are read off the code, and the benchmark charts and tables.

A page holds a marker where generated text goes (``<!-- raytf:errors:ConfigError -->``,
``<!-- raytf:cli -->``, ``<!-- raytf:environment -->``, ``<!-- raytf:hooks -->``, and a benchmark
table from its record, ``<!-- raytf:bench:cpu_quick:w1_spe1 -->``, and a figure in prose,
``<!-- raytf:figure:cpu_w3_restores:system=raytf_memory,storage=s3:restore_s -->``: records.py); the charts are drawn
by ``bench/charts.py`` from the JSON the benches printed (``bench/results/``) and added to the site
as ``charts/<name>.svg``. Nothing here imports TensorFlow or Ray (the hooks' table reads raytf's
registry, plain data), so the site builds in seconds.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "_hooks"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import charts  # noqa: E402  (bench/charts.py; sys.path is MkDocs' again when the hooks are called)
import records  # noqa: E402
import reference  # noqa: E402

MARKERS = {
    "<!-- raytf:cli -->": reference.cli_markdown,
    "<!-- raytf:environment -->": reference.environment_markdown,
    "<!-- raytf:hooks -->": reference.hooks_markdown,
    "<!-- raytf:slowed-runs -->": reference.slowed_runs_markdown,
    "<!-- raytf:slowest -->": reference.slowest_markdown,
    "<!-- raytf:suite-runs -->": reference.suite_runs_markdown,
    "<!-- raytf:support -->": reference.support_markdown,
}
ERRORS = re.compile(r"<!-- raytf:errors:(\w+) -->")
BENCH = re.compile(r"<!-- raytf:bench:(\w+):(\w+) -->")
KEPT = re.compile(r"<!-- raytf:kept:(\w+):(\w+) -->")  # a bench's output file kept as printed
# One figure in prose (records.figure): <!-- raytf:figure:<file>:<where>:<key>[:<format>[:<mode>]] -->
FIGURE = records.FIGURE


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make(ROOT))
    markdown = BENCH.sub(lambda found: records.bench_table(ROOT, found.group(1), found.group(2)), markdown)
    markdown = KEPT.sub(lambda found: records.kept_table(ROOT, found.group(1), found.group(2)), markdown)
    markdown = FIGURE.sub(lambda found: records.figure(ROOT, *(g or "" for g in found.groups())), markdown)
    return ERRORS.sub(lambda found: reference.errors_markdown(ROOT, found.group(1)), markdown)


def on_files(files, config):  # noqa: ANN001, ANN201 - MkDocs' hook signature
    from mkdocs.structure.files import File

    for name, svg in charts.draw_all(os.path.join(ROOT, "bench", "results")).items():
        files.append(File.generated(config, f"charts/{name}.svg", content=svg))
    return files

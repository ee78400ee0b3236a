"""MkDocs hooks: the reference pages that are read off the code, and the benchmark charts.

A page holds a marker where generated text goes (``<!-- raytf:errors:ConfigError -->``,
``<!-- raytf:cli -->``, ``<!-- raytf:environment -->``, ``<!-- raytf:hooks -->``); the charts are drawn by ``bench/charts.py`` from the JSON the
benches printed (``bench/results/``) and added to the site as ``charts/<name>.svg``. Nothing here
imports TensorFlow or Ray (the hooks' table reads raytf's registry, plain data), so the site builds in seconds.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "docs", "_hooks"))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import charts  # noqa: E402  (bench/charts.py; sys.path is MkDocs' again when the hooks are called)
import reference  # noqa: E402

MARKERS = {
    "<!-- raytf:cli -->": reference.cli_markdown,
    "<!-- raytf:environment -->": reference.environment_markdown,
    "<!-- raytf:hooks -->": reference.hooks_markdown,
    "<!-- raytf:slowest -->": reference.slowest_markdown,
}
ERRORS = re.compile(r"<!-- raytf:errors:(\w+) -->")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - MkDocs' hook signature
    for marker, make in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make(ROOT))
    return ERRORS.sub(lambda found: reference.errors_markdown(ROOT, found.group(1)), markdown)


def on_files(files, config):  # noqa: ANN001, ANN201 - MkDocs' hook signature
    from mkdocs.structure.files import File

    for name, svg in charts.draw_all(os.path.join(ROOT, "bench", "results")).items():
        files.append(File.generated(config, f"charts/{name}.svg", content=svg))
    return files

"""The driver's progress display: one line per report. The one place raytf writes to the terminal."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from raytf._status import Report


def format_metrics(metrics: dict[str, Any]) -> str:
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


class ProgressPrinter:
    def __init__(self, run_name: str, verbose: int, stream: TextIO | None = None):
        self._run_name = run_name
        self._verbose = verbose
        self._stream = stream
        self._start = time.monotonic()

    def _write(self, text: str) -> None:
        if self._verbose:
            stream = self._stream or sys.stderr
            stream.write(f"[raytf {self._run_name} {time.monotonic() - self._start:7.1f}s] {text}\n")
            stream.flush()

    def report(self, report: Report) -> None:
        self._write(f"attempt {report.attempt} report {report.seq}: {format_metrics(report.metrics)}")

    def message(self, text: str) -> None:
        self._write(text)

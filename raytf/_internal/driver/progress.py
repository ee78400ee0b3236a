"""The driver's progress display, the one place raytf writes to the terminal.

Every report of rank 0 is a line. On a terminal, one more line at the bottom
is redrawn in place as the workers train: attempt and restarts, epoch, step
of steps, samples (or steps) per second, the latest metrics and an estimate
of the time left, from the step count each worker returns with the poll the
driver makes anyway. Off a terminal (``ray job submit``'s log, a file) there
is no live line: only the report lines, as before.
"""

from __future__ import annotations

import collections
import shutil
import sys
import time
from typing import Any, Callable, Optional, TextIO

from raytf._internal.protocol import Progress, Report

_REDRAW_INTERVAL_S = 0.25
_RATE_WINDOW_S = 20.0
_SHOWN_METRICS = 4


def format_metrics(metrics: dict[str, Any], limit: Optional[int] = None) -> str:
    parts = []
    for key, value in list(metrics.items())[:limit]:
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return " ".join(parts)


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


class Rate:
    """Steps per second over the last ``window_s``, from (time, global step) samples."""

    def __init__(self, window_s: float = _RATE_WINDOW_S):
        self._window_s = window_s
        self._samples: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, step: int) -> None:
        if self._samples and step < self._samples[-1][1]:
            self._samples.clear()  # a restart went back to a checkpoint
        self._samples.append((now, step))
        while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()

    def per_second(self) -> Optional[float]:
        if len(self._samples) < 2:
            return None
        (t0, s0), (t1, s1) = self._samples[0], self._samples[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None


def status_line(
    attempt: int, progress: Optional[Progress], metrics: dict[str, Any], steps_per_s: Optional[float], width: int
) -> str:
    """The live line: what is known of attempt, epoch, step, speed, metrics and time left."""
    parts = [f"attempt {attempt}" + (f" ({attempt} restart{'s' if attempt > 1 else ''})" if attempt else "")]
    p = progress or Progress()
    if p.epoch is not None:
        shown = min(p.epoch + 1, p.epochs) if p.epochs else p.epoch + 1  # after the last epoch: the last
        parts.append(f"epoch {shown}" + (f"/{p.epochs}" if p.epochs else ""))
    if p.step is not None:
        if p.steps:
            filled = int(10 * min(p.step, p.steps) / p.steps)
            parts.append(f"step {p.step}/{p.steps} [{'#' * filled}{'.' * (10 - filled)}]")
        else:
            parts.append(f"step {p.step}")
    if steps_per_s:
        if p.global_batch:
            parts.append(f"{steps_per_s * p.global_batch:,.0f} samples/s")
        else:
            parts.append(f"{steps_per_s:,.1f} steps/s")
    if metrics:
        parts.append(format_metrics(metrics, _SHOWN_METRICS))
    if steps_per_s and p.steps and p.epochs and p.epoch is not None and p.step is not None:
        left = (p.epochs - p.epoch - 1) * p.steps + (p.steps - p.step)
        parts.append(f"ETA {format_duration(max(0, left) / steps_per_s)}")
    line = " | ".join(parts)
    return line if len(line) < width else line[: max(0, width - 2)] + "…"


class ProgressDisplay:
    def __init__(
        self,
        run_name: str,
        verbose: int,
        stream: Optional[TextIO] = None,
        clock: Callable[[], float] = time.monotonic,
        live: Optional[bool] = None,
    ):
        self._run_name = run_name
        self._verbose = verbose
        self._stream = stream
        self._clock = clock
        self._start = clock()
        stream = stream or sys.stderr
        self._live = bool(verbose) and (stream.isatty() if live is None else live)
        self._drawn = False
        self._drawn_at = 0.0
        self._metrics: dict[str, Any] = {}
        self._rate = Rate()
        self._attempt = 0
        self._progress: Optional[Progress] = None

    def _out(self) -> TextIO:
        return self._stream or sys.stderr

    def _clear(self) -> None:
        if self._drawn:
            self._out().write("\r\033[K")
            self._drawn = False

    def _write(self, text: str) -> None:
        if not self._verbose:
            return
        self._clear()
        stream = self._out()
        stream.write(f"[raytf {self._run_name} {self._clock() - self._start:7.1f}s] {text}\n")
        stream.flush()
        if self._live:
            self._draw()

    def _draw(self) -> None:
        width = shutil.get_terminal_size((120, 24)).columns - 1
        line = status_line(self._attempt, self._progress, self._metrics, self._rate.per_second(), width)
        stream = self._out()
        stream.write("\r\033[K" + line)
        stream.flush()
        self._drawn, self._drawn_at = True, self._clock()

    def report(self, report: Report) -> None:
        evaluated = report.metrics.get("evaluated_checkpoint")
        if evaluated is not None:  # a parameter-server evaluator's: it does not replace training's metrics
            shown = {k: v for k, v in report.metrics.items() if k not in ("evaluated_checkpoint", "epoch", "step")}
            self._write(f"evaluator on {evaluated}: {format_metrics(shown)}")
            return
        self._metrics = {k: v for k, v in report.metrics.items() if k not in ("epoch", "step")}
        self._write(f"attempt {report.attempt} report {report.seq}: {format_metrics(report.metrics)}")

    def update(self, attempt: int, progress: Optional[Progress]) -> None:
        """The workers' latest progress, from a poll: redraws the live line now and then."""
        now = self._clock()
        self._attempt = attempt
        if progress is not None:
            self._progress = progress
            step = progress.global_step
            if step is None and progress.step is not None and progress.steps and progress.epoch is not None:
                step = progress.epoch * progress.steps + progress.step
            if step is not None:
                self._rate.add(now, step)
        if self._live and now - self._drawn_at >= _REDRAW_INTERVAL_S:
            self._draw()

    def message(self, text: str) -> None:
        self._write(text)

    def close(self) -> None:
        self._clear()
        self._live = False
        if self._verbose:
            self._out().flush()

"""``raytf runs``: what a storage path holds, read from the storage alone (no Ray, no driver)."""

from __future__ import annotations

from typing import Any, Optional

import pyarrow.fs as pafs

from raytf._internal.checkpoint.manager import CheckpointManager
from raytf._internal.driver.history import HISTORY_FILE, RUN_FILE
from raytf._internal.driver.progress import format_metrics
from raytf._internal.protocol import HISTORY_KEYS
from raytf._internal.storage import RunStorage, redact, resolve_storage
from raytf.config import default_storage_path
from raytf.errors import CheckpointError


def describe_runs(storage_path: Optional[str] = None) -> list[dict[str, Any]]:
    """One row per run under ``storage_path``: starts, attempts, latest checkpoint, last metrics.

    A run whose run.json or history.json is damaged (truncated, not JSON, not
    the shape raytf writes) is still listed, with ``damaged`` naming each such
    file and what is wrong with it; the other runs are listed as usual.
    """
    filesystem, root, _ = resolve_storage(storage_path or default_storage_path())
    rows = []
    for info in sorted(
        filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True)), key=lambda i: i.base_name
    ):
        if info.type != pafs.FileType.Directory:
            continue
        run = RunStorage(storage_path or default_storage_path(), info.base_name)
        damaged: list[str] = []
        record = _read(run, RUN_FILE, dict, damaged)
        history = _read(run, HISTORY_FILE, list, damaged)
        history = [e for e in history if isinstance(e, dict)]
        if not damaged and not record and not history and not _has(run, "checkpoints/index.json"):
            continue  # not a raytf run
        try:
            newest = CheckpointManager(run.filesystem, run.root).newest()
        except CheckpointError as error:
            newest, checkpoint = None, f"unreadable index ({error})"
        else:
            checkpoint = (
                ""
                if newest is None
                else (f"{newest.path.rstrip('/').split('/')[-1]} (epoch {newest.epoch}, step {newest.step})")
            )
        last = history[-1] if history else {}
        starts = record.get("starts", [])
        rows.append(
            {
                "name": info.base_name,
                "driver_starts": len(starts) if isinstance(starts, list) else 0,
                "attempts": len({(e.get("driver_start", 0), e.get("attempt", 0)) for e in history}),
                "reports": len(history),
                "latest_checkpoint": checkpoint,
                "last_metrics": {k: v for k, v in last.items() if k not in HISTORY_KEYS},
                "damaged": damaged,
            }
        )
    return rows


def _read(run: RunStorage, relpath: str, kind: type, damaged: list[str]) -> Any:
    """The JSON file ``relpath`` of ``run`` if it is a ``kind``; else ``kind()``, and why in ``damaged``."""
    if not _has(run, relpath):
        return kind()
    try:
        value = run.read_json(relpath)
    except (OSError, ValueError) as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        damaged.append(f"{run.path(relpath)}: {type(error).__name__}: {error}")
        return kind()
    if not isinstance(value, kind):
        damaged.append(
            f"{run.path(relpath)}: holds a {type(value).__name__}, not a JSON {'object' if kind is dict else 'list'}"
        )
        return kind()
    return value


def _has(run: RunStorage, relpath: str) -> bool:
    return run.filesystem.get_file_info(run.path(relpath)).type == pafs.FileType.File


def print_runs(storage_path: Optional[str] = None) -> None:
    rows = describe_runs(storage_path)
    if not rows:
        print(f"no raytf runs in {redact(storage_path or default_storage_path())}")
        return
    for row in rows:
        print(
            f"{row['name']}: {row['driver_starts']} driver start(s), {row['attempts']} attempt(s) with reports, "
            f"{row['reports']} report(s)"
        )
        print(f"  latest checkpoint: {row['latest_checkpoint'] or 'none'}")
        print(f"  last metrics: {format_metrics(row['last_metrics']) or 'none'}")
        for problem in row["damaged"]:
            print(f"  damaged: {problem} (move the file aside or repair it; checkpoints are not affected)")

"""Fixtures of the fast tier."""

import pytest

from raytf._internal.checkpoint import snapshot


@pytest.fixture
def snapshot_roots(tmp_path, monkeypatch):
    """Snapshots go to ``tmp_path/shm`` (standing in for /dev/shm) or, past it, ``tmp_path/tmp``."""
    shm, disk = tmp_path / "shm", tmp_path / "tmp"
    shm.mkdir()
    disk.mkdir()
    monkeypatch.setattr(snapshot, "SHARED_MEMORY", str(shm))
    monkeypatch.setattr(snapshot, "_disk_only", False)
    monkeypatch.setattr(snapshot.tempfile, "tempdir", str(disk))
    return shm, disk

"""Tiers by directory, so a marker never depends on a test file remembering its own.

``-m unit``: tests/unit and tests/cluster, no Ray cluster, seconds in all (the loop to run while
editing). ``-m docs``: tests/docs, the documentation site built in strict mode and checked.
``-m integration``: tests/integration, on the session's Ray cluster. ``-m e2e``: a
``ray start --head`` of their own (tests/e2e; the autoscaler's test also has ``autoscaler``).
``-m gpu``: tests/gpu, on a machine with NVIDIA GPUs only.

The suite runs in two processes (``-n 2`` in pyproject.toml): much of an integration test is
waiting (for a timeout it provokes, a process to start, a node to go), and the other process
fills it. Each process starts its own Ray cluster on ports of its own. ``-n 0`` runs in one.
"""

from __future__ import annotations

import os

import pytest

_TIERS = {"unit": "unit", "cluster": "unit", "docs": "docs", "integration": "integration", "e2e": "e2e", "gpu": "gpu"}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        relative = os.path.relpath(str(item.fspath), root)
        tier = _TIERS.get(relative.split(os.sep)[0])
        if tier is not None and tier not in {m.name for m in item.iter_markers()}:
            item.add_marker(getattr(pytest.mark, tier))
        # pytest -n 2 --dist loadgroup (pyproject.toml): a test file runs whole in one process, so
        # its module-scoped runs are made once; the end-to-end files share one, so that their Ray
        # heads never start together (the first makes the machine's Ray token). The groups start
        # in the order collected (--no-loadscope-reorder): e2e, the longest, first and the unit
        # files last, not by test count, which left e2e to run alone at the end.
        item.add_marker(pytest.mark.xdist_group("e2e" if tier == "e2e" else relative))

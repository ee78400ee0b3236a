"""Tiers by directory, so a marker never depends on a test file remembering its own.

``-m unit``: tests/unit and tests/cluster, no Ray cluster, seconds in all (the loop to run while
editing). ``-m integration``: tests/integration, on the session's Ray cluster. ``-m e2e``: a
``ray start --head`` of their own (tests/e2e; the autoscaler's test also has ``autoscaler``).
``-m gpu``: tests/gpu, on a machine with NVIDIA GPUs only.
"""

from __future__ import annotations

import os

import pytest

_TIERS = {"unit": "unit", "cluster": "unit", "integration": "integration", "e2e": "e2e", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        relative = os.path.relpath(str(item.fspath), root)
        tier = _TIERS.get(relative.split(os.sep)[0])
        if tier is not None and tier not in {m.name for m in item.iter_markers()}:
            item.add_marker(getattr(pytest.mark, tier))

"""Markers follow the folder a test lives in (unit / integration / parts / serve / cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.hang_watchdog"]

FOLDER_MARKERS = {"unit", "integration", "parts", "serve", "cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        if folder in FOLDER_MARKERS:
            item.add_marker(getattr(pytest.mark, folder))

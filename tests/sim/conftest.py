"""The simulator suite's long profiles run as long as their searches take: no per-test
timeout there (CI's profile keeps the project's)."""

from __future__ import annotations

import pytest

from ._profile import PROFILE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if PROFILE == "ci":
        return
    for item in items:
        if item.path.parent.name == "sim" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.timeout(0))

"""Every entry point pyproject.toml declares (console scripts, the pytest plugin) names a module
and attribute that import: a module moved without its entry point breaks installs only, where
the test suite would not notice (the editable install keeps the metadata it was made with)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _entry_points() -> list[tuple[str, str]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    found = [(f"scripts:{name}", target) for name, target in project["scripts"].items()]
    for group, entries in project.get("entry-points", {}).items():
        found += [(f"{group}:{name}", target) for name, target in entries.items()]
    return found


def test_pyproject_declares_the_console_script_and_the_pytest_plugin() -> None:
    names = {name for name, _ in _entry_points()}
    assert {"scripts:nsq-sansio", "pytest11:nsq_sansio"} <= names


@pytest.mark.parametrize(("name", "target"), _entry_points())
def test_entry_point_imports(name: str, target: str) -> None:
    module_name, _, attribute = target.partition(":")
    module = importlib.import_module(module_name)
    if attribute:
        assert callable(getattr(module, attribute)), f"{name} = {target}"
    else:  # a pytest plugin: a module that defines fixtures
        assert hasattr(module, "nsqd"), f"{name} = {target}"

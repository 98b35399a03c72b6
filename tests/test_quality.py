"""The project's own rules, checked on every run: mypy --strict, ruff check and ruff format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(600)
def test_core_and_transports_are_mypy_strict_clean() -> None:
    result = _run(sys.executable, "-m", "mypy", "--strict", "nsq_sansio", "transports")
    assert result.returncode == 0, result.stdout + result.stderr


#: The Python the project is linted as: run through this interpreter, so an inactive venv (ruff
#: installed but not on PATH) still runs the check instead of skipping it.
_LINTED = ("nsq_sansio", "transports", "tests", "bench", "examples")


def test_ruff_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", "--no-cache", *_LINTED)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    python_files = [str(p.relative_to(ROOT)) for d in _LINTED for p in (ROOT / d).rglob("*.py")]
    result = _run(sys.executable, "-m", "ruff", "format", "--check", "--no-cache", *python_files)
    assert result.returncode == 0, result.stdout + result.stderr

"""The project's own rules, checked on every run: mypy --strict and ruff are clean."""

from __future__ import annotations

import shutil
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


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is installed by the test extra")
def test_ruff_is_clean() -> None:
    result = _run(
        "ruff", "check", "--no-cache", "nsq_sansio", "transports", "tests", "bench", "examples"
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""A run without the real NSQ binaries ends with one line that says so and how to get them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .codeblocks import ROOT


@pytest.mark.timeout(60)
def test_one_closing_line_counts_the_skips_for_missing_binaries(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "from transports.testing.real_nsq import MISSING_BINARIES\n"
        "needs_real = pytest.mark.skipif(True, reason=MISSING_BINARIES)\n"
        "@needs_real\n"
        "def test_a(): pass\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_b(n): pytest.skip(MISSING_BINARIES)\n"
        "def test_c(): pytest.skip('real NSQ binaries not found')\n"
        "def test_d(): pytest.skip('needs a JVM')\n"
        "def test_e(): pass\n",
        encoding="utf-8",
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-ra",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_sample.py"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
    )
    lines = result.stdout.strip().splitlines()
    ours = [line for line in lines if "for want of the real NSQ binaries" in line]
    assert ours == [
        "4 tests skipped for want of the real NSQ binaries; set NSQ_BIN_DIR to the bin/ folder "
        "of an NSQ release (https://nsq.io/deployment/installing.html) to run them"
    ], result.stdout
    # after -ra's list, right before pytest's closing counts
    assert lines[-2] == ours[0] and "1 passed, 5 skipped" in lines[-1], result.stdout
    assert "shared" not in result.stdout


@pytest.mark.timeout(60)
def test_no_line_when_nothing_skipped_for_binaries(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        "import pytest\ndef test_d(): pytest.skip('needs a JVM')\n", encoding="utf-8"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
    )
    assert "NSQ binaries" not in result.stdout, result.stdout

"""The README's test command is what CI runs, and a parallel run reports what a serial one does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.findall(
        r"^python -m pip install -e '\.\[test[^\]]*\]' && python -m pytest.*$", readme, re.M
    )
    assert len(found) == 1, found
    return found[0]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    command = _readme_test_command()
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == command
    # both cores (or more) in use; the groups that keep one JVM on one worker honoured
    assert " -n auto " in f"{command} " and "--dist loadgroup" in command
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


@pytest.mark.timeout(90)
def test_a_parallel_run_still_counts_the_skips_for_missing_binaries(tmp_path: Path) -> None:
    # the skips are reported by the workers and counted once, on the controller
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "from transports.testing.real_nsq import MISSING_BINARIES\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_b(n): pytest.skip(MISSING_BINARIES)\n"
        "def test_d(): pytest.skip('needs a JVM')\n"
        "def test_e(): pass\n",
        encoding="utf-8",
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("PYTEST_XDIST_AUTO_NUM_WORKERS", None)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", str(tmp_path / "test_sample.py")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=80,
        env=env,
    )
    lines = result.stdout.strip().splitlines()
    ours = [line for line in lines if "for want of the real NSQ binaries" in line]
    assert len(ours) == 1 and ours[0].startswith("4 tests skipped"), result.stdout
    assert "1 passed, 5 skipped" in lines[-1], result.stdout

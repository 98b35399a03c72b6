"""Subprocess tests of the ``nsq-sansio`` command line against the embedded broker.

The broker runs in this test process (the ``nsq_cluster`` / ``nsqd`` fixtures of
``transports.pytest_plugin``, on a background thread); the command runs in a child process
exactly as a user runs it (``python -m transports.cli``), over real loopback sockets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from transports.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, input: bytes | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[bytes]:
    """Run ``nsq-sansio *args`` in a child process and return what it did."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "transports.cli", *args],
        input=input,
        capture_output=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def cli_popen(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "transports.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    )


def http_post(address: str, path: str) -> None:
    request = urllib.request.Request(f"http://{address}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any]:
    with urllib.request.urlopen(
        f"http://{http_address}/stats?format=json&topic={topic}", timeout=5
    ) as response:
        data = json.loads(response.read())
    for t in data["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    raise AssertionError(f"no channel {topic}/{channel}")


def one_line_error(result: subprocess.CompletedProcess[bytes]) -> str:
    """The command failed with a single stderr line and no traceback; return that line."""
    assert result.returncode != 0, result
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]

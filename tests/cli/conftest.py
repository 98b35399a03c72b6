"""Subprocess tests of the ``nsq-sansio`` command line against the embedded broker.

The broker runs in this test process (the ``nsq_cluster`` / ``nsqd`` fixtures of
``transports.testing.pytest_plugin``, on a background thread); the command runs in a child process
exactly as a user runs it (``python -m transports.cli``), over real loopback sockets.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from support.brokers import http_channel_stats

from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "transports.cli", *args]


def _env(**extra: str) -> dict[str, str]:
    """This checkout first on the child's path (a user runs the installed command)."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def cli(
    *args: str, input: bytes | None = None, timeout: float = 30.0, cwd: Path = ROOT
) -> subprocess.CompletedProcess[bytes]:
    """Run ``nsq-sansio *args`` in a child process and return what it did."""
    return subprocess.run(
        _command(*args), input=input, capture_output=True, timeout=timeout, cwd=cwd, env=_env()
    )


def cli_popen(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        _command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=_env()
    )


def http_post(address: str, path: str) -> None:
    request = urllib.request.Request(f"http://{address}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200


def channel_stats(http_address: str, topic: str, channel: str) -> dict[str, Any]:
    found = http_channel_stats(f"http://{http_address}", topic, channel)
    if found is None:
        raise AssertionError(f"no channel {topic}/{channel}")
    return found


#: The columns of ``nsq-sansio stat``'s table after the name, in order.
STAT_COLUMNS = ("nsqd", "lag", "depth", "inflt", "def", "req", "t-o", "msgs", "msg/s", "clients")


_TABLE_HEADING = re.compile(r"topic(?:/channel)?\s+nsqd\s")  # a topic may be named "topic"
_TABLE_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def stat_tables(output: str) -> list[dict[tuple[str, str], list[str]]]:
    """The tables ``nsq-sansio stat`` printed: per table, (topic, channel or "") -> the cells
    (:data:`STAT_COLUMNS`). A topic line starts at column 0, its channels are indented by two
    spaces, and a name too long for its column stands on its own line with the cells on the
    next (indented further)."""
    tables: list[dict[tuple[str, str], list[str]]] = []
    topic = ""
    pending: tuple[str, str] | None = None
    for line in output.splitlines():
        if _TABLE_HEADING.match(line):  # the heading starts a table
            tables.append({})
            continue
        if (
            not tables
            or not line.strip()
            or _TABLE_STAMP.match(line)  # "2026-11-22 11:36:51  2 nsqd" (a topic may be "20")
            or line.startswith(("  !", "(no topics)"))
        ):
            continue
        words = line.split()
        if line.startswith("   "):  # cells under a name that had its own line
            assert pending is not None, line
            tables[-1][pending], pending = words, None
            continue
        if line.startswith("  "):
            key = (topic, words[0])
        else:
            topic = words[0]
            key = (topic, "")
        if len(words) == 1:
            pending = key
        else:
            tables[-1][key] = words[1:]
    return tables


def one_line_error(result: subprocess.CompletedProcess[bytes]) -> str:
    """The command failed with a single stderr line and no traceback; return that line."""
    assert result.returncode != 0, result
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def cli_in_pty(
    *args: str, columns: int = 80, rows: int = 24, timeout: float = 60.0
) -> tuple[int, str]:
    """Run ``nsq-sansio *args`` with stdin/stdout/stderr on a pseudo-terminal of ``columns``
    x ``rows`` (TIOCSWINSZ); returns (exit code, everything it wrote, escapes included)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    env = _env(TERM="xterm", COLUMNS=str(columns))
    proc = subprocess.Popen(
        _command(*args),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, b"".join(chunks).decode("utf-8", "replace")


def screen_lines(output: str) -> list[str]:
    """What a terminal shows line by line: each ``ESC[2K``-cleared line of a redraw, the
    cursor movements and clears removed (carriage returns from the tty's ONLCR too)."""
    import re

    text = output.replace("\r\n", "\n")
    text = re.sub(r"\x1b\[\d*[A-Za-z]", "\n", text)
    return [line for line in text.split("\n") if line.strip()]

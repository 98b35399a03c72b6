"""pytest fixtures that run the embedded NSQ servers for your own tests.

Installed as a ``pytest11`` plugin, so with nsq-sansio installed these fixtures just exist:

    def test_roundtrip(nsq_cluster):
        addr = nsq_cluster.nsqd.tcp_address            # "127.0.0.1:54321"
        lookupd = nsq_cluster.lookupd.http_url        # "http://127.0.0.1:54322"

* ``nsqd``: one embedded nsqd (no lookupd), fresh for each test.
* ``nsqlookupd``: one embedded nsqlookupd, fresh for each test.
* ``nsq_cluster``: an nsqlookupd plus one nsqd registered with it.

Tests that need the real NSQ binaries (see :mod:`transports.testing.real_nsq`) skip without
them; the run then ends with one line saying how many did, and how to get the binaries, so a
green run without them is not mistaken for a full one.

The servers run on a background thread with their own event loop and bind port 0, so they
work from blocking tests, asyncio tests and trio tests alike, and in parallel runs.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator

import pytest

from transports.embedded.cluster import Cluster
from transports.embedded.lookupd import EmbeddedLookupd
from transports.embedded.nsqd import EmbeddedNSQD
from transports.embedded.thread import ServerThread
from transports.testing.real_nsq import MISSING_BINARIES

__all__ = ["nsq_cluster", "nsqd", "nsqlookupd"]


@pytest.fixture
def nsqd() -> Iterator[EmbeddedNSQD]:
    """A running embedded nsqd on 127.0.0.1 (TCP and HTTP on free ports)."""
    with ServerThread(EmbeddedNSQD()) as server:
        yield server


@pytest.fixture
def nsqlookupd() -> Iterator[EmbeddedLookupd]:
    """A running embedded nsqlookupd on 127.0.0.1 (TCP and HTTP on free ports)."""
    with ServerThread(EmbeddedLookupd()) as server:
        yield server


@pytest.fixture
def nsq_cluster() -> Iterator[Cluster]:
    """An nsqlookupd and one nsqd registered with it; ``wait_registered`` helps with races."""
    with ServerThread(Cluster(nsqd_count=1)) as cluster:
        yield cluster


# The skip reasons of tests that need the real binaries: MISSING_BINARIES, and the shorter ones
# some tests give ("real NSQ binaries not found", "no nsqd binary found...").
_NEEDS_BINARIES = re.compile(r"NSQ binaries|nsqd binary|NSQ_BIN_DIR", re.IGNORECASE)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter,
) -> Generator[None, None, None]:
    """After the rest of the summary (-ra's list included), one line: how many tests skipped
    for want of the real NSQ binaries, and how to get them."""
    try:
        return (yield)
    finally:
        skipped = terminalreporter.stats.get("skipped", [])
        count = sum(1 for report in skipped if _NEEDS_BINARIES.search(_skip_reason(report)))
        if count:
            tests = "test" if count == 1 else "tests"
            terminalreporter.write_line(
                f"{count} {tests} skipped for want of the real NSQ binaries; "
                + MISSING_BINARIES.split(": ", 1)[1]
                + " to run them",
                yellow=True,
                bold=True,
            )

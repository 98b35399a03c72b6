"""pytest fixtures that run the embedded NSQ servers for your own tests.

Installed as a ``pytest11`` plugin, so with nsq-sansio installed these fixtures just exist:

    def test_roundtrip(nsq_cluster):
        addr = nsq_cluster.nsqd.tcp_address            # "127.0.0.1:54321"
        lookupd = nsq_cluster.lookupd.http_url        # "http://127.0.0.1:54322"

* ``nsqd``: one embedded nsqd (no lookupd), fresh for each test.
* ``nsqlookupd``: one embedded nsqlookupd, fresh for each test.
* ``nsq_cluster``: an nsqlookupd plus one nsqd registered with it.

The servers run on a background thread with their own event loop and bind port 0, so they
work from blocking tests, asyncio tests and trio tests alike, and in parallel runs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from transports.embedded.cluster import Cluster
from transports.embedded.lookupd import EmbeddedLookupd
from transports.embedded.nsqd import EmbeddedNSQD
from transports.embedded.thread import ServerThread

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

"""Brokers for the client tests: embedded ones on threads, real ones from the binaries, and
reading their state (``/stats``) the way the tests need it."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from transports.embedded import Cluster, EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries, free_port

T = TypeVar("T")

_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A fresh topic/channel name per use (tests share nothing)."""
    return f"{prefix}{next(_counter)}_{int(time.time() * 1000) % 100000}"


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Poll ``predicate`` until it is truthy and return that value; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)
    return value


def assert_no_thread_left(prefix: str = "nsq-sync-", timeout: float = 5.0) -> None:
    """No thread of the blocking transport (consumer IO, workers, producer IO) still runs."""
    deadline = time.monotonic() + timeout
    while True:
        ours = [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]
        if not ours or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert not ours, f"threads left behind: {ours}"


# --- embedded brokers ------------------------------------------------------------------------


@contextmanager
def running_nsqd(**options: Any) -> Iterator[tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]]:
    """An embedded nsqd on its own thread; yields (server, runner)."""
    runner = ServerThread(EmbeddedNSQD(**options))
    server = runner.start()
    try:
        yield server, runner
    finally:
        runner.stop()


def embedded_topic_count(runner: ServerThread[EmbeddedNSQD], topic: str) -> int:
    """Messages the embedded nsqd stored for ``topic`` (0 when it has no such topic)."""
    server = runner.server

    def read() -> int:
        stats = server.core.stats(server.now(), topic=topic)
        return sum(int(t["message_count"]) for t in stats["topics"] if t["topic_name"] == topic)

    return runner.call(read)


@contextmanager
def running_cluster(nsqd_count: int, **options: Any) -> Iterator[ServerThread[Cluster]]:
    """An embedded nsqlookupd plus ``nsqd_count`` nsqd registered with it, on a thread."""
    runner = ServerThread(Cluster(nsqd_count=nsqd_count, **options))
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


# --- nsqd's /stats ----------------------------------------------------------------------------


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def find_channel(stats: dict[str, Any], topic: str, channel: str) -> dict[str, Any] | None:
    """The channel's entry in a ``/stats`` document (nsqd's JSON has null for no topics)."""
    for t in stats.get("topics") or ():
        if t["topic_name"] == topic:
            for c in t.get("channels") or ():
                if c["channel_name"] == channel:
                    return dict(c)
    return None


def http_channel_stats(http_url: str, topic: str, channel: str) -> dict[str, Any] | None:
    """An nsqd's view of a channel over its HTTP API (None when it does not exist)."""
    return find_channel(
        get_json(f"{http_url}/stats?format=json&topic={topic}&channel={channel}"), topic, channel
    )


# --- the real binaries ------------------------------------------------------------------------

needs_real = pytest.mark.skipif(find_binaries() is None, reason=MISSING_BINARIES)

#: ``@pytest.mark.parametrize("kind", BROKER_KINDS)``: the embedded nsqd, then the real one.
BROKER_KINDS = ["embedded", pytest.param("real", marks=needs_real)]


def require_real_binaries() -> None:
    """Skip the calling test or fixture where the real binaries are not there."""
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)


@contextmanager
def paused(nsqd: RealNSQD) -> Iterator[None]:
    """SIGSTOP the real nsqd: connections stay up, nothing is answered until SIGCONT."""
    pid = nsqd.pid  # kept: a kill() inside the block clears nsqd.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        _wait_stopped(pid)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed meanwhile
            os.kill(pid, signal.SIGCONT)


def _wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped (SIGSTOP takes effect asynchronously)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.add(f.read().rsplit(")", 1)[1].split()[0])
        if states <= {"T", "t"}:
            return
        time.sleep(0.001)
    raise AssertionError(f"nsqd {pid} did not stop")


def topic_count(nsqd: RealNSQD, topic: str) -> int:
    """Messages the real nsqd stored for ``topic`` (0 when it has no such topic)."""
    entry = nsqd.topic_stats(topic)
    return 0 if entry is None else int(entry["message_count"])


def pub_counts(nsqd: RealNSQD, topic: str) -> list[int]:
    """PUBs per client connection, as the real nsqd counts them (sorted)."""
    counts = []
    for client in nsqd.stats().get("producers") or ():
        for entry in client.get("pub_counts") or ():
            if entry["topic"] == topic:
                counts.append(int(entry["count"]))
    return sorted(counts)


class LateBroker:
    """One nsqd (embedded or real) on a fixed loopback port, started when the test says, so a
    client can be pointed at it before it is up. Its methods block."""

    def __init__(self, kind: str) -> None:
        self.real: RealNSQD | None = None
        self.thread: ServerThread[EmbeddedNSQD] | None = None
        if kind == "real":
            self.real = RealNSQD()
            self.tcp_address = self.real.tcp_address
        else:
            self.tcp_address = f"127.0.0.1:{free_port()}"
        self.http_url = ""

    def start(self) -> None:
        if self.real is not None:
            self.real.start()
            self.http_url = self.real.http_url
        else:
            self.thread = ServerThread(EmbeddedNSQD(tcp_address=self.tcp_address))
            self.http_url = self.thread.start().http_url

    def close(self) -> None:
        if self.real is not None:
            self.real.close()
        if self.thread is not None:
            self.thread.stop()

    def publish(self, topic: str, count: int, tag: str) -> None:
        """MPUB ``count`` bodies ``<tag>-<i>`` over HTTP."""
        body = b"\n".join(b"%s-%d" % (tag.encode(), i) for i in range(count))
        request = urllib.request.Request(f"{self.http_url}/mpub?topic={topic}", data=body)
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.read() == b"OK"

    def in_flight(self, topic: str, channel: str) -> int:
        found = http_channel_stats(self.http_url, topic, channel)
        return 0 if found is None else int(found["in_flight_count"])


@contextmanager
def started_nsqd(kind: str) -> Iterator[str]:
    """A running nsqd (embedded or real) for the block; yields its TCP address."""
    if kind == "real":
        with RealNSQD() as real:
            yield real.tcp_address
    else:
        with running_nsqd() as (server, _):
            yield server.tcp_address

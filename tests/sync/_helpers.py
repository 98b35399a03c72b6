"""Helpers for the blocking transport's integration tests."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from transports.embedded import Cluster, EmbeddedNSQD, ServerThread

_counter = itertools.count()


def unique(prefix: str = "t") -> str:
    """A fresh topic/channel name per use (tests share nothing)."""
    return f"{prefix}{next(_counter)}_{int(time.time() * 1000) % 100000}"


@contextmanager
def running_nsqd(**options: Any) -> Iterator[tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]]:
    """An embedded nsqd on its own thread; yields (server, runner)."""
    runner = ServerThread(EmbeddedNSQD(**options))
    server = runner.start()
    try:
        yield server, runner
    finally:
        runner.stop()


@contextmanager
def running_cluster(nsqd_count: int, **options: Any) -> Iterator[ServerThread[Cluster]]:
    runner = ServerThread(Cluster(nsqd_count=nsqd_count, **options))
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


def channel_stats(
    runner: ServerThread[EmbeddedNSQD], topic: str, channel: str
) -> dict[str, Any] | None:
    """The broker's own view of a channel (in_flight_count, depth...), read on its loop."""
    server = runner.server

    def read() -> dict[str, Any] | None:
        stats = server.core.stats(server.now(), topic=topic, channel=channel)
        for t in stats["topics"]:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
        return None

    return runner.call(read)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        time.sleep(0.01)

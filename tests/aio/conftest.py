"""Fixtures for the anyio transport tests: both backends, embedded brokers, extra nsqds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


NSQDFactory = Callable[..., EmbeddedNSQD]
_THREADS: dict[int, ServerThread[EmbeddedNSQD]] = {}


@pytest.fixture
def make_nsqd() -> Iterator[NSQDFactory]:
    """Start extra embedded nsqds with options; ``stop(server)`` kills one early."""
    threads: list[ServerThread[EmbeddedNSQD]] = []

    def start(**options: Any) -> EmbeddedNSQD:
        # built right here, possibly inside the test's own (trio) loop: EmbeddedNSQD makes its
        # anyio objects in start(), on the server thread's loop
        thread = ServerThread(EmbeddedNSQD(**options))
        server = thread.start()
        threads.append(thread)
        _THREADS[id(server)] = thread
        return server

    yield start
    for thread in reversed(threads):
        thread.stop()


def stop_nsqd(server: EmbeddedNSQD) -> None:
    _THREADS.pop(id(server)).stop()

"""Fixtures for the anyio transport tests: both backends, embedded brokers, a test CA."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from support.brokers import get_json, http_channel_stats
from support.tls import TestCA, make_test_ca

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


#: The PEM paths of the test CA (``ca_file``, ``cert_file``, ``key_file``, client ones too).
CA = TestCA


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    """A private CA and a server certificate it signed for 127.0.0.1 / localhost."""
    return make_test_ca(tmp_path_factory.mktemp("ca"))


async def channel_stats(server: EmbeddedNSQD, topic: str, channel: str) -> dict[str, Any]:
    """The broker's own view of a channel (``/stats?format=json``), {} when it does not exist."""
    found = await anyio.to_thread.run_sync(http_channel_stats, server.http_url, topic, channel)
    return found or {}


async def wait_channel(
    server: EmbeddedNSQD,
    topic: str,
    channel: str,
    check: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 10.0,
    what: str = "",
) -> dict[str, Any]:
    """Poll the broker's view of a channel until ``check(stats)`` holds; returns those stats.

    A client's FIN/REQ/RDY is applied by the broker a little after the client queued it (on
    another thread, later still under load): read broker state through this, never once
    right after an action. A ``check`` that raises KeyError/IndexError counts as not yet."""
    last: dict[str, Any] = {}
    with anyio.move_on_after(timeout):
        while True:
            last = await channel_stats(server, topic, channel)
            try:
                if check(last):
                    return last
            except (KeyError, IndexError):
                pass
            await anyio.sleep(0.02)
    raise AssertionError(f"broker state not reached in {timeout}s ({what or check}): {last}")


async def lookup_producers(lookupd_http_url: str, topic: str) -> list[Any]:
    """``/lookup?topic=`` producers (an unknown topic gives [])."""
    try:
        answer = await anyio.to_thread.run_sync(
            get_json, f"{lookupd_http_url}/lookup?topic={topic}"
        )
    except OSError:
        return []
    return list(answer.get("producers", []))

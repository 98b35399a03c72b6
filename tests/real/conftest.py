"""Fixtures for testing against the real NSQ v1.3.0 binaries (skipped where they are absent).

The project's client tests are written against the embedded broker's fixtures; the adapters
here give a real nsqd the same shape, so those test bodies run unchanged against the real one:

* :class:`RealBroker` is a real nsqd as the anyio tests see an ``EmbeddedNSQD``
  (``tcp_address``, ``http_address``, ``http_url``...);
* :class:`RealRunner` is what the blocking tests get as ``(server, runner)``: ``runner.call``
  runs a function, ``server.core.stats(now, topic=, channel=)`` reads the real ``/stats``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from support.brokers import require_real_binaries

from transports.testing.real_nsq import RealLookupd, RealNSQD, nsqd_flags

__all__ = ["RealBroker", "RealLookupdView", "RealRunner", "require_real_binaries"]


@pytest.fixture(autouse=True)
def _real_binaries() -> None:
    require_real_binaries()


def start_real_nsqd(**options: Any) -> RealNSQD:
    """A real nsqd started with EmbeddedNSQD-style keyword arguments."""
    flags, lookupd = nsqd_flags(**options)
    nsqd = RealNSQD(flags, lookupd=lookupd)
    nsqd.start()
    return nsqd


class _RealCore:
    """The part of ``EmbeddedNSQD.core`` the client tests read: ``stats``, with the core's
    lists where nsqd's JSON has null."""

    def __init__(self, nsqd: RealNSQD) -> None:
        self._nsqd = nsqd

    def stats(
        self,
        now: float,
        *,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> dict[str, Any]:
        query = "/stats?format=json&include_mem=false"
        if topic:
            query += f"&topic={topic}"
        if channel:
            query += f"&channel={channel}"
        if not include_clients:
            query += "&include_clients=false"
        stats: dict[str, Any] = self._nsqd.get_json(query)
        stats["topics"] = stats.get("topics") or []
        stats["producers"] = stats.get("producers") or []
        for found in stats["topics"]:
            for chan in found["channels"]:
                chan["clients"] = chan.get("clients") or []
        return stats


class _Addresses:
    """A real server's addresses under an embedded server's attribute names."""

    real: RealNSQD | RealLookupd

    @property
    def tcp_address(self) -> str:
        return self.real.tcp_address

    @property
    def http_address(self) -> str:
        return self.real.http_address

    @property
    def http_url(self) -> str:
        return self.real.http_url


class RealBroker(_Addresses):
    """A real nsqd with the attributes the client tests use on an ``EmbeddedNSQD``."""

    real: RealNSQD

    def __init__(self, nsqd: RealNSQD) -> None:
        self.real = nsqd
        self.core = _RealCore(nsqd)

    @property
    def tcp_port(self) -> int:
        return self.real.tcp_port

    @property
    def http_port(self) -> int:
        return self.real.http_port

    def now(self) -> float:
        return time.monotonic()


class RealRunner:
    """The ``ServerThread`` half of the blocking tests' ``(server, runner)`` pair."""

    def __init__(self, server: RealBroker) -> None:
        self.server = server

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        return func(*args)


class RealLookupdView(_Addresses):
    """A real nsqlookupd with an ``EmbeddedLookupd``'s address attributes."""

    real: RealLookupd

    def __init__(self, lookupd: RealLookupd) -> None:
        self.real = lookupd


@pytest.fixture(scope="module")
def real_nsqd() -> Iterator[RealBroker]:
    """One real nsqd for a module (tests use fresh topic names)."""
    require_real_binaries()
    with RealNSQD() as nsqd:
        yield RealBroker(nsqd)


@pytest.fixture
def make_real_nsqd() -> Iterator[Callable[..., RealBroker]]:
    """Start real nsqds with EmbeddedNSQD-style options; all stopped after the test."""
    started: list[RealNSQD] = []

    def start(**options: Any) -> RealBroker:
        nsqd = start_real_nsqd(**options)
        started.append(nsqd)
        return RealBroker(nsqd)

    yield start
    for nsqd in reversed(started):
        nsqd.close()


@pytest.fixture
def real_lookupd() -> Iterator[RealLookupdView]:
    require_real_binaries()
    with RealLookupd() as lookupd:
        yield RealLookupdView(lookupd)

"""Fixtures of the admin client tests: the runtime (asyncio, trio, blocking) and the brokers
(embedded, or the real nsqd + nsqlookupd v1.3.0 when their binaries are there).

A test is an ``async def`` taking ``runtime``; ``runtime.nsqd(url)`` / ``runtime.lookupd(url)``
give the admin client of that runtime with awaitable methods (the blocking client's calls run
on a worker thread), so one test body checks all three.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread
import pytest

from transports.anyio import admin as async_admin
from transports.embedded import Cluster, ServerThread
from transports.sync import admin as sync_admin
from transports.testing.pytest_plugin import nsq_cluster, nsqd, nsqlookupd  # noqa: F401
from transports.testing.real_nsq import MISSING_BINARIES, RealLookupd, RealNSQD, find_binaries

RUNTIMES = ["asyncio", "trio", "blocking"]


class Blocking:
    """A blocking admin client whose calls are awaited (each runs on a worker thread)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if not callable(method):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await anyio.to_thread.run_sync(functools.partial(method, *args, **kwargs))

        return call


class AdminRuntime:
    """Makes the admin clients of one runtime."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.blocking = name == "blocking"
        self.module: Any = sync_admin if self.blocking else async_admin

    def __repr__(self) -> str:
        return f"AdminRuntime({self.name!r})"

    @property
    def anyio_backend(self) -> str:
        return "asyncio" if self.blocking else self.name

    def make(self, kind: str, url: str, **options: Any) -> Any:
        """A client not entered (a connection per call); ``await close(client)`` ends it."""
        cls = getattr(self.module, kind)
        client = cls(url, **options)
        return Blocking(client) if self.blocking else client

    @asynccontextmanager
    async def entered(self, kind: str, url: str, **options: Any) -> AsyncIterator[Any]:
        """The client inside ``with`` / ``async with`` (one kept-alive connection)."""
        cls = getattr(self.module, kind)
        if not self.blocking:
            async with cls(url, **options) as client:
                yield client
            return
        client = cls(url, **options)
        await anyio.to_thread.run_sync(client.__enter__)
        try:
            yield Blocking(client)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(client.close)

    def nsqd(self, url: str, **options: Any) -> Any:
        return self.entered("NSQDAdmin", url, **options)

    def lookupd(self, url: str, **options: Any) -> Any:
        return self.entered("LookupdAdmin", url, **options)


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> AdminRuntime:
    return AdminRuntime(str(request.param))


@pytest.fixture
def anyio_backend(runtime: AdminRuntime) -> str:
    return runtime.anyio_backend


@dataclass
class Brokers:
    """An nsqd registered with an nsqlookupd: addresses the tests need."""

    kind: str
    nsqd_tcp: str
    nsqd_http: str
    lookupd_http: str

    @property
    def nsqd_tcp_port(self) -> int:
        return int(self.nsqd_tcp.rsplit(":", 1)[1])

    @property
    def nsqd_http_port(self) -> int:
        return int(self.nsqd_http.rsplit(":", 1)[1])


@pytest.fixture
def embedded_brokers() -> Iterator[Brokers]:
    with ServerThread(Cluster(nsqd_count=1)) as cluster:
        assert cluster.lookupd is not None
        yield Brokers(
            "embedded",
            cluster.nsqd.tcp_address,
            cluster.nsqd.http_address,
            cluster.lookupd.http_address,
        )


@contextmanager
def real_brokers(*nsqd_args: str) -> Iterator[Brokers]:
    """The real nsqlookupd and an nsqd registered with it (``nsqd_args``: extra flags);
    the test is skipped when the binaries are not there."""
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    with RealLookupd() as lookupd, RealNSQD(nsqd_args, lookupd=[lookupd.tcp_address]) as real:
        yield Brokers("real", real.tcp_address, real.http_address, lookupd.http_address)


@pytest.fixture(params=["embedded", "real"])
def brokers(request: pytest.FixtureRequest) -> Iterator[Brokers]:
    """The embedded brokers, then the real ones (skipped when absent): a test taking this
    fixture expects the same of both."""
    if request.param == "embedded":
        yield request.getfixturevalue("embedded_brokers")
        return
    with real_brokers() as real:
        yield real

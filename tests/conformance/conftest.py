"""Where the conformance suite points: the embedded broker, or any nsqd given by env vars.

    NSQ_CONFORMANCE_NSQD=host:4150          nsqd TCP address (unset: start the embedded one)
    NSQ_CONFORMANCE_NSQD_HTTP=host:4151     its HTTP address (default: TCP port + 1)
    NSQ_CONFORMANCE_LOOKUPD_HTTP=host:4161  an nsqlookupd that nsqd registers with (optional)
    NSQ_CONFORMANCE_LOOKUPD=host:4160       that nsqlookupd's TCP address (optional)
    NSQ_CONFORMANCE_BACKEND=trio            event loop of the embedded broker (default asyncio)

Tests use fresh topic names, so a shared nsqd can be used. Tests that need a lookupd skip
without one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from .wire import split_address


@dataclass(frozen=True)
class Target:
    tcp: str
    http: str
    lookupd_tcp: str | None
    lookupd_http: str | None
    embedded: bool


def _env_target() -> Target | None:
    tcp = os.environ.get("NSQ_CONFORMANCE_NSQD")
    if not tcp:
        return None
    http = os.environ.get("NSQ_CONFORMANCE_NSQD_HTTP")
    if not http:
        host, port = split_address(tcp)
        http = f"{host}:{port + 1}"
    return Target(
        tcp=tcp,
        http=http,
        lookupd_tcp=os.environ.get("NSQ_CONFORMANCE_LOOKUPD"),
        lookupd_http=os.environ.get("NSQ_CONFORMANCE_LOOKUPD_HTTP"),
        embedded=False,
    )


@pytest.fixture(scope="session")
def target() -> Iterator[Target]:
    env = _env_target()
    if env is not None:
        yield env
        return
    from transports.embedded import Cluster, ServerThread

    backend = os.environ.get("NSQ_CONFORMANCE_BACKEND", "asyncio")
    with ServerThread(Cluster(nsqd_count=1), backend=backend) as cluster:
        nsqd = cluster.nsqds[0]
        yield Target(
            tcp=nsqd.tcp_address,
            http=nsqd.http_address,
            lookupd_tcp=cluster.lookupd.tcp_address,
            lookupd_http=cluster.lookupd.http_address,
            embedded=True,
        )


@pytest.fixture
def lookupd_http(target: Target) -> str:
    if target.lookupd_http is None:
        pytest.skip("no nsqlookupd configured (NSQ_CONFORMANCE_LOOKUPD_HTTP)")
    return target.lookupd_http

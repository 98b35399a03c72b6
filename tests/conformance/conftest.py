"""Where the conformance suite points: every test runs against each target in one session.

Targets (the ``target`` fixture's ids):

``embedded``  the embedded broker (an nsqlookupd plus one nsqd registered with it) on a thread
``real``      the real nsqd + nsqlookupd v1.3.0 from ``../shared/reference`` (or
              ``$NSQ_BIN_DIR``), started once per session; skipped when they are not there
``external``  any nsqd given by env vars (only when ``NSQ_CONFORMANCE_NSQD`` is set)

    NSQ_CONFORMANCE_TARGETS=embedded,real   which targets to run (default: all available)
    NSQ_CONFORMANCE_NSQD=host:4150          an external nsqd's TCP address
    NSQ_CONFORMANCE_NSQD_HTTP=host:4151     its HTTP address (default: TCP port + 1)
    NSQ_CONFORMANCE_LOOKUPD_HTTP=host:4161  an nsqlookupd that nsqd registers with (optional)
    NSQ_CONFORMANCE_LOOKUPD=host:4160       that nsqlookupd's TCP address (optional)
    NSQ_CONFORMANCE_BACKEND=trio            event loop of the embedded broker (default asyncio)

The real nsqd is the referee: a test must give the same verdict on every target. Tests use
fresh topic names, so a shared nsqd can be used. Tests that need a lookupd skip without one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support.brokers import require_real_binaries

from transports.testing.real_nsq import RealLookupd, RealNSQD

from .wire import split_address

EMBEDDED = "embedded"
REAL = "real"
EXTERNAL = "external"


@dataclass(frozen=True)
class Target:
    tcp: str
    http: str
    lookupd_tcp: str | None
    lookupd_http: str | None
    kind: str = EMBEDDED

    @property
    def embedded(self) -> bool:
        return self.kind == EMBEDDED

    @property
    def real(self) -> bool:
        return self.kind == REAL


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
        kind=EXTERNAL,
    )


def _target_ids() -> list[str]:
    ids = [EMBEDDED, REAL]
    if os.environ.get("NSQ_CONFORMANCE_NSQD"):
        ids.append(EXTERNAL)
    chosen = os.environ.get("NSQ_CONFORMANCE_TARGETS")
    if chosen:
        wanted = {name.strip() for name in chosen.split(",")}
        ids = [name for name in ids if name in wanted]
    return ids


def embedded_backend() -> str:
    return os.environ.get("NSQ_CONFORMANCE_BACKEND", "asyncio")


@pytest.fixture(scope="session", params=_target_ids())
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kind = request.param
    if kind == EXTERNAL:
        env = _env_target()
        assert env is not None
        yield env
        return
    if kind == REAL:
        require_real_binaries()
        with RealLookupd() as lookupd, RealNSQD(lookupd=[lookupd.tcp_address]) as nsqd:
            yield Target(
                tcp=nsqd.tcp_address,
                http=nsqd.http_address,
                lookupd_tcp=lookupd.tcp_address,
                lookupd_http=lookupd.http_address,
                kind=REAL,
            )
        return
    from transports.embedded import Cluster, ServerThread

    with ServerThread(Cluster(nsqd_count=1), backend=embedded_backend()) as cluster:
        nsqd = cluster.nsqds[0]
        assert cluster.lookupd is not None
        yield Target(
            tcp=nsqd.tcp_address,
            http=nsqd.http_address,
            lookupd_tcp=cluster.lookupd.tcp_address,
            lookupd_http=cluster.lookupd.http_address,
            kind=EMBEDDED,
        )


@pytest.fixture
def lookupd_http(target: Target) -> str:
    if target.lookupd_http is None:
        pytest.skip("no nsqlookupd configured (NSQ_CONFORMANCE_LOOKUPD_HTTP)")
    return target.lookupd_http

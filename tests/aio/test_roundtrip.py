"""anyio transport against the embedded broker over loopback: publish/consume and features.

Every test runs on asyncio and on trio (the ``anyio_backend`` fixture).
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from nsq_sansio.errors import (
    BadMessage,
    ConnectionLost,
    InvalidName,
    Unauthorized,
)
from nsq_sansio.server.options import Authorization, AuthRequest, AuthState
from transports.anyio import (
    Consumer,
    HTTPProducer,
    NoNSQDAvailable,
    Producer,
)
from transports.embedded import EmbeddedNSQD

from .conftest import CA, NSQDFactory, channel_stats, lookup_producers, stop_nsqd

pytestmark = pytest.mark.anyio


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def collect(consumer: Consumer, count: int, timeout: float = 10.0) -> list[bytes]:
    bodies: list[bytes] = []
    with anyio.fail_after(timeout):
        async for msg in consumer:
            bodies.append(msg.body)
            await msg.finish()
            if len(bodies) >= count:
                break
    return bodies


async def test_publish_consume_round_trip(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    async with Producer(nsqd.tcp_address) as p:
        for i in range(20):
            await p.publish(topic, b"m%d" % i)
        stats = p.stats()
    assert stats.published == 20 and stats.failed == 0
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=10) as c:
        bodies = await collect(c, 20)
        cstats = c.stats()
    assert sorted(bodies) == sorted(b"m%d" % i for i in range(20))
    assert cstats.received == 20 and cstats.finished == 20
    (conn,) = cstats.connections
    assert (conn.state, conn.in_flight, conn.reconnects) == ("subscribed", 0, 0)
    assert conn.address == nsqd.tcp_address and conn.connected
    # Leaving `async with` closed the connection: the broker has no client and nothing in flight.
    with anyio.fail_after(5):
        while (await channel_stats(nsqd, topic, "ch")).get("clients"):
            await anyio.sleep(0.02)
    ch = await channel_stats(nsqd, topic, "ch")
    assert ch["in_flight_count"] == 0 and ch["depth"] == 0


async def test_multi_and_deferred_publish(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=50) as c:
        async with Producer(nsqd.tcp_address) as p:
            await p.multi_publish(topic, [b"a", b"b", b"c"])
            sent_at = anyio.current_time()
            await p.deferred_publish(topic, b"later", delay=0.5)
        first = await collect(c, 3)
        assert sorted(first) == [b"a", b"b", b"c"]
        later = await collect(c, 1)
        assert later == [b"later"]
        assert anyio.current_time() - sent_at >= 0.45


async def test_http_producer_pub_mpub_defer(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    async with HTTPProducer(nsqd.http_url) as hp:
        await hp.publish(topic, b"one")
        await hp.multi_publish(topic, [b"two", b"thr\nee"])  # binary mpub keeps newlines
        await hp.deferred_publish(topic, b"four", delay=0.2)
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=10) as c:
        assert sorted(await collect(c, 4)) == [b"four", b"one", b"thr\nee", b"two"]


async def test_http_producer_survives_an_nsqd_restart(make_nsqd: NSQDFactory) -> None:
    # The pooled keep-alive connection is dead after the restart; the publish must be sent
    # again on a fresh connection (it failed before any byte of an answer), not fail.
    server = make_nsqd(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")
    tcp, http = server.tcp_address, server.http_url.removeprefix("http://")
    topic = fresh()
    async with HTTPProducer(server.http_url) as hp:
        await hp.publish(topic, b"one")
        await anyio.to_thread.run_sync(stop_nsqd, server)
        server = await anyio.to_thread.run_sync(
            lambda: make_nsqd(tcp_address=tcp, http_address=http)
        )
        with anyio.fail_after(10):
            await hp.publish(topic, b"two")
            await hp.publish(topic, b"three")
    async with Consumer(topic, "ch", nsqd=[server.tcp_address], max_in_flight=10) as c:
        assert sorted(await collect(c, 2)) == [b"three", b"two"]


async def test_publish_errors_are_raised(nsqd: EmbeddedNSQD) -> None:
    async with Producer(nsqd.tcp_address) as p:
        with pytest.raises(InvalidName) as bad_character:
            await p.publish("bad topic!", b"x")
        # too long: refused before it is sent, as nsqd would refuse it
        with pytest.raises(InvalidName) as too_long:
            await p.publish("x" * 65, b"x")
        assert type(bad_character.value) is InvalidName and type(too_long.value) is InvalidName
        await p.publish(fresh(), b"still works")


async def test_refused_publish_fails_alone(make_nsqd: NSQDFactory) -> None:
    # nsqd closes the connection after E_BAD_MESSAGE; the publishes pipelined behind the bad
    # one were never read by nsqd and must be sent again after a reconnect, not failed.
    server = make_nsqd(max_msg_size=1000)
    topic = fresh()
    results: dict[int, BaseException | None] = {}
    async with Producer(server.tcp_address) as p:
        await p.publish(topic, b"warm")  # the connection is up: the 50 go out pipelined

        async def pub(i: int) -> None:
            try:
                await p.publish(topic, b"x" * 2000 if i == 10 else b"%d" % i)
                results[i] = None
            except Exception as exc:
                results[i] = exc

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(pub, i)
    assert type(results.pop(10)) is BadMessage
    assert set(results.values()) == {None}
    expected = sorted([b"warm"] + [b"%d" % i for i in range(50) if i != 10])
    async with Consumer(topic, "ch", nsqd=[server.tcp_address], max_in_flight=100) as c:
        assert sorted(await collect(c, 50)) == expected
        await anyio.sleep(0.2)
        assert c.stats().received == 50  # each exactly once


async def test_producer_failover_and_back_pressure(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    dead = "127.0.0.1:1"  # nothing listens there
    peak = 0
    async with Producer([dead, nsqd.tcp_address], max_pending=2, connect_timeout=1) as p:

        async def watch() -> None:
            nonlocal peak
            while True:  # sampled at every scheduler turn
                peak = max(peak, p.stats().pending)
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as outer:
            outer.start_soon(watch)
            async with anyio.create_task_group() as tg:
                for i in range(30):
                    tg.start_soon(p.publish, topic, b"%d" % i)
            outer.cancel_scope.cancel()
        stats = p.stats()
    assert 1 <= peak <= 2  # back-pressure: never more than max_pending awaiting an answer
    assert stats.published == 30
    assert stats.pending == 0
    ch = await channel_stats(nsqd, topic, "ch")
    assert ch == {}  # no channel yet; count through a consumer instead
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=30) as c:
        assert len(set(await collect(c, 30))) == 30


async def test_producer_with_no_reachable_nsqd() -> None:
    async with Producer(["127.0.0.1:1"], connect_timeout=1, timeout=5) as p:
        with pytest.raises(NoNSQDAvailable):
            await p.publish("t", b"x")


async def test_several_nsqd_through_lookupd(make_nsqd: NSQDFactory, nsqlookupd: Any) -> None:
    topic = fresh()
    first = make_nsqd(lookupd_tcp_addresses=[nsqlookupd.tcp_address])
    second = make_nsqd(lookupd_tcp_addresses=[nsqlookupd.tcp_address])
    async with Producer(first.tcp_address) as p1, Producer(second.tcp_address) as p2:
        await p1.multi_publish(topic, [b"1-%d" % i for i in range(10)])
        await p2.multi_publish(topic, [b"2-%d" % i for i in range(10)])
    # wait for both registrations to reach lookupd
    with anyio.fail_after(5):
        while len(await lookup_producers(nsqlookupd.http_url, topic)) < 2:
            await anyio.sleep(0.02)
    async with Consumer(
        topic, "ch", lookupd=[nsqlookupd.http_url], max_in_flight=20, lookupd_poll_interval=1
    ) as c:
        bodies = await collect(c, 20)
        addresses = {conn.address for conn in c.stats().connections}
    assert sorted(bodies) == sorted(
        [b"1-%d" % i for i in range(10)] + [b"2-%d" % i for i in range(10)]
    )
    assert len(addresses) == 2


async def test_tls_with_a_test_ca(make_nsqd: NSQDFactory, test_ca: CA) -> None:
    server = make_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file)
    topic = fresh()
    async with Producer(server.tcp_address, tls_ca_file=test_ca.ca_file) as p:
        await p.publish(topic, b"secret")
    async with Consumer(
        topic, "ch", nsqd=[server.tcp_address], tls_ca_file=test_ca.ca_file, max_in_flight=5
    ) as c:
        assert await collect(c, 1) == [b"secret"]


async def test_tls_verification_is_on_by_default(make_nsqd: NSQDFactory, test_ca: CA) -> None:
    server = make_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file)
    events: list[object] = []
    async with Producer(server.tcp_address, tls_v1=True, timeout=5) as p:
        with pytest.raises(NoNSQDAvailable, match=r"(?i)certificate|TLS"):
            await p.publish(fresh(), b"x")
    # A consumer does not crash on it: it logs, reports and keeps retrying.
    async with Consumer(
        fresh(),
        "ch",
        nsqd=[server.tcp_address],
        tls_v1=True,
        on_event=events.append,
        reconnect_delay=0.05,
        max_reconnect_delay=0.1,
    ) as c:
        with anyio.fail_after(5):
            while c.stats().connection_errors < 2:
                await anyio.sleep(0.02)
    assert any("certificate" in str(getattr(e, "error", "")).lower() for e in events)


def compression_option(name: str) -> dict[str, Any]:
    return {name: True}


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression_round_trip(nsqd: EmbeddedNSQD, compression: str) -> None:
    topic = fresh()
    bodies = [bytes([i % 256]) * (100 + i * 37) for i in range(50)]
    async with Producer(nsqd.tcp_address, **compression_option(compression)) as p:
        await p.multi_publish(topic, bodies[:25])
        for body in bodies[25:]:
            await p.publish(topic, body)
    async with Consumer(
        topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=50, **compression_option(compression)
    ) as c:
        got = await collect(c, 50)
        assert c.stats().connections[0].bytes_received > 0
    assert sorted(got) == sorted(bodies)


def _auth(request: AuthRequest) -> AuthState | None:
    if request.secret == "open-sesame":
        return AuthState(identity="tester", authorizations=(Authorization(topic=".*"),))
    if request.secret == "elsewhere-only":
        return AuthState(identity="limited", authorizations=(Authorization(topic="^elsewhere$"),))
    return AuthState(identity="nobody")


async def test_auth(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd(auth_check=_auth)
    topic = fresh()
    async with Producer(server.tcp_address, auth_secret="open-sesame") as p:
        await p.publish(topic, b"authorized")
    # A secret with no grant at all: nsqd refuses AUTH and closes, so no nsqd can take the
    # publish (NoNSQDAvailable, exactly), each address's cause nsqd's refusal.
    async with Producer(server.tcp_address, auth_secret="wrong", timeout=5) as p:
        with pytest.raises(NoNSQDAvailable, match="E_UNAUTHORIZED") as unreachable:
            await p.publish(topic, b"refused")
    assert type(unreachable.value) is NoNSQDAvailable
    [cause] = unreachable.value.errors
    assert type(cause) is ConnectionLost and str(cause).startswith(server.tcp_address)
    assert type(cause.__cause__) is Unauthorized
    # A grant for other topics only: nsqd refuses the PUB itself (Unauthorized, exactly).
    async with Producer(server.tcp_address, auth_secret="elsewhere-only", timeout=5) as p:
        with pytest.raises(Unauthorized, match="E_UNAUTHORIZED") as refused:
            await p.publish(topic, b"refused")
        await p.publish("elsewhere", b"granted")
    assert type(refused.value) is Unauthorized
    async with Consumer(topic, "ch", nsqd=[server.tcp_address], auth_secret="open-sesame") as c:
        assert await collect(c, 1) == [b"authorized"]

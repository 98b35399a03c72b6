"""Publish and consume on every runtime against the embedded broker over loopback: the round
trip, MPUB and DPUB, the HTTP producer, refused publishes, compression, discovery through
nsqlookupd, TLS (client certificates, server names), AUTH, host names. The broker's own stats
are the referee where they matter.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import anyio
import pytest
from support.brokers import embedded_topic_count, get_json, running_nsqd, unique
from support.runtimes import Runtime, broker_channel, wait_channel, wait_until
from support.tls import TestCA, make_test_ca

from nsq_sansio.errors import BadMessage, ConnectionLost, InvalidName, Unauthorized
from nsq_sansio.server.options import Authorization, AuthRequest, AuthState
from transports.embedded import EmbeddedLookupd, EmbeddedNSQD, ServerThread

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    pytest.importorskip("cryptography")
    return make_test_ca(tmp_path_factory.mktemp("ca"))


async def test_publish_consume_round_trip(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        for i in range(50):
            await p.publish(topic, b"m%d" % i)
        pstats = p.stats()
    assert pstats.published == 50 and pstats.failed == 0
    got: list[bytes] = []
    async with runtime.consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=10) as c:
        with anyio.fail_after(10):
            async for msg in c.messages():
                got.append(msg.body)
                assert msg.attempts == 1
                assert msg.nsqd_address == nsqd.tcp_address
                assert await c.finish(msg)
                if len(got) == 50:
                    break
        cstats = c.stats()
    assert got == [b"m%d" % i for i in range(50)]  # one connection: nsqd's order
    assert cstats.received == 50 and cstats.finished == 50
    (conn,) = cstats.connections
    assert (conn.state, conn.in_flight, conn.reconnects) == ("subscribed", 0, 0)
    assert conn.address == nsqd.tcp_address and conn.connected
    # Leaving the block closed the connection: the broker has no client and nothing in flight.
    ch = await wait_channel(nsqd, topic, "ch", lambda ch: not ch["clients"], what="closed")
    assert ch["in_flight_count"] == 0 and ch["depth"] == 0


async def test_multi_and_deferred_publish(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, [b"a", b"b", b"c"])
        sent_at = time.monotonic()
        await p.deferred_publish(topic, b"later", 0.3)
    async with runtime.consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5) as c:
        assert await c.bodies(3, timeout=10) == [b"a", b"b", b"c"]
        assert await c.bodies(1, timeout=10) == [b"later"]
        arrived = time.monotonic()
    assert arrived - sent_at >= 0.25  # nsqd held it for its delay


async def test_http_producer_pub_mpub_defer_with_failover(runtime: Runtime) -> None:
    topic = unique()
    with running_nsqd(max_msg_size=1000) as (server, _):
        # the first URL refuses connections: every publish fails over to the second
        async with runtime.http_producer(["http://127.0.0.1:1", server.http_url]) as hp:
            await hp.publish(topic, b"one")
            await hp.multi_publish(topic, [b"two\nlines", b"three"])  # binary MPUB keeps \n
            await hp.deferred_publish(topic, b"four", 0.2)
            with pytest.raises(runtime.module.HTTPPublishError) as info:
                await hp.publish(topic, b"x" * 2000)
            assert info.value.status >= 400
        async with runtime.consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as c:
            bodies = await c.bodies(4, timeout=10)
    assert bodies == [b"one", b"two\nlines", b"three", b"four"]


async def test_http_producer_survives_an_nsqd_restart(runtime: Runtime) -> None:
    # The pooled keep-alive connection is dead after the restart; the publish must be sent
    # again on a fresh connection (it failed before any byte of an answer), not fail.
    topic = unique()
    first = ServerThread(EmbeddedNSQD())
    server = first.start()
    tcp, http = server.tcp_address, server.http_url.removeprefix("http://")
    second: ServerThread[EmbeddedNSQD] | None = None
    try:
        async with runtime.http_producer(server.http_url) as hp:
            await hp.publish(topic, b"one")
            await anyio.to_thread.run_sync(first.stop)
            second = ServerThread(EmbeddedNSQD(tcp_address=tcp, http_address=http))
            server = await anyio.to_thread.run_sync(second.start)
            with anyio.fail_after(10):
                await hp.publish(topic, b"two")
                await hp.publish(topic, b"three")
        async with runtime.consumer(topic, "ch", nsqd=[server.tcp_address]) as c:
            assert sorted(await c.bodies(2, timeout=10)) == [b"three", b"two"]
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_publish_errors_are_raised_in_the_caller(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    async with runtime.producer(nsqd.tcp_address, max_attempts=5) as p:
        with pytest.raises(InvalidName) as bad_character:
            await p.publish("bad topic name!", b"x")
        # too long: refused before it is sent, as nsqd would refuse it
        with pytest.raises(InvalidName) as too_long:
            await p.publish("x" * 65, b"x")
        # names are checked before anything is sent: the documented type, exactly
        assert type(bad_character.value) is InvalidName and type(too_long.value) is InvalidName
        assert "topic" in str(bad_character.value).lower()
        assert p.stats().published == 0
        await p.publish(unique(), b"still usable")


async def test_a_refused_publish_fails_alone_and_the_pipeline_goes_on(runtime: Runtime) -> None:
    """nsqd closes the connection on E_BAD_MESSAGE: the refused publish raises the server's
    error; those pipelined behind it, never read by nsqd, are sent again after the reconnect
    and each stored exactly once."""
    topic = unique()
    with running_nsqd(max_msg_size=1000) as (server, _):
        async with runtime.producer(
            server.tcp_address, reconnect_delay=0.05, max_reconnect_delay=0.1
        ) as p:
            await p.publish(topic, b"warm")  # the connection is up: the rest go out pipelined
            outcomes = await p.concurrently(
                [("publish", (topic, b"x" * 2000 if i == 10 else b"%d" % i)) for i in range(50)],
                timeout=15,
            )
        bad = outcomes.pop(10)
        assert type(bad) is BadMessage and bad.code == "E_BAD_MESSAGE"
        assert set(outcomes) == {None}
        expected = sorted([b"warm"] + [b"%d" % i for i in range(50) if i != 10])
        async with runtime.consumer(topic, "ch", nsqd=[server.tcp_address], max_in_flight=100) as c:
            assert sorted(await c.bodies(50, timeout=10)) == expected
            assert await c.get(timeout=0.2) is None
            assert c.stats().received == 50  # each exactly once


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compressed_connections(
    runtime: Runtime, nsqd: EmbeddedNSQD, compression: str
) -> None:
    topic = unique()
    options: dict[str, Any] = {compression: True}
    bodies = [bytes([i % 256]) * (100 + i * 37) for i in range(50)] + [
        b"compressible " * 200 + b"%d" % i for i in range(50)
    ]
    async with runtime.producer(nsqd.tcp_address, **options) as p:
        await p.multi_publish(topic, bodies[:25])
        for body in bodies[25:50]:
            await p.publish(topic, body)
        await p.multi_publish(topic, bodies[50:])
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=20, **options
    ) as c:
        got = await c.bodies(100, timeout=15)
        assert c.stats().connections[0].bytes_received > 0
        channel = await broker_channel(nsqd, topic, "c")
    assert got == bodies
    assert channel["clients"][0][compression] is True


async def _lookup_producers(lookupd_http_url: str, topic: str) -> list[Any]:
    """``/lookup?topic=`` producers (an unknown topic gives [])."""
    try:
        answer = await anyio.to_thread.run_sync(
            get_json, f"{lookupd_http_url}/lookup?topic={topic}"
        )
    except OSError:
        return []
    return list(answer.get("producers", []))


async def test_several_nsqd_through_lookupd(runtime: Runtime, nsqlookupd: EmbeddedLookupd) -> None:
    topic = unique()
    options = {"lookupd_tcp_addresses": [nsqlookupd.tcp_address]}
    with running_nsqd(**options) as (first, _), running_nsqd(**options) as (second, _):
        for index, server in enumerate((first, second)):
            async with runtime.producer(server.tcp_address) as p:
                await p.multi_publish(topic, [b"%d-%d" % (index, i) for i in range(20)])
        lookup = nsqlookupd.http_url
        with anyio.fail_after(10):  # both registrations reach lookupd
            while len(await _lookup_producers(lookup, topic)) < 2:
                await anyio.sleep(0.02)
        got: set[bytes] = set()
        addresses: set[str] = set()
        async with runtime.consumer(
            topic, "c", lookupd=[lookup], max_in_flight=10, lookupd_poll_interval=0.5
        ) as c:
            with anyio.fail_after(15):
                async for msg in c.messages():
                    got.add(msg.body)
                    addresses.add(msg.nsqd_address)
                    await c.finish(msg)
                    if len(got) == 40:
                        break
            stats = c.stats()
    assert got == {b"%d-%d" % (n, i) for n in range(2) for i in range(20)}
    assert addresses == {first.tcp_address, second.tcp_address}
    assert stats.connected == 2 and len({conn.address for conn in stats.connections}) == 2
    assert sum(conn.rdy for conn in stats.connections) <= 10


async def test_tls_with_a_test_ca(runtime: Runtime, test_ca: TestCA) -> None:
    topic = unique()
    with running_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file) as (server, _):
        async with runtime.producer(server.tcp_address, tls_ca_file=test_ca.ca_file) as p:
            await p.multi_publish(topic, [b"secret %d" % i for i in range(10)])
            assert p.client.config.tls_v1
        options = runtime.module.TLSOptions(ca_file=test_ca.ca_file, server_name="nsqd.test")
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=5, tls=options
        ) as c:
            got = await c.bodies(10, timeout=10)
            channel = await broker_channel(server, topic, "c")
    assert got == [b"secret %d" % i for i in range(10)]
    assert channel["clients"][0]["tls"] is True


async def test_tls_verification_is_on_by_default(
    runtime: Runtime, test_ca: TestCA, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the private CA the certificate is refused: the publish raises NoNSQDAvailable
    (the connection's failure, never the publish's); the consumer logs, reports and retries,
    never raises, and no message flows."""
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    events: list[object] = []
    with running_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file) as (server, _):
        async with runtime.producer(server.tcp_address, tls_v1=True, timeout=5) as p:
            with pytest.raises(runtime.module.NoNSQDAvailable) as refused:
                await p.publish(unique(), b"x")
        assert type(refused.value) is runtime.module.NoNSQDAvailable
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
        async with runtime.consumer(
            unique(),
            "c",
            nsqd=[server.tcp_address],
            tls_v1=True,
            on_event=events.append,
            reconnect_delay=0.05,
            max_reconnect_delay=0.1,
        ) as c:
            await wait_until(lambda: c.stats().connection_errors >= 2, what="TLS failures")
            assert await c.get(timeout=0.05) is None
    assert any("certificate" in str(getattr(e, "error", "")).lower() for e in events)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    assert server.tcp_address in caplog.text  # log lines carry the connection address


async def test_tls_with_compression_and_client_certificate(
    runtime: Runtime, test_ca: TestCA
) -> None:
    """TLS with snappy (producer) and deflate (consumer) under it, the client presenting its
    own certificate."""
    topic = unique()
    with running_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file) as (server, _):
        tls: dict[str, Any] = {
            "tls_ca_file": test_ca.ca_file,
            "tls_cert_file": test_ca.client_cert_file,
            "tls_key_file": test_ca.client_key_file,
        }
        async with runtime.producer(server.tcp_address, snappy=True, **tls) as p:
            await p.multi_publish(topic, [b"x" * 5000] * 5)
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], deflate=True, **tls
        ) as c:
            bodies = await c.bodies(5, timeout=10)  # max_in_flight=1: one at a time
            channel = await broker_channel(server, topic, "c")
    assert bodies == [b"x" * 5000] * 5
    assert channel["clients"][0]["tls"] is True and channel["clients"][0]["deflate"] is True


async def test_wrong_server_name_is_refused(runtime: Runtime, test_ca: TestCA) -> None:
    with running_nsqd(tls_cert=test_ca.cert_file, tls_key=test_ca.key_file) as (server, _):
        async with runtime.producer(
            server.tcp_address,
            tls_ca_file=test_ca.ca_file,
            tls_server_name="not-nsqd.example",
            timeout=1.0,
        ) as p:
            with pytest.raises(runtime.module.NoNSQDAvailable) as refused:
                await p.publish(unique(), b"x")
    assert type(refused.value) is runtime.module.NoNSQDAvailable
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)  # the name does not match


async def test_client_certificate_required_by_nsqd(runtime: Runtime, test_ca: TestCA) -> None:
    """--tls-client-auth-policy=require-verify: the client's certificate is what lets it in."""
    topic = unique()
    server_tls = {
        "tls_cert": test_ca.cert_file,
        "tls_key": test_ca.key_file,
        "tls_root_ca_file": test_ca.ca_file,
        "tls_client_auth_policy": "require-verify",
    }
    with running_nsqd(**server_tls) as (server, runner):
        with_cert: dict[str, Any] = {
            "tls_ca_file": test_ca.ca_file,
            "tls_cert_file": test_ca.client_cert_file,
            "tls_key_file": test_ca.client_key_file,
        }
        async with runtime.producer(server.tcp_address, **with_cert) as p:
            await p.publish(topic, b"for certified eyes")
        async with runtime.consumer(topic, "c", nsqd=[server.tcp_address], **with_cert) as c:
            assert await c.bodies(1, timeout=10) == [b"for certified eyes"]
        # The same CA but no client certificate: the handshake is refused, nothing flows.
        async with runtime.producer(
            server.tcp_address, tls_ca_file=test_ca.ca_file, timeout=2
        ) as p:
            with pytest.raises(runtime.module.NoNSQDAvailable) as refused:
                await p.publish(topic, b"should not arrive")
        assert type(refused.value) is runtime.module.NoNSQDAvailable
        assert str(refused.value).startswith(
            f"no nsqd could take the publish: {server.tcp_address}"
        )
        # (read on the broker's loop: its HTTP port wants a client certificate too)
        assert embedded_topic_count(runner, topic) == 1  # only the certified one


def _auth(request: AuthRequest) -> AuthState | None:
    if request.secret == "open-sesame":
        return AuthState(identity="tester", authorizations=(Authorization(topic=".*"),))
    if request.secret == "elsewhere-only":
        return AuthState(identity="limited", authorizations=(Authorization(topic="^elsewhere$"),))
    return AuthState(identity="nobody")


async def test_auth(runtime: Runtime) -> None:
    topic = unique()
    NoNSQDAvailable = runtime.module.NoNSQDAvailable
    with running_nsqd(auth_check=_auth) as (server, _):
        async with runtime.producer(server.tcp_address, auth_secret="open-sesame") as p:
            await p.publish(topic, b"authorized")
        # A secret with no grant at all: nsqd refuses AUTH and closes, so no nsqd can take
        # the publish (NoNSQDAvailable, exactly), each address's cause nsqd's refusal.
        async with runtime.producer(server.tcp_address, auth_secret="wrong", timeout=5) as p:
            with pytest.raises(NoNSQDAvailable, match="E_UNAUTHORIZED") as unreachable:
                await p.publish(topic, b"refused")
        assert type(unreachable.value) is NoNSQDAvailable
        [cause] = unreachable.value.errors
        assert type(cause) is ConnectionLost and str(cause).startswith(server.tcp_address)
        assert type(cause.__cause__) is Unauthorized
        # A grant for other topics only: nsqd refuses the PUB itself (Unauthorized, exactly).
        async with runtime.producer(
            server.tcp_address, auth_secret="elsewhere-only", timeout=5
        ) as p:
            with pytest.raises(Unauthorized, match="E_UNAUTHORIZED") as refused:
                await p.publish(topic, b"refused")
            await p.publish("elsewhere", b"granted")
        assert type(refused.value) is Unauthorized
        # the secret as bytes works as well as a str
        async with runtime.consumer(
            topic, "ch", nsqd=[server.tcp_address], auth_secret=b"open-sesame"
        ) as c:
            assert await c.bodies(1, timeout=10) == [b"authorized"]
        # a secret with no grant: nsqd closes the connection; the consumer only reports it
        async with runtime.consumer(
            topic,
            "ch",
            nsqd=[server.tcp_address],
            auth_secret="wrong",
            reconnect_delay=0.05,
            max_reconnect_delay=0.1,
        ) as c:
            await wait_until(lambda: c.stats().reconnects >= 1, what="reconnect attempts")
            assert await c.get(timeout=0.05) is None


async def test_consumer_survives_unreachable_nsqd_and_reports_it(runtime: Runtime) -> None:
    with running_nsqd() as (server, _):
        address = server.tcp_address
    # the port is closed now: connection errors are logged and counted, never raised
    async with runtime.consumer(
        unique(), "c", nsqd=[address], reconnect_delay=0.05, max_reconnect_delay=0.1
    ) as c:
        await wait_until(lambda: c.stats().connection_errors >= 3, what="retries")
        assert await c.get(timeout=0.05) is None


async def test_host_names_are_resolved(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """An nsqd given by host name (``localhost:port``) is reached by producers and consumers
    (the blocking ones resolve it off their IO thread)."""
    port = nsqd.tcp_address.rsplit(":", 1)[1]
    topic = unique()
    async with runtime.producer(f"localhost:{port}") as p:
        await p.publish(topic, b"by name")
    async with runtime.consumer(topic, "c", nsqd=[f"localhost:{port}"]) as c:
        assert await c.bodies(1, timeout=5) == [b"by name"]


async def test_run_finishes_on_return_and_requeues_on_raise(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """run()'s handler: a return FINs, a raise REQs (the message comes again, attempts 2);
    handlers at once are bounded by max_in_flight, not by the workers asked for."""
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, [b"%d" % i for i in range(40)])
    seen: dict[bytes, list[int]] = {}
    active = peak = 0
    lock = threading.Lock()

    def complete() -> bool:
        return len(seen) == 40 and all(
            len(n) == (2 if int(b) % 5 == 0 else 1) for b, n in seen.items()
        )

    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_in_flight=4,
        backoff_enabled=False,
        default_requeue_delay=0.0,
    ) as c:

        def handler(msg: Any) -> None:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
                seen.setdefault(msg.body, []).append(msg.attempts)
            try:
                if runtime.blocking:
                    time.sleep(0.01)  # worker threads overlap: the bound is what is seen
                if msg.attempts == 1 and int(msg.body) % 5 == 0:
                    raise RuntimeError("downstream is down")
            finally:
                with lock:
                    active -= 1

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(c.run, handler, 8)
                await wait_until(
                    lambda: complete() and c.stats().finished == 40, timeout=15, what="all"
                )
                await runtime.call(c.client.drain, timeout=5)
        stats = c.stats()
    assert set(seen) == {b"%d" % i for i in range(40)}
    assert all(n == ([1, 2] if int(b) % 5 == 0 else [1]) for b, n in seen.items())
    assert (stats.requeued, stats.finished) == (8, 40)
    assert peak <= 4  # concurrency bounded by max_in_flight, not by the 8 workers

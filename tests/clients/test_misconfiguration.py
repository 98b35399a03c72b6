"""On every runtime, a misconfiguration is one clear error, not a reconnect loop: a consumer or
a producer pointed at nsqd's HTTP port, TLS (or snappy, deflate) asked of an nsqd without it,
an nsqd requiring AUTH of a client without a secret, a delay given in milliseconds. Each fails
once, names the address (or the seconds and the limit), and makes one connection attempt
(counted through a forwarding proxy), against the embedded nsqd and, where the behaviour is
nsqd's, the real one (skipped without the binaries)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from support.brokers import (
    BROKER_KINDS,
    embedded_topic_count,
    running_nsqd,
    topic_count,
    unique,
)
from support.proxy import CountingProxy
from support.runtimes import Runtime

from nsq_sansio.consumer import ConsumerFailed, Disconnected
from nsq_sansio.errors import (
    AuthSecretMissing,
    CompressionUnavailable,
    DelayOutOfRange,
    IncompatibleNSQD,
    TLSUnavailable,
    WrongPort,
)
from transports.testing.real_nsq import RealNSQD, nsqd_flags

pytestmark = pytest.mark.anyio

#: A reconnect loop would show within the test's wait: retries 50 ms apart.
FAST_RETRY = {"reconnect_delay": 0.05, "max_reconnect_delay": 0.1}


@dataclass
class Broker:
    tcp_address: str
    http_address: str
    _count: Any

    def stored(self, topic: str) -> int:
        """Messages nsqd stored for ``topic``."""
        return int(self._count(topic))


@contextmanager
def broker(kind: str, **options: Any) -> Iterator[Broker]:
    """An nsqd (embedded or real) with ``options`` (EmbeddedNSQD's keyword arguments)."""
    if kind == "real":
        flags, _ = nsqd_flags(**options)
        with RealNSQD(flags) as real:
            yield Broker(real.tcp_address, real.http_address, lambda t: topic_count(real, t))
    else:
        with running_nsqd(**options) as (server, runner):
            yield Broker(
                server.tcp_address,
                server.http_url.removeprefix("http://"),
                lambda t: embedded_topic_count(runner, t),
            )


async def consume_until_failed(runtime: Runtime, address: str, **options: Any) -> BaseException:
    """A consumer of ``address``: what its iteration raised (it must fail, within 20 s)."""
    events: list[object] = []
    with anyio.fail_after(20), pytest.raises(IncompatibleNSQD) as info:
        async with runtime.consumer(
            unique(), "c", nsqd=[address], on_event=events.append, **FAST_RETRY, **options
        ) as consumer:
            async for _ in consumer.messages():
                raise AssertionError("no message can come")
    await anyio.sleep(0.5)  # ten reconnect delays: a loop would have dialed again
    assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1
    assert len([e for e in events if isinstance(e, Disconnected)]) == 1
    return info.value


def one_error_line(caplog: pytest.LogCaptureFixture, address: str) -> str:
    """The refusal is logged once, at ERROR, naming the address once; no WARNING repeats it."""
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    text = lines[0].getMessage()
    assert lines[0].levelname == "ERROR" and text.count(address) == 1, text
    return text


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_consumer_at_nsqds_http_port_fails_once(
    kind: str, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    with broker(kind) as nsqd, CountingProxy(nsqd.http_address) as proxy:
        error = await consume_until_failed(runtime, proxy.address)
        assert type(error) is WrongPort and error.looks_like == "HTTP"
        assert str(error).startswith(f"{proxy.address} answered like an HTTP server")
        assert "nsqd's TCP port is usually 4150" in str(error)
        assert proxy.accepted == 1
    one_error_line(caplog, proxy.address)


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_producer_at_nsqds_http_port_fails_once(
    kind: str, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    with broker(kind) as nsqd, CountingProxy(nsqd.http_address) as proxy:
        async with runtime.producer(proxy.address, **FAST_RETRY) as producer:
            with anyio.fail_after(20), pytest.raises(WrongPort) as info:
                await producer.publish(unique(), b"x")
            await anyio.sleep(0.5)  # nothing dials again by itself
            assert proxy.accepted == 1
        assert str(info.value).startswith(f"{proxy.address} answered like an HTTP server")
    text = one_error_line(caplog, proxy.address)
    assert text.startswith(
        f"[{proxy.address}] nsqd cannot serve this producer: answered like an HTTP server"
    ), text


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_tls_asked_of_an_nsqd_without_it_fails_once(
    kind: str, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    with broker(kind) as nsqd, CountingProxy(nsqd.tcp_address) as proxy:
        error = await consume_until_failed(runtime, proxy.address, tls_v1=True)
        assert type(error) is TLSUnavailable
        assert f"but {proxy.address} did not enable it" in str(error)
        assert proxy.accepted == 1
        one_error_line(caplog, proxy.address)
        caplog.clear()
        async with runtime.producer(proxy.address, tls_v1=True, **FAST_RETRY) as producer:
            with anyio.fail_after(20), pytest.raises(TLSUnavailable):
                await producer.publish(unique(), b"x")
            await anyio.sleep(0.5)
            assert proxy.accepted == 2  # the producer's one attempt
        one_error_line(caplog, proxy.address)


#: What a client asks that an nsqd started with these options cannot give: the client's
#: options, nsqd's, the error expected and a phrase of its text. nsqd's auth server is never
#: asked (no AUTH is sent without a secret): an address that answers nothing will do.
UNMET = {
    "snappy": ({"snappy": True}, {"snappy": False}, CompressionUnavailable, "snappy compression"),
    "deflate": ({"deflate": True}, {"deflate": False}, CompressionUnavailable, "deflate"),
    "auth": ({}, {"auth_http_addresses": ["127.0.0.1:1"]}, AuthSecretMissing, "requires AUTH"),
}


@pytest.mark.parametrize("kind", BROKER_KINDS)
@pytest.mark.parametrize("feature", list(UNMET))
async def test_a_feature_nsqd_cannot_serve_fails_once(
    feature: str, kind: str, runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """Snappy or deflate asked of an nsqd with it turned off, or an nsqd requiring AUTH of a
    client without a secret: fatal at the first attempt, as IdentifyRejected is (not retried),
    for a consumer and a producer alike, the address named once."""
    client, server, expected, phrase = UNMET[feature]
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    with broker(kind, **server) as nsqd, CountingProxy(nsqd.tcp_address) as proxy:
        error = await consume_until_failed(runtime, proxy.address, **client)
        assert type(error) is expected and phrase in str(error), error
        assert str(error).count(proxy.address) == 1, error
        assert proxy.accepted == 1
        one_error_line(caplog, proxy.address)
        caplog.clear()
        async with runtime.producer(proxy.address, **client, **FAST_RETRY) as producer:
            with anyio.fail_after(20), pytest.raises(expected):
                await producer.publish(unique(), b"x")
            await anyio.sleep(0.5)  # nothing dials again by itself
            assert proxy.accepted == 2  # the producer's one attempt
        one_error_line(caplog, proxy.address)


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_delay_in_milliseconds_is_refused_before_anything_is_sent(
    kind: str, runtime: Runtime
) -> None:
    """5000 (a habit of milliseconds) is above nsqd's default --max-req-timeout of an hour:
    refused locally, naming seconds and the limit; nsqd stores nothing and the connection
    stays up (nsqd would have answered a fatal E_INVALID and closed it)."""
    topic = unique()
    with broker(kind) as nsqd, CountingProxy(nsqd.tcp_address) as proxy:
        async with runtime.producer(proxy.address) as producer:
            await producer.publish(topic, b"first")  # connected
            with pytest.raises(DelayOutOfRange) as info:
                await producer.deferred_publish(topic, b"late", 5000)
            assert "5000 seconds" in str(info.value) and "3600 seconds" in str(info.value)
            assert "not milliseconds" in str(info.value)
            assert (info.value.delay, info.value.limit) == (5000, 3600)
            await producer.publish(topic, b"second")
            assert producer.stats().reconnects == 0
        assert proxy.accepted == 1
        assert nsqd.stored(topic) == 2


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_configured_max_req_timeout_bounds_deferred_publish(
    kind: str, runtime: Runtime
) -> None:
    """nsqd does not announce its --max-req-timeout: given as Config.max_req_timeout, a DPUB
    above it is refused locally (the real nsqd would refuse it with a fatal E_INVALID)."""
    topic = unique()
    with broker(kind, max_req_timeout=10.0) as nsqd, CountingProxy(nsqd.tcp_address) as proxy:
        async with runtime.producer(proxy.address, max_req_timeout=10.0) as producer:
            await producer.deferred_publish(topic, b"ok", 10)
            with pytest.raises(DelayOutOfRange, match="20 seconds is above the 10 seconds"):
                await producer.deferred_publish(topic, b"too late", 20)
            await producer.publish(topic, b"after")
        assert proxy.accepted == 1
        assert nsqd.stored(topic) == 2


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_an_http_defer_above_max_req_timeout_is_refused_before_it_is_sent(
    kind: str, runtime: Runtime
) -> None:
    """HTTPProducer's ``/pub?defer=``: 5000 (milliseconds meant) is above nsqd's default hour
    and 20 above a configured 10 s: refused locally, naming seconds and the limit (nsqd would
    answer 400 INVALID_DEFER), nothing stored; a delay within the limit is published."""
    topic = unique()
    with broker(kind, max_req_timeout=10.0) as nsqd:
        url = f"http://{nsqd.http_address}"
        async with runtime.http_producer(url) as producer:
            with pytest.raises(DelayOutOfRange) as info:
                await producer.deferred_publish(topic, b"late", 5000)
            assert "5000 seconds" in str(info.value) and "3600 seconds" in str(info.value)
            assert "not milliseconds" in str(info.value)
        async with runtime.http_producer(url, max_req_timeout=10.0) as producer:
            with pytest.raises(DelayOutOfRange, match="20 seconds is above the 10 seconds"):
                await producer.deferred_publish(topic, b"too late", 20)
            await producer.deferred_publish(topic, b"ok", 10)
        assert nsqd.stored(topic) == 1


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_requeue_above_max_req_timeout_is_refused_and_answers_nothing(
    kind: str, runtime: Runtime
) -> None:
    topic = unique()
    with broker(kind, max_req_timeout=10.0) as nsqd:
        async with runtime.producer(nsqd.tcp_address) as producer:
            await producer.publish(topic, b"x")
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], max_req_timeout=10.0
        ) as consumer:
            message = await consumer.get(10)
            assert message is not None
            with pytest.raises(DelayOutOfRange, match=r"requeue.* 20 seconds .* 10 seconds"):
                await answer(runtime, message.requeue, 20)
            assert not message.answered
            assert consumer.stats().requeued == 0
            assert await answer(runtime, message.requeue, 0, backoff=False)  # still ours
            again = await consumer.get(10)
            assert again is not None and again.id == message.id and again.attempts == 2
            await consumer.finish(again)


async def answer(runtime: Runtime, method: Any, *args: Any, **kwargs: Any) -> Any:
    """A message's answer: awaited (async) or called (blocking: it never blocks)."""
    if runtime.blocking:
        return method(*args, **kwargs)
    return await method(*args, **kwargs)

"""The producers' contract, the same on asyncio, trio and blocking: for ``Producer`` (TCP) and
``HTTPProducer``, every public call before the start, after close, twice, with wrong
arguments, cut short (a deadline or a cancellation) and while the producer closes raises the
same documented exception type on every runtime, or behaves the same; nothing is lost or
stored twice silently. ``test_parity.py`` holds the documented misuse table; this file holds
the producers' cases it does not, against the embedded nsqd over loopback.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import pytest
from support.brokers import embedded_topic_count, get_json, running_nsqd, unique
from support.proxy import CountingProxy
from support.runtimes import Runtime, wait_until

from nsq_sansio.errors import (
    BadMessage,
    ConnectionLost,
    DelayOutOfRange,
    HTTPPublishError,
    InvalidName,
    LocalProtocolError,
)
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


# --- a gate on nsqd's answers ----------------------------------------------------------------


@contextlib.contextmanager
def gated_nsqd() -> Iterator[tuple[CountingProxy, Callable[[str], int]]]:
    """An embedded nsqd behind a proxy that can hold its answers back
    (:meth:`~support.proxy.CountingProxy.hold`), and how many messages it stored for a topic."""
    with running_nsqd() as (server, runner), CountingProxy(server.tcp_address) as gate:
        yield gate, lambda topic: embedded_topic_count(runner, topic)


# --- bad arguments: one exception type everywhere ------------------------------------------------


@dataclass(frozen=True)
class BadCall:
    what: str
    call: Callable[[Any], Any]
    error: type[BaseException]
    kinds: tuple[str, ...] = ("tcp", "http")


BAD_CALLS = [
    BadCall("empty topic", lambda p: p.publish("", b"x"), InvalidName),
    BadCall("topic None", lambda p: p.publish(None, b"x"), InvalidName),
    BadCall("topic bytes", lambda p: p.publish(b"t", b"x"), InvalidName),
    BadCall("topic of 65 characters", lambda p: p.publish("a" * 65, b"x"), InvalidName),
    BadCall("body None", lambda p: p.publish("t", None), LocalProtocolError),
    BadCall("body int", lambda p: p.publish("t", 5), LocalProtocolError),
    BadCall("multi_publish bad topic", lambda p: p.multi_publish("bad topic", [b"a"]), InvalidName),
    BadCall(
        "multi_publish a str body", lambda p: p.multi_publish("t", [b"a", "b"]), LocalProtocolError
    ),
    BadCall(
        "multi_publish an empty body",
        lambda p: p.multi_publish("t", [b"a", b""]),
        LocalProtocolError,
    ),
    BadCall("multi_publish None", lambda p: p.multi_publish("t", None), LocalProtocolError),
    BadCall("multi_publish an int", lambda p: p.multi_publish("t", 5), LocalProtocolError),
    BadCall(
        "multi_publish empty iterator", lambda p: p.multi_publish("t", iter([])), LocalProtocolError
    ),
    BadCall(
        "deferred_publish bad topic",
        lambda p: p.deferred_publish("bad topic", b"x", 1),
        InvalidName,
    ),
    BadCall(
        "deferred_publish empty body", lambda p: p.deferred_publish("t", b"", 1), LocalProtocolError
    ),
    BadCall(
        "deferred_publish delay None",
        lambda p: p.deferred_publish("t", b"x", None),
        LocalProtocolError,
    ),
    BadCall(
        "deferred_publish delay True",
        lambda p: p.deferred_publish("t", b"x", True),
        LocalProtocolError,
    ),
    BadCall(
        "deferred_publish delay -inf",
        lambda p: p.deferred_publish("t", b"x", -math.inf),
        LocalProtocolError,
    ),
    # Above nsqd's --max-req-timeout, however far: DelayOutOfRange (milliseconds meant).
    BadCall(
        "deferred_publish 3600.5 s",
        lambda p: p.deferred_publish("t", b"x", 3600.5),
        DelayOutOfRange,
    ),
    BadCall(
        "deferred_publish 10**7 s", lambda p: p.deferred_publish("t", b"x", 10**7), DelayOutOfRange
    ),
    BadCall(
        "deferred_publish 1e12 s", lambda p: p.deferred_publish("t", b"x", 1e12), DelayOutOfRange
    ),
    BadCall("connect(0)", lambda p: p.connect(0), LocalProtocolError, ("tcp",)),
    BadCall("connect('1')", lambda p: p.connect("1"), LocalProtocolError, ("tcp",)),
    BadCall("close(nan)", lambda p: p.close(math.nan), LocalProtocolError, ("tcp",)),
]
CASES = [(bad, kind) for bad in BAD_CALLS for kind in bad.kinds]


@pytest.mark.parametrize(("bad", "kind"), CASES, ids=[f"{k}: {b.what}" for b, k in CASES])
async def test_a_bad_argument_raises_the_same_type(
    runtime: Runtime, nsqd: EmbeddedNSQD, bad: BadCall, kind: str
) -> None:
    """Checked where the call was made, before anything is sent (exactly this type)."""
    if kind == "tcp":
        context = runtime.producer(nsqd.tcp_address)
    else:
        context = runtime.http_producer(nsqd.http_url)
    async with context as p:
        with pytest.raises(BaseException) as raised:
            await runtime.call(bad.call, p.client)
        assert type(raised.value) is bad.error, f"{bad.what}: {raised.value!r}"
        if kind == "tcp":
            assert p.client.stats().pending == 0
    assert embedded_topic_count_of(nsqd, "t") == 0


def embedded_topic_count_of(server: EmbeddedNSQD, topic: str) -> int:
    """Messages ``server`` (the ``nsqd`` fixture) stored for ``topic``, over its HTTP API."""
    stats = get_json(f"{server.http_url}/stats?format=json&topic={topic}")
    return sum(t["message_count"] for t in stats.get("topics") or () if t["topic_name"] == topic)


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_a_delay_out_of_range_is_refused_before_connecting(
    runtime: Runtime, kind: str
) -> None:
    """With no nsqd reachable, a DPUB over the limit is still the caller's mistake
    (DelayOutOfRange), not NoNSQDAvailable: nothing is sent, no connection is tried."""
    if kind == "tcp":
        context = runtime.producer("127.0.0.1:1", connect_timeout=1.0)
    else:
        context = runtime.http_producer("http://127.0.0.1:1", connect_timeout=1.0)
    async with context as p:
        with pytest.raises(DelayOutOfRange):
            await p.deferred_publish("t", b"x", 5000)


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_a_body_over_max_msg_size_fails_only_itself(
    runtime: Runtime, nsqd: EmbeddedNSQD, kind: str
) -> None:
    """nsqd's limit is not announced, so nsqd refuses it: BadMessage over TCP, an
    HTTPPublishError (413) over HTTP, on every runtime; the next publish goes through and
    nothing of the refused one was stored."""
    topic = unique()
    too_big = b"x" * (1024 * 1024 + 1)
    if kind == "tcp":
        async with runtime.producer(nsqd.tcp_address) as p:
            for call in (
                lambda: p.publish(topic, too_big),
                lambda: p.multi_publish(topic, [b"small", too_big]),
                lambda: p.deferred_publish(topic, too_big, 1),
            ):
                with pytest.raises(BadMessage):
                    await call()
            await p.publish(topic, b"next")
            assert (p.stats().published, p.stats().failed) == (1, 3)
    else:
        async with runtime.http_producer(nsqd.http_url) as h:
            for call in (
                lambda: h.publish(topic, too_big),
                lambda: h.multi_publish(topic, [b"small", too_big]),
                lambda: h.deferred_publish(topic, too_big, 1),
            ):
                with pytest.raises(HTTPPublishError) as refused:
                    await call()
                assert type(refused.value) is HTTPPublishError and refused.value.status == 413
            await h.publish(topic, b"next")
    assert embedded_topic_count_of(nsqd, topic) == 1


# --- the life cycle -------------------------------------------------------------------------------


async def _enter(runtime: Runtime, client: Any) -> Any:
    if runtime.blocking:
        return await runtime.call(client.__enter__)
    return await client.__aenter__()


async def _exit(runtime: Runtime, client: Any) -> Any:
    if runtime.blocking:
        return await runtime.call(client.__exit__, None, None, None)
    return await client.__aexit__(None, None, None)


def _make(runtime: Runtime, kind: str, nsqd: EmbeddedNSQD) -> Any:
    if kind == "tcp":
        return runtime.module.Producer(nsqd.tcp_address)
    return runtime.module.HTTPProducer(nsqd.http_url)


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_a_closed_producer_cannot_be_entered_again(
    runtime: Runtime, nsqd: EmbeddedNSQD, kind: str
) -> None:
    """A producer's block is entered once: after it ended, ``with`` raises LocalProtocolError
    (asyncio and trio once left a task group open behind it, which trio reports as a corrupted
    nursery stack)."""
    producer = _make(runtime, kind, nsqd)
    await _enter(runtime, producer)
    await runtime.call(producer.publish, unique(), b"x")
    await _exit(runtime, producer)
    with pytest.raises(LocalProtocolError, match="closed"):
        await _enter(runtime, producer)
    with pytest.raises(LocalProtocolError, match="closed"):
        await runtime.call(producer.publish, unique(), b"x")


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_a_producer_block_is_not_reentrant(
    runtime: Runtime, nsqd: EmbeddedNSQD, kind: str
) -> None:
    """Entering an entered producer again raises LocalProtocolError (the inner block's end
    would close it under the outer one); the producer stays usable."""
    producer = _make(runtime, kind, nsqd)
    topic = unique()
    await _enter(runtime, producer)
    try:
        with pytest.raises(LocalProtocolError, match="already"):
            await _enter(runtime, producer)
        await runtime.call(producer.publish, topic, b"still open")
    finally:
        await _exit(runtime, producer)
    assert embedded_topic_count_of(nsqd, topic) == 1


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_close_before_start_and_twice(
    runtime: Runtime, nsqd: EmbeddedNSQD, kind: str
) -> None:
    """close() is allowed before the start and again after it: nothing raised, and the
    producer is closed (a publish or a ``with`` raises LocalProtocolError "closed")."""
    producer = _make(runtime, kind, nsqd)
    if kind == "tcp":
        assert producer.stats().pending == 0
        assert {c.state for c in producer.stats().connections} == {"closed"}
    await runtime.call(producer.close)
    await runtime.call(producer.close)
    with pytest.raises(LocalProtocolError, match="closed"):
        await runtime.call(producer.publish, unique(), b"x")
    with pytest.raises(LocalProtocolError, match="closed"):
        await _enter(runtime, producer)


async def test_after_close_every_call_says_closed(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """Every publishing call and connect() on a closed producer raise LocalProtocolError; the
    arguments are still checked first (their own error); stats() still answers, every
    connection "closed"."""
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"x")
    client = p.client
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("publish", lambda: client.publish(topic, b"x")),
        ("multi_publish", lambda: client.multi_publish(topic, [b"x"])),
        ("deferred_publish", lambda: client.deferred_publish(topic, b"x", 1)),
        ("connect", lambda: client.connect()),
    ]
    if runtime.blocking:
        calls += [
            ("publish_async", lambda: client.publish_async(topic, b"x")),
            ("multi_publish_async", lambda: client.multi_publish_async(topic, [b"x"])),
            ("deferred_publish_async", lambda: client.deferred_publish_async(topic, b"x", 1)),
        ]
    for name, call in calls:
        with pytest.raises(LocalProtocolError, match="closed"):
            await runtime.call(call)
            pytest.fail(f"{name}() on a closed producer")
    with pytest.raises(InvalidName):
        await runtime.call(client.publish, "bad topic", b"x")
    await runtime.call(client.close)  # twice: nothing
    stats = client.stats()
    assert stats.pending == 0 and stats.published == 1 and stats.failed == 0
    assert {c.state for c in stats.connections} == {"closed"}
    assert not any(c.connected for c in stats.connections)
    assert embedded_topic_count_of(nsqd, topic) == 1


@pytest.mark.parametrize("kind", ["tcp", "http"])
async def test_user_exception_in_the_block_comes_back_as_itself(
    runtime: Runtime, nsqd: EmbeddedNSQD, kind: str
) -> None:
    class Mine(Exception):
        pass

    topic = unique()
    with pytest.raises(Mine) as raised:
        if kind == "tcp":
            async with runtime.producer(nsqd.tcp_address) as p:
                await p.publish(topic, b"x")
                raise Mine("mine")
        else:
            async with runtime.http_producer(nsqd.http_url) as h:
                await h.publish(topic, b"x")
                raise Mine("mine")
    assert type(raised.value) is Mine
    assert embedded_topic_count_of(nsqd, topic) == 1


async def test_a_failing_publish_observer_does_not_fail_the_publish(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """The observer is user code on the library's path: its exception is logged, the publish
    stands (documented)."""
    caplog.set_level(logging.ERROR, logger="nsq_sansio")

    def observe(topic: str, messages: int, seconds: float, error: BaseException | None) -> None:
        raise RuntimeError("observer bug")

    topic = unique()
    async with runtime.producer(nsqd.tcp_address, publish_observer=observe) as p:
        await p.publish(topic, b"x")
        await p.multi_publish(topic, [b"a", b"b"])
        assert p.stats().published == 2 and p.stats().failed == 0
    assert embedded_topic_count_of(nsqd, topic) == 3
    assert any("publish_observer failed" in r.getMessage() for r in caplog.records)


# --- cut short, and closed with publishes pending ---------------------------------------------


async def test_a_publish_cut_short_keeps_its_answer(runtime: Runtime) -> None:
    """A publish whose deadline passes (or, async, whose caller is cancelled) after it was
    written: TimeoutError (or the cancellation), never a hang; nsqd stored it; its late answer
    is dropped, not handed to the next publish, which gets its own."""
    topic = unique()
    with gated_nsqd() as (gate, stored):
        async with runtime.producer(gate.address, timeout=10.0) as p:
            await p.publish(topic, b"first")
            gate.hold()
            with pytest.raises(TimeoutError):
                await p.publish(topic, b"timed out", timeout=0.3)
            if not runtime.blocking:
                with anyio.move_on_after(0.3) as scope:
                    await p.publish(topic, b"cancelled")
                assert scope.cancelled_caught
            await wait_until(lambda: stored(topic) == (2 if runtime.blocking else 3))
            gate.release()
            await p.publish(topic, b"next")
            await wait_until(lambda: p.stats().pending == 0, what="late answers matched")
            stats = p.stats()
        assert stats.published == 2
        assert stored(topic) == (3 if runtime.blocking else 4)
        assert gate.accepted == 1  # no reconnect: the late answers matched their publishes


async def test_close_with_publishes_pending_fails_each_once(runtime: Runtime) -> None:
    """close(timeout) with publishes nsqd has not answered: past the timeout each pending
    publish fails with ConnectionLost (it may have been stored), none hangs; nothing is sent
    again and nothing reconnects (asyncio and trio once reconnected a closed producer and
    stored every pending publish twice; blocking raised a bare NSQError)."""
    topic = unique()
    with gated_nsqd() as (gate, stored):
        async with runtime.producer(gate.address, timeout=10.0) as p:
            await p.publish(topic, b"first")
            gate.hold()
            outcomes: list[BaseException | None] = []

            async def publish_three() -> None:
                calls = [("publish", (topic, b"pending %d" % i)) for i in range(3)]
                outcomes.extend(await p.concurrently(calls, timeout=10))

            async with anyio.create_task_group() as tg:
                tg.start_soon(publish_three)
                await wait_until(lambda: p.stats().pending == 3, what="3 publishes pending")
                await wait_until(lambda: stored(topic) == 4, what="nsqd stored them")
                with anyio.fail_after(5):
                    await runtime.call(p.client.close, 0.2)
                gate.release()
            assert len(outcomes) == 3
            for outcome in outcomes:
                assert type(outcome) is ConnectionLost, repr(outcome)
                assert "closed" in str(outcome) and "may have been stored" in str(outcome)
            stats = p.stats()
            assert (stats.published, stats.failed, stats.pending) == (1, 3, 0)
            assert {c.state for c in stats.connections} == {"closed"}
            with pytest.raises(LocalProtocolError, match="closed"):
                await p.publish(topic, b"after close")
        assert stored(topic) == 4  # once each: nothing sent again
        assert gate.accepted == 1  # the closed producer did not reconnect


def _waiting_for_a_slot(client: Any) -> int:
    """Callers waiting for a ``max_pending`` slot (no public counter says it)."""
    if hasattr(client, "_slot_waiters"):
        return len(client._slot_waiters)
    return int(client._space_waiters)


async def test_close_fails_a_publish_waiting_for_a_slot(runtime: Runtime) -> None:
    """With ``max_pending`` publishes unanswered, one more waits for a slot; close(timeout)
    gives up on them all: the written one fails with ConnectionLost (it may have been
    stored), the waiting one with ConnectionLost (never sent), none hangs until its own
    timeout, nothing is sent after the close."""
    topic = unique()
    with gated_nsqd() as (gate, stored):
        async with runtime.producer(gate.address, timeout=20.0, max_pending=1) as p:
            await p.publish(topic, b"first")
            gate.hold()
            outcomes: list[BaseException | None] = []

            async def publish_two() -> None:
                calls = [("publish", (topic, b"one")), ("publish", (topic, b"two"))]
                outcomes.extend(await p.concurrently(calls, timeout=15))

            async with anyio.create_task_group() as tg:
                tg.start_soon(publish_two)
                await wait_until(lambda: _waiting_for_a_slot(p.client) == 1, what="a waiter")
                await wait_until(lambda: stored(topic) == 2, what="nsqd stored the written one")
                with anyio.fail_after(5):
                    await runtime.call(p.client.close, 0.2)
                with anyio.fail_after(5):  # not the publishes' own 20 s
                    while len(outcomes) < 2:
                        await anyio.sleep(0.01)
                gate.release()
            # (tasks may start in either order: which one was written is not known)
            assert [type(o) for o in outcomes] == [ConnectionLost, ConnectionLost], outcomes
            texts = sorted(str(o) for o in outcomes)
            assert "before it was sent" in texts[0], texts
            assert "may have been stored" in texts[1], texts
            stats = p.stats()
            assert (stats.published, stats.failed, stats.pending) == (1, 2, 0)
        assert stored(topic) == 2
        assert gate.accepted == 1


# --- blocking only: a PublishFuture's timeout -------------------------------------------------


@pytest.mark.parametrize("timeout", [-1, math.nan, math.inf, "5", True])
def test_a_publish_future_refuses_the_timeouts_flush_refuses(
    nsqd: EmbeddedNSQD, timeout: Any
) -> None:
    """``result(timeout)`` / ``exception(timeout)`` take the seconds ``flush()`` takes: a
    bad one is LocalProtocolError, as for flush(), done or not (it was ValueError for nan,
    OverflowError for inf, TypeError for a str, and a negative one meant 0)."""
    import transports.sync

    with transports.sync.Producer(nsqd.tcp_address) as producer:
        with pytest.raises(LocalProtocolError):
            producer.flush(timeout)
        future = producer.publish_async(unique(), b"x")
        for wait in (future.result, future.exception):
            with pytest.raises(LocalProtocolError):
                wait(timeout)
        future.result(10)
        for wait in (future.result, future.exception):
            with pytest.raises(LocalProtocolError):
                wait(timeout)
        assert future.exception(0) is None

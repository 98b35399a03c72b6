"""On every runtime: what a consumer makes of the core's reports is decided once
(``transports/_common/consumer_actions.py``), so the reports, their wording, the counters and
the order of log line and ``on_event`` are the same on asyncio, trio and blocking.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import unique
from support.ports import refused_address
from support.runtimes import Runtime

from nsq_sansio.consumer import Disconnected, DrainTimedOut
from nsq_sansio.errors import ConnectionLost
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


class Seen:
    """``on_event``'s record (called on the event loop or on the blocking IO thread), with
    the consumer's log lines at the moment each event came."""

    def __init__(self, caplog: pytest.LogCaptureFixture, wanted: type, count: int) -> None:
        self.caplog = caplog
        self.wanted = wanted
        self.count = count
        self.events: list[Any] = []
        self.logged_before: list[list[str]] = []
        self.enough = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, self.wanted):
            self.events.append(event)
            self.logged_before.append([r.getMessage() for r in self.caplog.records])
            if len(self.events) >= self.count:
                self.enough.set()

    async def wait(self, timeout: float) -> None:
        assert await anyio.to_thread.run_sync(self.enough.wait, timeout), self.events


async def test_a_refused_connect_is_said_alike_and_counted(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """A connect refused is a ``Disconnected`` whose error is ``ConnectionLost("host:port:
    connection refused")`` on every runtime (the blocking one said "connection 1 to ...
    failed in phase CONNECTING: [Errno 111] ..."), logged before ``on_event`` hears of it;
    each is a connection error, each connect after the first a reconnect."""
    caplog.set_level(logging.INFO)
    address = refused_address()
    seen = Seen(caplog, Disconnected, 2)
    async with runtime.consumer("t", "c", nsqd=[address], on_event=seen) as consumer:
        await seen.wait(15.0)
        stats = consumer.stats()
    for event, logged in zip(seen.events, seen.logged_before, strict=True):
        assert isinstance(event.error, ConnectionLost)
        assert str(event.error) == f"{address}: connection refused"
        assert isinstance(event.error.__cause__, ConnectionRefusedError)
        assert any(f"connection lost: {address}: connection refused" in m for m in logged)
    assert stats.connection_errors >= 2
    assert stats.reconnects >= 1


async def test_the_drain_deadline_is_logged_before_on_event_hears_of_it(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """Every report is logged first, then given to ``on_event``: ``DrainTimedOut`` too (the
    asyncio/trio consumer gave it to ``on_event`` before its log line); what it requeued is
    in ``DrainResult.requeued`` and the message user code held is taken back."""
    caplog.set_level(logging.INFO)
    topic = unique("drainlog")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"held")
    seen = Seen(caplog, DrainTimedOut, 1)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], on_event=seen) as consumer:
        message = await consumer.get(10.0)
        assert message is not None
        if runtime.blocking:
            result = await anyio.to_thread.run_sync(lambda: consumer.client.drain(timeout=0.2))
        else:
            result = await consumer.client.drain(timeout=0.2)
        await seen.wait(5.0)
    assert result.requeued == (message.id,)
    assert message.taken_back
    (event,) = seen.events
    assert [delivery.id for delivery in event.messages] == [message.id]
    (logged,) = seen.logged_before
    drain_lines = [m for m in logged if m.startswith("drain: 1 message still unanswered")]
    assert len(drain_lines) == 1, logged
    assert message.id.decode() in drain_lines[0]

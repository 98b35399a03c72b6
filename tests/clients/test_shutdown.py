"""On every runtime: shutdown is bounded, and what a consumer does or cannot do is said once.

The drain's timeout bounds the whole exit: at its deadline a ``run()`` handler still running
is cancelled (asyncio, trio) or left to its thread and reported (blocking: a thread cannot
be cancelled), its message requeued at once rather than FIN'd late; ``drain()`` returns a
:class:`DrainResult` saying so. A drain asked again with 0, or leaving the block during a
drain, ends it now. ``max_in_flight=0`` is a pause that is logged and shown in ``stats()``; a
topic lookupd does not know is logged once and counted; ``reconnects`` counts reconnects.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import http_channel_stats, needs_real, unique
from support.proxy import CountingProxy
from support.runtimes import Runtime

from transports._common import DrainResult
from transports.embedded import Cluster, EmbeddedLookupd, EmbeddedNSQD
from transports.testing.real_nsq import RealLookupd

pytestmark = pytest.mark.anyio

#: How long the long job would take: far beyond every deadline below.
JOB = 30.0


class Job:
    """A ``run()`` handler that takes ``JOB`` seconds unless cancelled (asyncio, trio) or
    released (blocking: its thread waits for ``release``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.started = threading.Event()
        self.release = threading.Event()
        self.ended = threading.Event()
        self.cancelled = False
        self.message: Any = None
        self.run_returned_at: float | None = None

    async def handle(self, message: Any) -> None:
        self.message = message
        self.started.set()
        try:
            await anyio.sleep(JOB)
        except anyio.get_cancelled_exc_class():
            self.cancelled = True
            raise
        finally:
            self.ended.set()

    def handle_blocking(self, message: Any) -> None:
        self.message = message
        self.started.set()
        try:
            self.release.wait(JOB)
        finally:
            self.ended.set()

    async def run(self, consumer: Any) -> None:
        """The consumer's run() with this handler, until it returns."""
        if self.runtime.blocking:
            await anyio.to_thread.run_sync(consumer.run, self.handle_blocking)
        else:
            await consumer.run(self.handle)
        self.run_returned_at = time.monotonic()

    async def wait_started(self) -> None:
        with anyio.fail_after(10):
            while not self.started.is_set():
                await anyio.sleep(0.01)


async def call(runtime: Runtime, method: Any, *args: Any) -> Any:
    """A consumer method: awaited (async) or run on a worker thread (blocking)."""
    if runtime.blocking:
        return await anyio.to_thread.run_sync(method, *args)
    return await method(*args)


async def channel(nsqd: EmbeddedNSQD, topic: str) -> dict[str, Any]:
    found = await anyio.to_thread.run_sync(http_channel_stats, nsqd.http_url, topic, "c")
    return found or {}


async def requeued_at_once(nsqd: EmbeddedNSQD, topic: str) -> None:
    """nsqd has the message back, ready for another consumer now (REQ 0, not deferred and
    not left to time out)."""
    with anyio.fail_after(5):
        while True:
            ch = await channel(nsqd, topic)
            if ch.get("depth") == 1 and ch.get("in_flight_count") == 0:
                break
            await anyio.sleep(0.02)
    assert ch["deferred_count"] == 0 and ch["requeue_count"] == 1 and ch["timeout_count"] == 0


async def publish(runtime: Runtime, nsqd: EmbeddedNSQD, topic: str, count: int = 1) -> None:
    async with runtime.producer(nsqd.tcp_address) as producer:
        for i in range(count):
            await producer.publish(topic, b"%d" % i)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


@pytest.mark.parametrize("bound", ["drain(0.5)", "drain_timeout=0.5"])
async def test_the_drain_deadline_ends_run_and_requeues_at_once(
    bound: str, runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline given to drain(), or the configured drain_timeout, bounds the exit."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    await publish(runtime, nsqd, topic)
    job = Job(runtime)
    configured = {"drain_timeout": 0.5} if bound == "drain_timeout=0.5" else {}
    timeout = () if configured else (0.5,)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **configured) as consumer:
        async with anyio.create_task_group() as tg:
            tg.start_soon(job.run, consumer.client)
            await job.wait_started()
            asked = time.monotonic()
            with anyio.fail_after(10):
                result = await call(runtime, consumer.client.drain, *timeout)
        # run() ended at the deadline, not after the job's 30 s
        assert job.run_returned_at is not None and job.run_returned_at - asked < 3.0
        await requeued_at_once(nsqd, topic)
    message_id = job.message.id
    assert isinstance(result, DrainResult) and not result.complete
    assert result.requeued == (message_id,)
    if runtime.blocking:  # a thread cannot be cancelled: reported as still running
        assert result.still_running == (message_id,) and result.cancelled == ()
        assert not job.ended.is_set()
        job.release.set()
    else:
        assert result.cancelled == (message_id,) and result.still_running == ()
        assert job.cancelled
    with anyio.fail_after(10):
        while not job.ended.is_set():
            await anyio.sleep(0.01)
    assert job.message.answered and job.message.taken_back
    assert consumer.stats().finished == 0 and consumer.stats().requeued == 1
    assert not lines(caplog, "came too late")  # nothing was FIN'd late
    (line,) = lines(caplog, "drain: 1 message still unanswered after 0.5 s was requeued")
    text = line.getMessage()
    assert line.levelname == "WARNING" and text.count(message_id.decode()) == 1, text
    if runtime.blocking:
        assert "its run() handler still running on nsq-sync-worker-" in text
        assert "a thread cannot be cancelled" in text
    else:
        assert "its run() handler cancelled" in text


async def test_a_drain_that_ends_in_time_reports_nothing(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 3)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=3) as c:
        got = [await c.get(10) for _ in range(3)]
        for message in got:
            await c.finish(message)
        result = await call(runtime, c.client.drain, 5.0)
    assert result == DrainResult() and result.complete


async def test_drain_again_with_zero_stops_now(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """A drain under way (30 s) and asked again with 0: what user code holds goes back now
    and the drain ends (on the previous tree the second call waited for the first's 30 s)."""
    topic = unique()
    await publish(runtime, nsqd, topic)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address]) as consumer:
        message = await consumer.get(10)
        assert message is not None
        consumer.client.start_drain()  # the default 30 s
        with anyio.fail_after(5):
            result = await call(runtime, consumer.client.drain, 0)
        assert result.requeued == (message.id,)
        await requeued_at_once(nsqd, topic)
        assert message.taken_back


async def test_leaving_the_block_during_a_drain_ends_it_now(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic)
    with anyio.fail_after(20):
        async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address]) as consumer:
            message = await consumer.get(10)
            assert message is not None
            consumer.client.start_drain()  # 30 s for the message we hold...
            left = time.monotonic()  # ...but we leave: it goes back now
    assert time.monotonic() - left < 3.0
    await requeued_at_once(nsqd, topic)


async def test_max_in_flight_zero_is_a_pause_that_is_said(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique()
    await publish(runtime, nsqd, topic)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=0) as c:
        assert await c.get(0.5) is None  # nothing is asked of nsqd
        stats = c.stats()
        assert stats.paused and stats.rdy == 0 and stats.received == 0 and stats.connected == 1
        (paused,) = lines(caplog, "is paused: max_in_flight is 0")
        assert paused.levelname == "INFO"
        await set_max_in_flight(runtime, c.client, 1)
        message = await c.get(10)
        assert message is not None and not c.stats().paused
        await c.finish(message)
        await set_max_in_flight(runtime, c.client, 1)  # no change: nothing said
    (resumed,) = lines(caplog, "resumed: max_in_flight 1")
    assert resumed.levelname == "INFO" and len(lines(caplog, "is paused")) == 1


async def set_max_in_flight(runtime: Runtime, consumer: Any, value: int) -> None:
    if runtime.blocking:  # it waits for the IO thread
        await anyio.to_thread.run_sync(consumer.set_max_in_flight, value)
    else:
        consumer.set_max_in_flight(value)


async def test_a_topic_lookupd_does_not_know_is_said_once_and_counted(
    runtime: Runtime, nsq_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_sansio")
    lookupd: EmbeddedLookupd = nsq_cluster.lookupd  # type: ignore[assignment]
    topic = unique()
    async with runtime.consumer(
        topic, "c", lookupd=[lookupd.http_url], lookupd_poll_interval=0.05
    ) as consumer:
        with anyio.fail_after(10):
            while consumer.stats().topic_not_found < 5:  # five polls, five answers
                await anyio.sleep(0.02)
        (line,) = lines(caplog, f"lookupd lists no nsqd for topic {topic}")
        assert line.levelname == "INFO"
        assert line.getMessage().startswith(f"[{lookupd.http_url}"), line.getMessage()
        # An nsqd gets the topic: the next poll finds it and the message comes.
        nsqd = nsq_cluster.nsqds[0]
        await publish(runtime, nsqd, topic)
        await nsq_cluster.wait_registered(topic)
        message = await consumer.get(10)
        assert message is not None
        await consumer.finish(message)
    assert len(lines(caplog, "lookupd lists no nsqd")) == 1


@needs_real
async def test_the_real_nsqlookupd_not_knowing_the_topic_is_said_once_and_counted(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    """The real nsqlookupd answers a topic it does not know with 404 TOPIC_NOT_FOUND: one
    INFO line for the topic, every answer counted, no WARNING (it is no lookupd failure)."""
    caplog.set_level(logging.DEBUG, logger="nsq_sansio")
    topic = unique()
    with RealLookupd() as lookupd:
        address = lookupd.http_address
        async with runtime.consumer(
            topic, "c", lookupd=[address], lookupd_poll_interval=0.05
        ) as consumer:
            with anyio.fail_after(10):
                while consumer.stats().topic_not_found < 5:
                    await anyio.sleep(0.02)
    (line,) = lines(caplog, f"lookupd lists no nsqd for topic {topic}")
    assert line.levelname == "INFO" and address in line.getMessage(), line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_reconnects_counts_reconnects(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic)
    with CountingProxy(nsqd.tcp_address) as proxy:
        async with runtime.consumer(
            topic, "c", nsqd=[proxy.address], reconnect_delay=0.05
        ) as consumer:
            first = await consumer.get(10)
            assert first is not None
            await consumer.finish(first)
            assert consumer.stats().reconnects == 0
            proxy.cut()  # the connection is lost: the consumer reconnects once
            with anyio.fail_after(10):
                while proxy.accepted < 2 or consumer.stats().connected < 1:
                    await anyio.sleep(0.01)
            await publish(runtime, nsqd, topic)
            second = await consumer.get(10)
            assert second is not None
            await consumer.finish(second)
            assert consumer.stats().reconnects == 1 and proxy.accepted == 2
            await call(runtime, consumer.client.drain, 5.0)
            assert consumer.stats().reconnects == 1  # a drain is no reconnect
        assert consumer.stats().reconnects == 1


async def test_a_clean_drain_counts_no_reconnect(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address]) as consumer:
        message = await consumer.get(10)
        assert message is not None
        await consumer.finish(message)
        await call(runtime, consumer.client.drain, 5.0)
    stats = consumer.stats()
    assert stats.reconnects == 0 and stats.connection_errors == 0

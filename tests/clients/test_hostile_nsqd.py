"""On every runtime: what an nsqd that ignores RDY can do to a consumer, and what it cannot.

A consumer holds nsqd to the RDY it gave (the core refuses a peer over twice the RDY with
:class:`~nsq_sansio.errors.ReadyCountExceeded`), and the transports stop reading a connection
while more messages wait for user code than ``max_in_flight``: a peer that floods, even one
that announces an absurdly short message timeout (so that the RDY bound counts every earlier
message as possibly timed out) and paces its messages, can only fill memory as fast as user
code takes messages. Memory is watched with tracemalloc while the flood runs, and the test
stops at once when it passes the bound (before the fix a consumer that took nothing grew by
hundreds of MiB a second). Each flood ends in a clean close with the typed error in the
consumer's stats, its log and its events. Against the embedded nsqd, a consumer whose reads
pause longer than half the message timeout, while nsqd times its messages out and sends
others, is never refused: the pause is bounded for that.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import unique
from support.hostile_nsqd import FloodingNSQD
from support.runtimes import Runtime

from nsq_sansio.consumer import Disconnected
from nsq_sansio.errors import ReadyCountExceeded

pytestmark = pytest.mark.anyio

MiB = 1 << 20


class MemoryWatch:
    """tracemalloc's growth since the start; :meth:`check` fails as soon as it passes
    ``bound`` (a consumer that does not stop reading would take the machine's memory)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.base = 0
        self.peak = 0

    def check(self) -> None:
        current, peak = tracemalloc.get_traced_memory()
        self.peak = max(self.peak, peak - self.base)
        assert current - self.base <= self.bound, (
            f"memory grew by {(current - self.base) / MiB:.0f} MiB (bound "
            f"{self.bound / MiB:.0f} MiB): the consumer kept reading a flooding nsqd"
        )


@contextmanager
def watched_memory(bound: int) -> Iterator[MemoryWatch]:
    tracemalloc.start()
    watch = MemoryWatch(bound)
    watch.base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        yield watch
        watch.check()
    finally:
        tracemalloc.stop()


def refusals(events: list[object]) -> list[ReadyCountExceeded]:
    return [
        e.error
        for e in list(events)
        if isinstance(e, Disconnected) and isinstance(e.error, ReadyCountExceeded)
    ]


async def flood(
    runtime: Runtime,
    server: FloodingNSQD,
    *,
    deflate: bool,
    bound: int,
    seconds: float,
    caplog: pytest.LogCaptureFixture,
    until_refused: bool,
) -> tuple[MemoryWatch, Any, list[object]]:
    """A consumer (max_in_flight 1) whose user code takes nothing, against ``server``, for
    ``seconds`` (or until the first refusal); returns the memory watch, its last stats and
    its events."""
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    events: list[object] = []
    with watched_memory(bound) as watch:
        async with runtime.consumer(
            unique("flood"),
            "c",
            nsqd=[server.address],
            max_in_flight=1,
            deflate=deflate,
            reconnect_delay=0.2,
            max_reconnect_delay=0.4,
            on_event=events.append,
        ) as consumer:
            end = anyio.current_time() + seconds
            while anyio.current_time() < end and not (until_refused and refusals(events)):
                watch.check()
                await anyio.sleep(0.01)
            watch.check()
            stats = consumer.stats()
    return watch, stats, events


def assert_refused_cleanly(stats: Any, events: list[object], log: str) -> None:
    """The typed error reached the stats, the events and the log."""
    errors = refusals(events)
    assert errors, [type(e).__name__ for e in events]
    assert errors[0].allowed == 2 and errors[0].held > 2, errors[0]
    assert stats.connection_errors >= 1, stats
    assert "nsqd sent more messages than RDY allows" in log


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "deflate"])
async def test_an_nsqd_that_ignores_rdy_is_refused_with_memory_bounded(
    runtime: Runtime, deflate: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Bursts of 64 messages at RDY 1: of 1 MiB with deflate (64 KiB on the wire), of 16 KiB
    without (a read of 64 KiB then holds more than the bound)."""
    with FloodingNSQD(body_size=MiB if deflate else 16 * 1024, burst=64) as server:
        watch, stats, events = await flood(
            runtime,
            server,
            deflate=deflate,
            bound=48 * MiB,
            seconds=20,
            caplog=caplog,
            until_refused=True,
        )
    assert_refused_cleanly(stats, events, caplog.text)
    assert watch.peak <= 48 * MiB


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "deflate"])
async def test_a_paced_flood_that_claims_a_tiny_msg_timeout_is_not_read_faster_than_taken(
    runtime: Runtime, deflate: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd announces a 1 ms message timeout, so the RDY bound counts every message read
    earlier as possibly timed out, and sends two messages (twice RDY 1) at a time, 20 MiB or
    more a second: each read on its own is within the bound while a reader keeps up. User
    code takes nothing; the consumer stops reading once more than max_in_flight messages wait
    for it and reads again only after the pause limit, when what accumulated meanwhile is over
    the bound: refused (with deflate; without, a 512 KiB message takes several reads, and the
    flood is held back by TCP)."""
    body = MiB if deflate else MiB // 2
    interval = 0.1 if deflate else 0.01  # slow enough for a reader to keep up
    with FloodingNSQD(msg_timeout_ms=1, body_size=body, burst=2, interval=interval) as server:
        watch, stats, events = await flood(
            runtime,
            server,
            deflate=deflate,
            bound=48 * MiB,
            seconds=4,
            caplog=caplog,
            until_refused=False,
        )
        sent = server.messages
    assert watch.peak <= 48 * MiB
    if deflate:
        assert sent * body > 48 * MiB, sent  # the flood offered more than the bound
        assert_refused_cleanly(stats, events, caplog.text)


async def test_reading_pauses_while_messages_wait_and_resumes_when_taken(
    runtime: Runtime,
) -> None:
    """RDY 1; nsqd's message timeout (4 s) passes with the first message still waiting for
    user code, so nsqd sends a second into the slot it freed, which the consumer takes: 2
    wait for user code, more than max_in_flight, so the consumer stops reading: a heartbeat
    sent then is not answered. Once user code took one, it reads again at once (the pause
    limit here is a quarter of the message timeout, 1 s): the heartbeat is answered.

    (A second message sent within RDY's slack while the first is still in flight is handed
    back at once, REQ 0, so it never waits: only a freed slot makes two wait.)"""
    with FloodingNSQD(body_size=10, burst=1, bursts=2, interval=4.3, msg_timeout_ms=4000) as server:
        async with runtime.consumer(
            unique("pause"), "c", nsqd=[server.address], max_in_flight=1
        ) as consumer:
            with anyio.fail_after(15):
                while consumer.stats().received < 2:
                    await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(server.send_heartbeat)
            answered = await anyio.to_thread.run_sync(server.nop_received.wait, 0.4)
            assert not answered, "the heartbeat was read while 2 messages waited (max 1)"
            assert await consumer.get(timeout=5) is not None
            # at once: well before the pause limit (1 s from the second message) would end it
            answered = await anyio.to_thread.run_sync(server.nop_received.wait, 0.4)
            assert answered, "reading did not resume once user code took the messages"
            assert consumer.stats().connection_errors == 0


async def test_reads_paused_for_several_message_timeouts_are_never_refused(
    runtime: Runtime, nsqd: Any
) -> None:
    """The embedded nsqd with a 1 s message timeout: user code takes nothing for 3 s, so
    nsqd times its messages out and sends others, more than max_in_flight wait and the
    reads pause (at most a quarter of the timeout at a time): no ReadyCountExceeded, no
    connection error, and every message is consumed afterwards."""
    topic = unique("slow")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.multi_publish(topic, [b"%d" % i for i in range(40)])
    events: list[object] = []
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_in_flight=4,
        msg_timeout=1.0,
        on_event=events.append,
    ) as consumer:
        with anyio.fail_after(10):
            while consumer.stats().received < 8:  # a first timeout came and went
                await anyio.sleep(0.02)
        await anyio.sleep(2.0)  # user code is stuck: the time is the scenario itself
        seen: set[bytes] = set()
        with anyio.fail_after(30):
            while len(seen) < 40:
                message = await consumer.get(timeout=10)
                assert message is not None, f"only {len(seen)} of 40 consumed"
                seen.add(message.body)
                await consumer.finish(message)
        stats = consumer.stats()
    assert not [e for e in events if isinstance(e, Disconnected) and e.error], events
    assert stats.connection_errors == 0, stats

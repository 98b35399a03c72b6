"""On every runtime: an answer user code gives after the consumer drained or closed is too
late (the drain requeued the message, nsqd delivers it again) and is said so, the same way
as any late answer: a ``TakenBack`` to ``on_event``, its log line, ``stats().taken_back``
counted and ``msg.taken_back`` True; never raised, never a hang. (The blocking consumer's IO
thread is gone by then: its answers used to vanish without a word.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.brokers import unique
from support.runtimes import ConsumerDriver, Runtime, wait_until

from nsq_sansio.consumer import BackoffChanged, TakenBack
from nsq_sansio.errors import MessageGone
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


async def _held(consumer: ConsumerDriver, count: int) -> list[Any]:
    """The next ``count`` messages, taken and not answered."""
    held = []
    for _ in range(count):
        message = await consumer.get(10.0)
        assert message is not None
        held.append(message)
    return held


async def _answer_late(runtime: Runtime, consumer: ConsumerDriver, held: list[Any]) -> None:
    """FIN, REQ, TOUCH and a ``finish_many`` of one: each answers (True, 1), none raises."""
    first, second, third, fourth = held
    assert await runtime.call(first.finish) is True
    assert await runtime.call(second.requeue) is True
    assert await runtime.call(third.touch) is True
    assert await runtime.call(consumer.client.finish_many, [fourth]) == 1


def _keep(events: list[TakenBack]) -> Callable[[object], None]:
    """An ``on_event`` that keeps the ``TakenBack`` reports."""

    def on_event(event: object) -> None:
        if isinstance(event, TakenBack):
            events.append(event)

    return on_event


@pytest.mark.parametrize("end", ["drain", "close"])
async def test_an_answer_after_the_consumer_ended_is_reported_as_taken_back(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture, end: str
) -> None:
    """FIN, REQ, TOUCH and ``finish_many`` after ``drain()`` returned (asyncio/trio: inside
    the block, the pump still running; blocking: the IO thread gone) or after the block
    closed the consumer: each answers, and each is one ``TakenBack``, one log line, one
    more ``taken_back`` in the stats; a second answer is refused, not reported again."""
    caplog.set_level(logging.INFO)
    topic = unique("late")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.multi_publish(topic, [b"a", b"b", b"c", b"d"])
    events: list[TakenBack] = []
    with anyio.fail_after(60):
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=4, on_event=_keep(events)
        ) as consumer:
            held = await _held(consumer, 4)
            if end == "drain":
                result = await runtime.call(consumer.client.drain, timeout=0.0)
                assert sorted(result.requeued) == sorted(m.id for m in held)
                before = consumer.stats().taken_back
                await _answer_late(runtime, consumer, held)
                await wait_until(lambda: len(events) >= 4, what="4 TakenBack reports")
        if end == "close":
            before = consumer.stats().taken_back
            await _answer_late(runtime, consumer, held)
            await wait_until(lambda: len(events) >= 4, what="4 TakenBack reports")

        assert [(e.message_id, e.command) for e in events] == [
            (held[0].id, "FIN"),
            (held[1].id, "REQ"),
            (held[2].id, "TOUCH"),
            (held[3].id, "FIN"),
        ]
        assert all(isinstance(e.error, MessageGone) for e in events)
        assert consumer.stats().taken_back == before + 4
        assert all(message.taken_back for message in held)
        assert all(message.answered for message in (held[0], held[1], held[3]))
        logged = [r.getMessage() for r in caplog.records]
        for event in events:
            line = f"{event.command} for message {event.message_id.decode()} came too late"
            assert sum(line in m for m in logged) == 1, (line, logged)
        # Answered once: a second answer is refused as answered, not reported again.
        assert await runtime.call(held[0].finish) is False
        assert len(events) == 4


async def test_answers_racing_the_close_are_each_sent_or_reported(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """Answers given while the consumer closes (from threads on blocking, tasks on
    asyncio/trio): each is either a FIN sent in time or a ``TakenBack`` reported, none lost,
    none reported twice, whichever side of the end of the IO it falls on."""
    count = 40
    topic = unique("lateclose")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.multi_publish(topic, [b"%d" % i for i in range(count)])
    events: list[TakenBack] = []
    with anyio.fail_after(60):
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=count, on_event=_keep(events)
        ) as consumer:
            held = await _held(consumer, count)
            async with anyio.create_task_group() as group:
                group.start_soon(runtime.call, consumer.client.close)
                for message in held:
                    group.start_soon(runtime.call, message.finish)
        stats = consumer.stats()
    assert all(message.answered for message in held)
    assert stats.finished + stats.taken_back == count, stats
    assert len(events) == stats.taken_back
    assert sorted(e.message_id for e in events) == sorted(m.id for m in held if m.taken_back)


async def test_on_event_may_answer_from_a_late_answers_report(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """After close, ``on_event`` runs where the late answer is carried out; answering another
    message from it (the runtime's non-blocking answer) neither hangs nor is lost: it is
    reported too."""
    topic = unique("lateevent")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.multi_publish(topic, [b"a", b"b"])
    events: list[TakenBack] = []
    held: list[Any] = []

    def on_event(event: object) -> None:
        if isinstance(event, TakenBack):
            events.append(event)
            if len(events) == 1:
                other = held[1]
                getattr(other, "finish_nowait", other.finish)()

    with anyio.fail_after(60):
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=2, on_event=on_event
        ) as consumer:
            held.extend(await _held(consumer, 2))
        assert await runtime.call(held[0].finish) is True
        await wait_until(lambda: len(events) >= 2, what="2 TakenBack reports")
    assert [e.message_id for e in events] == [held[0].id, held[1].id]
    assert all(message.taken_back and message.answered for message in held)


async def test_answers_after_the_consumer_is_ended_from_its_own_callback_are_reported(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """``on_event`` ends the consumer (the blocking one with ``close()``, on its IO thread;
    asyncio/trio, whose ``close()`` must be awaited, with ``start_drain(0)``), answers a
    message in the same callback, and returns at once (it does not wait for the drain it
    started on the thread that must carry it out). Every answer given after that, in the
    callback and after the block, is reported as ``TakenBack`` as after any close, none
    dropped: they used to vanish on blocking, and its ``close()`` waited ``close_timeout``
    for itself."""
    topic = unique("selfclose")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.multi_publish(topic, [b"%d" % i for i in range(6)])
    events: list[TakenBack] = []
    held: list[Any] = []
    ended_in: list[float] = []
    close_timeout = 20.0

    def on_event(event: object) -> None:
        if isinstance(event, TakenBack):
            events.append(event)
        elif isinstance(event, BackoffChanged) and not ended_in:
            client = consumer.client
            started = time.monotonic()
            client.close() if runtime.blocking else client.start_drain(0.0)
            ended_in.append(time.monotonic() - started)
            getattr(held[0], "finish_nowait", held[0].finish)()

    with anyio.fail_after(60):
        async with runtime.consumer(
            topic,
            "c",
            nsqd=[nsqd.tcp_address],
            max_in_flight=6,
            close_timeout=close_timeout,
            on_event=on_event,
        ) as consumer:
            held.extend(await _held(consumer, 6))
            # A failure opens a backoff window: its report runs the callback.
            assert await runtime.call(held[5].requeue, 0.0) is True
            await wait_until(lambda: events, what="the callback's answer reported")
        before = consumer.stats().taken_back
        assert await runtime.call(held[1].finish) is True
        assert await runtime.call(held[2].requeue) is True
        assert await runtime.call(held[3].touch) is True
        assert await runtime.call(consumer.client.finish_many, [held[4]]) == 1
        await wait_until(lambda: len(events) >= 5, what="5 TakenBack reports")

    assert ended_in and ended_in[0] < close_timeout / 2, ended_in
    assert [(e.message_id, e.command) for e in events] == [
        (held[0].id, "FIN"),
        (held[1].id, "FIN"),
        (held[2].id, "REQ"),
        (held[3].id, "TOUCH"),
        (held[4].id, "FIN"),
    ]
    assert consumer.stats().taken_back == before + 4
    assert all(message.taken_back for message in held[:5])


@pytest.mark.parametrize("answered", [False, True])
async def test_keepalive_after_close_does_not_raise(
    runtime: Runtime, nsqd: EmbeddedNSQD, answered: bool
) -> None:
    """``keepalive()`` on a message of a closed consumer is an answer too late like
    ``touch()``: its block runs, nothing is touched, nothing raised; the message is taken
    back (the close requeued it) unless it was answered before."""
    topic = unique("latekeep")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"a")
    with anyio.fail_after(60):
        async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address]) as consumer:
            (message,) = await _held(consumer, 1)
            if answered:
                assert await runtime.call(message.finish) is True
        ran = False
        async with runtime.keepalive(message) as kept:
            ran = True
            assert kept is message
    assert ran
    assert message.taken_back is not answered
    assert not message.keepalive_expiring

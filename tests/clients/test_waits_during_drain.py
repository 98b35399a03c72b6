"""When a consumer's waits for a message end during a drain, on every runtime.

A wait for a NEW message (iteration, blocking ``get()``, ``run()``'s idle workers) ends when
the drain starts: nothing new can come then (RDY 0 everywhere; what was received but not yet
handed to user code is requeued at once, and what arrives later is requeued on arrival). The
drain itself goes on until what user code holds is answered (or its deadline): a message held
elsewhere is still answered in time, and ``run()`` returns once its own handlers are done.
Waiting for the END of the drain instead would make a wait in a handler wait for the
handler's own message, until the drain's deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from support.brokers import unique
from support.runtimes import ConsumerDriver, Runtime, wait_channel, wait_until

from transports.embedded import EmbeddedNSQD

#: The drain's timeout: the wait for the drain's end, long enough to tell from "at once" on a
#: loaded machine (6 test processes on 2 cores) and short enough for a failure to come fast.
DRAIN_TIMEOUT = 4.0

#: How long a wait may take to end once the drain started: "at once", with room for load.
AT_ONCE = 1.5

OPTIONS: dict[str, Any] = {"drain_timeout": DRAIN_TIMEOUT, "close_timeout": 2.0}


async def _publish(runtime: Runtime, nsqd: EmbeddedNSQD, topic: str, *bodies: bytes) -> None:
    async with runtime.producer(nsqd.tcp_address) as producer:
        for body in bodies:
            await producer.publish(topic, body)


async def _get(runtime: Runtime, client: Any, timeout: float) -> Any:
    """The consumer's own wait for one message: blocking ``get(timeout)``; asyncio/trio one
    step of ``async for`` (None where it ends), given up after ``timeout``."""
    if runtime.blocking:
        return await runtime.call(client.get, timeout)
    with anyio.move_on_after(timeout):
        try:
            return await client.__anext__()
        except StopAsyncIteration:
            return None
    return None


async def _until_waiting(runtime: Runtime, client: Any, count: int = 1) -> None:
    """Until ``count`` calls wait for a message inside the consumer."""

    def waiting() -> int:
        return client._io.sleepers if runtime.blocking else len(client._waiters)

    await wait_until(lambda: waiting() >= count, what=f"{count} waits for a message")


async def _held_message(runtime: Runtime, consumer: ConsumerDriver) -> Any:
    """One message taken and kept unanswered: the drain waits for it until its deadline."""
    message = await _get(runtime, consumer.client, 10.0)
    assert message is not None and message.body == b"held"
    return message


class Ended:
    """When a wait started in a task ended (monotonic), and what it gave."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.result: object = None
        self.event = anyio.Event()

    async def record(self, wait: Callable[[], Any]) -> None:
        self.result = await wait()
        self.at = time.monotonic()
        self.event.set()

    async def within(self, seconds: float, since: float, what: str) -> float:
        """Seconds from ``since`` to the end; AssertionError when it takes over ``seconds``."""
        with anyio.move_on_after(seconds):
            await self.event.wait()
        assert self.at is not None, f"{what}: still waiting {seconds}s after the drain started"
        return self.at - since


async def _drain_while_held(
    runtime: Runtime, nsqd: EmbeddedNSQD, wait: Callable[[ConsumerDriver], Any], what: str
) -> Ended:
    """A consumer holds one message unanswered; ``wait(consumer)`` waits for another; the
    drain starts from another task (thread): the wait ends at once, while the drain still
    waits for the held message, which is then answered in time (FIN'd, not taken back)."""
    topic = unique("drainwaits")
    await _publish(runtime, nsqd, topic, b"held")
    ended = Ended()
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **OPTIONS) as consumer:
        client = consumer.client
        held = await _held_message(runtime, consumer)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ended.record, lambda: wait(consumer))
                await _until_waiting(runtime, client)
                started = time.monotonic()
                await runtime.call(client.start_drain)
                elapsed = await ended.within(AT_ONCE, started, what)
                assert elapsed < AT_ONCE, elapsed
                # The drain is still under way: it waits for the held message.
                assert client.draining
                assert held.taken_back is False
        finally:
            finished = await consumer.finish(held)
        assert finished is True
        assert client.stats().finished == 1
    await wait_channel(
        nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0 and ch["requeue_count"] == 0
    )
    return ended


@pytest.mark.anyio
async def test_iteration_ends_when_the_drain_starts(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """``for``/``async for`` waiting for a message ends (without one) as soon as another
    task or thread starts the drain, not when the drain is over."""

    async def iterate(consumer: ConsumerDriver) -> list[Any]:
        return [message async for message in consumer.messages()]

    ended = await _drain_while_held(runtime, nsqd, iterate, "iteration")
    assert ended.result == []


@pytest.mark.anyio
async def test_a_wait_for_one_message_ends_when_the_drain_starts(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """Blocking ``get(timeout)`` (asyncio/trio: the next step of ``async for``) gives None at
    once when the drain starts, whatever is left of its timeout."""

    async def get(consumer: ConsumerDriver) -> Any:
        return await _get(runtime, consumer.client, 30.0)

    ended = await _drain_while_held(runtime, nsqd, get, "get()")
    assert ended.result is None


@pytest.mark.anyio
async def test_run_with_no_handler_busy_returns_when_the_drain_starts(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """``run()`` whose handlers are all idle returns as soon as the drain starts, though the
    drain still waits for a message held outside it."""
    handled: list[bytes] = []

    def handler(message: Any) -> None:
        handled.append(message.body)

    async def run(consumer: ConsumerDriver) -> None:
        await consumer.run(handler, 2)

    await _drain_while_held(runtime, nsqd, run, "run()")
    assert handled == []


@pytest.mark.anyio
async def test_run_returns_once_its_own_handlers_are_done(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """A drain started while a ``run()`` handler runs: run() waits for that handler (its
    message is FIN'd in time), and returns once it is done, not at the drain's deadline."""
    topic = unique("drainwaits")
    await _publish(runtime, nsqd, topic, b"job")
    entered = threading.Event()
    release = threading.Event()
    ended = Ended()
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **OPTIONS) as consumer:
        client = consumer.client
        handler: Callable[[Any], object]
        if runtime.blocking:

            def blocking_handler(message: Any) -> None:
                entered.set()
                assert release.wait(30.0)

            handler = blocking_handler
        else:

            async def async_handler(message: Any) -> None:
                entered.set()
                while not release.is_set():
                    await anyio.sleep(0.01)

            handler = async_handler
        async with anyio.create_task_group() as tg:
            tg.start_soon(ended.record, lambda: runtime.call(client.run, handler, concurrency=2))
            await wait_until(entered.is_set, what="the handler runs")
            await _until_waiting(runtime, client)  # the other worker waits for a message
            await runtime.call(client.start_drain)
            # run() waits for its handler: a window in which it must not return.
            await anyio.sleep(0.5)
            assert ended.at is None, "run() returned while its handler was running"
            released = time.monotonic()
            release.set()
            elapsed = await ended.within(AT_ONCE, released, "run()")
            assert elapsed < AT_ONCE, elapsed
        assert client.stats().finished == 1
    await wait_channel(
        nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0 and ch["requeue_count"] == 0
    )


@pytest.mark.anyio
async def test_waits_in_a_handler_after_its_start_drain_end_at_once(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """A ``run()`` handler that starts the drain and then waits for another message (``get``
    / a step of ``async for``, or a ``run()`` of its own) gets none at once: the wait does
    not wait for the drain to end, which would wait for this handler's own message. The
    handler then returns, its message is FIN'd and the drain ends, long before its
    deadline."""
    topic = unique("drainwaits")
    await _publish(runtime, nsqd, topic, b"job")
    inner_handled: list[bytes] = []
    seen: dict[str, Any] = {}

    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **OPTIONS) as consumer:
        client = consumer.client
        handler: Callable[[Any], object]
        if runtime.blocking:

            def blocking_handler(message: Any) -> None:
                client.start_drain()
                started = time.monotonic()
                seen["get"] = client.get(timeout=30.0)
                seen["iteration"] = list(client)
                client.run(lambda m: inner_handled.append(m.body), concurrency=2)
                seen["elapsed"] = time.monotonic() - started

            handler = blocking_handler
        else:

            async def async_handler(message: Any) -> None:
                client.start_drain()
                started = time.monotonic()
                seen["get"] = await _get(runtime, client, 30.0)
                seen["iteration"] = [m async for m in client]

                async def inner(m: Any) -> None:
                    inner_handled.append(m.body)

                await client.run(inner, concurrency=2)
                seen["elapsed"] = time.monotonic() - started

            handler = async_handler

        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            await runtime.call(client.run, handler)
        assert "elapsed" in seen, seen
        assert seen["get"] is None and seen["iteration"] == [] and inner_handled == []
        assert seen["elapsed"] < AT_ONCE, seen
        stats = client.stats()
        assert stats.finished == 1 and stats.requeued == 0, stats
    await wait_channel(
        nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0 and ch["requeue_count"] == 0
    )


@pytest.mark.anyio
async def test_a_message_not_handed_over_is_requeued_when_the_drain_starts(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """A message sent to the consumer but not handed to user code when the drain starts is
    requeued at once (not kept until the drain's deadline) and no wait gets it afterwards;
    the message user code holds is still answered in time."""
    topic = unique("drainwaits")
    await _publish(runtime, nsqd, topic, b"held", b"unseen")
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=2, **OPTIONS
    ) as consumer:
        client = consumer.client
        held = await _held_message(runtime, consumer)
        await wait_channel(nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 2)
        started = time.monotonic()
        await runtime.call(client.start_drain)
        assert await _get(runtime, client, 5.0) is None
        channel = await wait_channel(
            nsqd,
            topic,
            "c",
            lambda ch: ch["requeue_count"] == 1 and ch["in_flight_count"] == 1,
            timeout=DRAIN_TIMEOUT - 0.5,
            what="the unseen message requeued before the drain's deadline",
        )
        assert time.monotonic() - started < DRAIN_TIMEOUT, channel
        assert held.taken_back is False
        assert await consumer.finish(held) is True
    await wait_channel(
        nsqd,
        topic,
        "c",
        lambda ch: ch["in_flight_count"] == 0 and ch["depth"] == 1,
        what="the unseen message back in the channel, the held one FIN'd",
    )

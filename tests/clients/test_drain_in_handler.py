"""``drain()`` called from inside a ``run()`` handler of the same consumer.

The drain waits for every message user code holds, the handler's own included, which is
answered at the latest when the handler returns: waiting for ``drain()`` there before that
could only end at the drain's deadline (on blocking ``drain()`` returned then; on
asyncio/trio the handler was cancelled there). It is the documented misuse: on every runtime
it raises LocalProtocolError at once, naming ``start_drain()``, and begins nothing; the
handler's exception then goes where any handler's does (logged, the message requeued with
backoff). What waits for nothing of the handler's is left alone: a drain once the handler
answered its message, another consumer's drain, a drain in a task the handler does not wait
for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from support.brokers import unique
from support.runtimes import Runtime

from nsq_sansio.errors import LocalProtocolError
from transports.embedded import EmbeddedNSQD

#: The consumers' drain timeout here: the wait the misuse used to cause, long enough to tell
#: from "at once" on a loaded machine and short enough for the old behaviour to fail quickly.
DRAIN_TIMEOUT = 4.0

#: How long a refused drain() may take: "at once", with room for a loaded machine.
AT_ONCE = 1.5

#: Options that make a failed message come back quickly: no REQ delay, a short backoff.
QUICK_RETRY: dict[str, Any] = {
    "drain_timeout": DRAIN_TIMEOUT,
    "default_requeue_delay": 0.0,
    "backoff_multiplier": 0.05,
    "close_timeout": 1.0,
}


class Attempt:
    """What one ``drain()`` call made by a handler did: its outcome (the exception it raised,
    or what it returned), how long it took and whether the consumer was draining after it."""

    def __init__(self) -> None:
        self.outcome: object = None
        self.elapsed: float | None = None
        self.draining_after: bool | None = None
        self.done = threading.Event()

    def check_refused(self) -> None:
        """The call raised LocalProtocolError at once, naming start_drain(), and began no
        drain."""
        assert self.done.is_set(), "drain() in the handler never returned"
        assert isinstance(self.outcome, LocalProtocolError), self.outcome
        assert "start_drain()" in str(self.outcome) and "handler" in str(self.outcome)
        assert self.elapsed is not None and self.elapsed < AT_ONCE, self.elapsed
        assert self.draining_after is False


def _attempt_sync(attempt: Attempt, client: Any, drain: Callable[[], object]) -> None:
    """Call ``drain`` (a blocking consumer's drain, maybe another's), noting what it did;
    re-raise what it raised."""
    started = time.monotonic()
    try:
        attempt.outcome = drain()
    except BaseException as exc:
        attempt.outcome = exc
        raise
    finally:
        attempt.elapsed = time.monotonic() - started
        attempt.draining_after = client.draining
        attempt.done.set()


async def _attempt_async(
    attempt: Attempt, client: Any, drain: Callable[[], Awaitable[object]]
) -> None:
    """:func:`_attempt_sync` for an awaited drain (asyncio/trio)."""
    started = time.monotonic()
    try:
        attempt.outcome = await drain()
    except BaseException as exc:
        attempt.outcome = exc
        raise
    finally:
        attempt.elapsed = time.monotonic() - started
        attempt.draining_after = client.draining
        attempt.done.set()


async def _wait(event: threading.Event, timeout: float, what: str) -> None:
    """Until ``event`` is set; AssertionError after ``timeout`` seconds."""
    with anyio.move_on_after(timeout):
        while not event.is_set():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"not reached in {timeout}s: {what}")


@pytest.mark.anyio
async def test_drain_in_a_handler_raises_at_once_and_the_message_comes_back(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's ``drain()`` raises LocalProtocolError at once and begins nothing; the
    exception is the handler's: logged at ERROR with its traceback, the message requeued and
    delivered again, and the consumer goes on (here the second delivery is FIN'd, and the
    handler ends the consumer the documented way, with ``start_drain()``)."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = unique("handlerdrain")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    attempt = Attempt()
    deliveries: list[tuple[bytes, int]] = []

    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as consumer:
        client = consumer.client

        def after_the_refusal(message: Any) -> bool:
            deliveries.append((message.body, message.attempts))
            client.start_drain()  # the call a handler makes to end the consumer
            return True

        handler: Callable[[Any], object]
        if runtime.blocking:

            def blocking_handler(message: Any) -> object:
                if message.attempts == 1:
                    deliveries.append((message.body, message.attempts))
                    _attempt_sync(attempt, client, client.drain)
                    return True
                return after_the_refusal(message)

            handler = blocking_handler
        else:

            async def async_handler(message: Any) -> object:
                if message.attempts == 1:
                    deliveries.append((message.body, message.attempts))
                    await _attempt_async(attempt, client, client.drain)
                    return True
                return after_the_refusal(message)

            handler = async_handler

        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            async with anyio.create_task_group() as tg:
                tg.start_soon(runtime.call, client.run, handler)
                # Bounded below the drain timeout: the old wait fails here, in seconds.
                await _wait(attempt.done, AT_ONCE + 1.0, "drain() in the handler returned")
                attempt.check_refused()
                # run() goes on and ends by the handler's start_drain(), well before the
                # drain timeout (nothing is held then).
        stats = client.stats()

    assert deliveries == [(b"job", 1), (b"job", 2)]
    assert stats.requeued == 1 and stats.finished == 1, stats
    failed = [r for r in caplog.records if "handler failed for message" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.ERROR, caplog.records
    assert failed[0].exc_info is not None and failed[0].exc_info[1] is attempt.outcome


@pytest.mark.anyio
async def test_drain_in_a_task_the_handler_waits_for_is_refused_too(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """asyncio/trio: a task the handler starts in its own task group runs in a copy of the
    handler's context, so it is taken for the handler: the handler waits for it, and its
    ``drain()`` would wait for the handler's message, not answered yet. Refused the same
    way. (Blocking: a thread the handler starts is not recognised; see docs/transports.md.)"""
    if runtime.blocking:
        pytest.skip("a thread started by a blocking handler is not recognised")
    topic = unique("handlerdrain")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    attempt = Attempt()

    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as consumer:
        client = consumer.client

        async def handler(message: Any) -> None:
            if message.attempts > 1:
                client.start_drain()
                return
            async with anyio.create_task_group() as handler_tasks:
                handler_tasks.start_soon(_attempt_async, attempt, client, client.drain)

        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.run, handler)
                await _wait(attempt.done, AT_ONCE + 1.0, "drain() in the handler's task returned")
                attempt.check_refused()
        assert client.stats().requeued == 1


@pytest.mark.anyio
async def test_a_handler_that_answered_its_message_may_wait_for_the_drain(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """Once the handler's own message is answered the drain waits for nothing of the handler:
    ``drain()`` there returns when it is over (nothing held: well before its deadline), with
    nothing cut short."""
    topic = unique("handlerdrain")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    attempt = Attempt()

    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as consumer:
        client = consumer.client

        handler: Callable[[Any], object]
        if runtime.blocking:

            def blocking_handler(message: Any) -> None:
                assert message.finish() is True
                _attempt_sync(attempt, client, client.drain)

            handler = blocking_handler
        else:

            async def async_handler(message: Any) -> None:
                assert await message.finish() is True
                await _attempt_async(attempt, client, client.drain)

            handler = async_handler

        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            await runtime.call(client.run, handler)
        assert attempt.done.is_set()
        assert isinstance(attempt.outcome, runtime.module.DrainResult), attempt.outcome
        assert not attempt.outcome.requeued, attempt.outcome
        assert attempt.elapsed is not None and attempt.elapsed < DRAIN_TIMEOUT, attempt.elapsed
        assert client.stats().finished == 1


@pytest.mark.anyio
async def test_a_drain_the_handler_does_not_wait_for_is_left_alone(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """asyncio/trio: a handler that starts ``drain()`` in a task group outside itself and
    returns does not wait for it (its message is FIN'd as it returns): that drain runs and
    ends run(), though its task was started from the handler. (Blocking: a thread started by
    the handler is never taken for it.)"""
    if runtime.blocking:
        pytest.skip("a thread started by a blocking handler is never taken for the handler")
    topic = unique("handlerdrain")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    attempt = Attempt()

    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as consumer:
        client = consumer.client
        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            async with anyio.create_task_group() as outside:

                async def handler(message: Any) -> None:
                    outside.start_soon(_attempt_async, attempt, client, client.drain)

                await client.run(handler)
        assert isinstance(attempt.outcome, runtime.module.DrainResult), attempt.outcome
        assert attempt.outcome.complete, attempt.outcome
        assert attempt.elapsed is not None and attempt.elapsed < DRAIN_TIMEOUT, attempt.elapsed
        assert client.stats().finished == 1


@pytest.mark.anyio
async def test_a_handler_may_drain_another_consumer(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """Only the handler's own consumer is refused: a handler of one consumer waits for the
    drain of another (which holds nothing of it) and gets its DrainResult."""
    topic = unique("handlerdrain")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    attempt = Attempt()

    async with (
        runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as consumer,
        runtime.consumer(unique("other"), "c", nsqd=[nsqd.tcp_address], **QUICK_RETRY) as other,
    ):
        client, other_client = consumer.client, other.client

        handler: Callable[[Any], object]
        if runtime.blocking:

            def blocking_handler(message: Any) -> None:
                _attempt_sync(attempt, other_client, other_client.drain)
                client.start_drain()

            handler = blocking_handler
        else:

            async def async_handler(message: Any) -> None:
                await _attempt_async(attempt, other_client, other_client.drain)
                client.start_drain()

            handler = async_handler

        with anyio.fail_after(DRAIN_TIMEOUT + 20.0):
            await runtime.call(client.run, handler)
        assert attempt.done.is_set()
        assert isinstance(attempt.outcome, runtime.module.DrainResult), attempt.outcome
        assert attempt.outcome.complete
        assert attempt.elapsed is not None and attempt.elapsed < DRAIN_TIMEOUT
        assert client.stats().finished == 1

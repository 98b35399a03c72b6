"""Consumer calls made where the consumer's IO runs: from ``on_event`` (a plain callback on
every runtime, run on the event loop on asyncio/trio, on the IO thread on blocking).

What can be done there returns at once (``start_drain()`` is how a callback ends the
consumer, on every runtime). On blocking, a call that waits for the IO thread cannot return
there (only that thread can carry it out): it raises LocalProtocolError at once, naming the
call to make instead, and changes nothing. It used to stall every connection, heartbeats
included: ``drain()`` for the drain timeout plus 10 s, ``get()`` and iteration until the
consumer ended, ``fetch()`` for its timeout plus 5 s (for ever with ``timeout=None``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from support.brokers import assert_no_thread_left, unique, wait_for
from support.runtimes import Runtime, wait_until

import transports.sync
from nsq_sansio.consumer import BackoffChanged, ConnectionUp
from nsq_sansio.errors import LocalProtocolError
from transports.embedded import EmbeddedNSQD

#: How long a call on the IO thread may take: "at once", with room for a loaded machine
#: (the stalls it guards against last 6 s and more here, for ever by default).
AT_ONCE = 2.0


@pytest.mark.anyio
async def test_on_event_ends_the_consumer_with_start_drain(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """The calls every runtime offers as plain functions return at once from ``on_event``;
    its ``start_drain()`` ends the consumer (iteration stops). On blocking, ``drain()`` there
    raises LocalProtocolError naming ``start_drain()`` and begins nothing (asyncio/trio's
    ``drain()`` is a coroutine, which a plain callback cannot await)."""
    topic = unique("ioend")
    async with runtime.producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"failed once")
    outcome: list[Any] = []
    returned = threading.Event()

    def on_event(event: object) -> None:
        if not isinstance(event, BackoffChanged) or returned.is_set():
            return
        client = consumer.client
        started = time.monotonic()
        try:
            if runtime.blocking:
                try:
                    client.drain()
                except LocalProtocolError as exc:
                    outcome.append(exc)
                outcome.append(client.draining)  # nothing was begun
            outcome.append(client.stats().connections)
            outcome.append(client.is_starved())
            client.set_max_in_flight(2)
            finish_many = getattr(client, "finish_many_nowait", client.finish_many)
            outcome.append(finish_many([]))
            client.start_drain(1.0)
        finally:
            outcome.append(time.monotonic() - started)
            returned.set()

    with anyio.fail_after(30):
        async with runtime.consumer(
            topic, "c", nsqd=[nsqd.tcp_address], close_timeout=1.0, on_event=on_event
        ) as consumer:
            message = await consumer.get(10.0)
            assert message is not None
            # A failure opens a backoff window: its report runs the callback.
            assert await runtime.call(message.requeue, 0.0) is True
            await wait_until(returned.is_set, timeout=AT_ONCE + 3.0, what="on_event returned")
            taken = [message async for message in consumer.messages()]
            assert consumer.client.draining
    assert taken == []
    *results, elapsed = outcome
    assert elapsed < AT_ONCE, outcome
    if runtime.blocking:
        refused, draining, *results = results
        assert isinstance(refused, LocalProtocolError), outcome
        assert "start_drain()" in str(refused) and "on_event" in str(refused)
        assert draining is False
    connections, starved, answered = results
    assert len(connections) == 1 and isinstance(starved, bool) and answered == 0


@pytest.fixture
def blocking_only() -> Iterator[None]:
    """A blocking client leaves no thread of its own behind (as with ``runtime``)."""
    yield
    assert_no_thread_left()


def _refused_at_connection_up(
    address: str, call: Callable[[transports.sync.Consumer], object], **options: Any
) -> tuple[transports.sync.Consumer, list[Any]]:
    """A blocking consumer whose ``on_event`` makes ``call`` at the first ``ConnectionUp``;
    returns it (started: the caller closes it) and what the call raised or returned, then
    how long it took."""
    outcome: list[Any] = []
    returned = threading.Event()

    def on_event(event: object) -> None:
        if not isinstance(event, ConnectionUp) or returned.is_set():
            return
        started = time.monotonic()
        try:
            outcome.append(call(consumer))
        except Exception as exc:
            outcome.append(exc)
        finally:
            outcome.append(time.monotonic() - started)
            returned.set()

    consumer = transports.sync.Consumer(
        unique("iocall"),
        "c",
        nsqd=[address],
        close_timeout=1.0,
        drain_timeout=1.0,
        on_event=on_event,
        **options,
    )
    consumer.start()
    # Bounded well below the stalls: a call that waits for this thread fails here.
    if not returned.wait(AT_ONCE + 3.0):
        consumer.close()
        pytest.fail("on_event did not return: the IO thread stalled")
    return consumer, outcome


def _keep_running(consumer: transports.sync.Consumer, address: str, *, pull: bool) -> None:
    """Nothing was begun: the consumer still takes and answers a message."""
    assert not consumer.draining
    with transports.sync.Producer(address) as producer:
        producer.publish(consumer.topic, b"after")
    if pull:
        messages = consumer.fetch(1, timeout=10.0)
        assert [m.body for m in messages] == [b"after"]
        message = messages[0]
    else:
        got = consumer.get(timeout=10.0)
        assert got is not None and got.body == b"after"
        message = got
    assert message.finish() is True
    wait_for(lambda: consumer.stats().finished == 1, what="the FIN carried out")


# Blocking only: asyncio/trio's drain(), run(), fetch() and iteration are coroutines, which
# a plain callback cannot await, and they have no get().
@pytest.mark.parametrize(
    ("call", "instead", "pull"),
    [
        (lambda c: c.drain(), "start_drain()", False),
        (lambda c: c.drain(0.0), "start_drain()", False),
        (lambda c: c.get(), "get(timeout=0)", False),
        (lambda c: c.get(timeout=1.0), "get(timeout=0)", False),
        (lambda c: iter(c), "get(timeout=0)", False),
        (lambda c: c.run(lambda m: None, concurrency=1), "another thread", False),
        (lambda c: c.fetch(1, timeout=1.0), "another thread", True),
        (lambda c: c.fetch(1, no_wait=True), "another thread", True),
    ],
    ids=["drain", "drain-0", "get", "get-1s", "iter", "run", "fetch", "fetch-no-wait"],
)
def test_a_blocking_call_that_waits_for_the_io_thread_is_refused_there(
    nsqd: EmbeddedNSQD,
    blocking_only: None,
    call: Callable[[transports.sync.Consumer], object],
    instead: str,
    pull: bool,
) -> None:
    """Made in ``on_event``, each raises LocalProtocolError at once, naming what to call
    instead, and changes nothing: the consumer goes on delivering and answering."""
    consumer, outcome = _refused_at_connection_up(nsqd.tcp_address, call, pull=pull)
    with contextlib.closing(consumer):
        refused, elapsed = outcome
        assert isinstance(refused, LocalProtocolError), outcome
        assert instead in str(refused) and "IO thread" in str(refused)
        assert elapsed < AT_ONCE, outcome
        _keep_running(consumer, nsqd.tcp_address, pull=pull)


def test_get_without_waiting_works_on_the_io_thread(
    nsqd: EmbeddedNSQD, blocking_only: None
) -> None:
    """``get(timeout=0)`` waits for nothing, so it works there: None, nothing received yet.
    (Blocking only: asyncio/trio have no ``get()``.)"""
    consumer, outcome = _refused_at_connection_up(nsqd.tcp_address, lambda c: c.get(timeout=0))
    with contextlib.closing(consumer):
        got, elapsed = outcome
        assert got is None and elapsed < AT_ONCE, outcome
        _keep_running(consumer, nsqd.tcp_address, pull=False)


def test_an_iterator_made_elsewhere_is_refused_a_wait_on_the_io_thread(
    nsqd: EmbeddedNSQD, blocking_only: None
) -> None:
    """``next()`` on the IO thread of an iterator made in another thread: when it would wait
    for a message, LocalProtocolError at once, not a wait only the consumer's end can break.
    (Blocking only: asyncio/trio's iteration is awaited.)"""
    address = nsqd.tcp_address
    topic = unique("ioiter")
    with transports.sync.Producer(address) as producer:
        producer.publish(topic, b"failed once")
    outcome: list[Any] = []
    returned = threading.Event()
    iterators: list[Iterator[transports.sync.Message]] = []

    def on_event(event: object) -> None:
        if not isinstance(event, BackoffChanged) or returned.is_set():
            return
        started = time.monotonic()
        try:
            outcome.append(next(iterators[0]))
        except Exception as exc:
            outcome.append(exc)
        finally:
            outcome.append(time.monotonic() - started)
            returned.set()

    with transports.sync.Consumer(
        topic, "c", nsqd=[address], backoff_multiplier=0.05, close_timeout=1.0, on_event=on_event
    ) as consumer:
        iterators.append(iter(consumer))
        message = consumer.get(timeout=10.0)
        assert message is not None
        message.requeue(0.0)  # a failure: its BackoffChanged runs the callback
        assert returned.wait(AT_ONCE + 3.0), "on_event did not return: the IO thread stalled"
        refused, elapsed = outcome
        assert isinstance(refused, LocalProtocolError), outcome
        assert "get(timeout=0)" in str(refused) and elapsed < AT_ONCE
        again = consumer.get(timeout=10.0)  # the requeued message, after the backoff
        assert again is not None and again.body == b"failed once"
        assert again.finish() is True

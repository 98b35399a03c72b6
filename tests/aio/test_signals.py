"""drain_on_signals on asyncio and trio: the first signal drains (logged by name), one more
during the drain stops at once, as a trio user expects from Ctrl-C twice: what user code holds
is requeued, run()'s handlers are cancelled and the block is cancelled, so the code after it
runs (on the previous tree the second and third signal were ignored while a handler ran)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import uuid

import anyio
import pytest
from support.runtimes import broker_channel, wait_channel

from transports.anyio import Consumer, Message, Producer, drain_on_signals
from transports.embedded import EmbeddedNSQD

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

SIGNALS = [signal.SIGTERM, signal.SIGINT]


async def one_message(nsqd: EmbeddedNSQD) -> str:
    topic = f"t{uuid.uuid4().hex[:12]}"
    async with Producer(nsqd.tcp_address) as producer:
        await producer.publish(topic, b"job")
    return topic


async def drain_started(consumer: Consumer) -> None:
    with anyio.fail_after(10):
        while not consumer.draining:
            await anyio.sleep(0.005)


async def requeued_at_once(nsqd: EmbeddedNSQD, topic: str) -> None:
    ch = await wait_channel(
        nsqd,
        topic,
        "ch",
        lambda ch: ch["depth"] == 1 and ch["in_flight_count"] == 0,
        what="the message back on nsqd",
    )
    assert ch["deferred_count"] == 0 and ch["timeout_count"] == 0


def logged(caplog: pytest.LogCaptureFixture, name: str) -> None:
    """The two signals, by name, each said once."""
    texts = [r.getMessage() for r in caplog.records]
    assert (
        texts.count(
            f"{name} received: draining the consumer (up to 30 s; {name} again stops at once)"
        )
        == 1
    ), texts
    assert (
        texts.count(f"{name} received again: stopping at once (unanswered messages are requeued)")
        == 1
    ), texts


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
async def test_a_second_signal_cancels_run_and_the_block(
    nsqd: EmbeddedNSQD, signum: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = await one_message(nsqd)
    started = anyio.Event()
    cancelled = False

    async def handler(message: Message) -> None:
        nonlocal cancelled
        started.set()
        try:
            await anyio.sleep(30)  # a long job
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise

    with anyio.fail_after(20):
        async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address]) as consumer:
            async with drain_on_signals(consumer), anyio.create_task_group() as tg:
                tg.start_soon(consumer.run, handler)
                await started.wait()
                os.kill(os.getpid(), signum)  # a graceful drain: 30 s for the job
                await drain_started(consumer)
                second = time.monotonic()
                os.kill(os.getpid(), signum)  # stop now
                await anyio.sleep(30)
                raise AssertionError("the block was not cancelled")
            stopped = time.monotonic() - second
            await requeued_at_once(nsqd, topic)
    assert stopped < 2.0
    assert cancelled
    assert consumer.stats().finished == 0 and consumer.stats().requeued == 1
    logged(caplog, signal.Signals(signum).name)
    assert not [r for r in caplog.records if "came too late" in r.getMessage()]


async def test_a_second_signal_cancels_a_long_job_in_the_loop(nsqd: EmbeddedNSQD) -> None:
    topic = await one_message(nsqd)
    with anyio.fail_after(20):
        async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address]) as consumer:
            async with drain_on_signals(consumer):
                async for message in consumer:
                    assert message.body == b"job"
                    os.kill(os.getpid(), signal.SIGTERM)
                    await drain_started(consumer)
                    second = time.monotonic()
                    os.kill(os.getpid(), signal.SIGTERM)
                    await anyio.sleep(30)  # the job, cancelled
                    raise AssertionError("the block was not cancelled")
            stopped = time.monotonic() - second
            assert not message.answered and message.taken_back
            await requeued_at_once(nsqd, topic)
    assert stopped < 2.0


async def test_one_signal_still_drains_gracefully(nsqd: EmbeddedNSQD) -> None:
    """The first signal only drains: the job in hand finishes and is FIN'd."""
    topic = await one_message(nsqd)
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address]) as consumer:
        async with drain_on_signals(consumer):

            async def handler(message: Message) -> None:
                os.kill(os.getpid(), signal.SIGTERM)
                await drain_started(consumer)
                await anyio.sleep(0.2)

            with anyio.fail_after(10):
                await consumer.run(handler)
        assert consumer.stats().finished == 1
    ch = await broker_channel(nsqd, topic, "ch")
    assert ch["depth"] == 0 and ch["requeue_count"] == 0


async def test_one_signal_drains_within_drain_timeout(
    nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    """One SIGTERM, drain_timeout=0.5 and a 30 s job: the block ends at the drain's deadline,
    not after the job, the job is cancelled and its message requeued at once, never FIN'd late
    (on the previous tree run() returned after the whole job and logged a late FIN)."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    topic = await one_message(nsqd)
    started = anyio.Event()
    cancelled = False

    async def handler(message: Message) -> None:
        nonlocal cancelled
        started.set()
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise

    with anyio.fail_after(20):
        async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], drain_timeout=0.5) as consumer:
            async with drain_on_signals(consumer):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(consumer.run, handler)
                    await started.wait()
                    sent = time.monotonic()
                    os.kill(os.getpid(), signal.SIGTERM)
                returned = time.monotonic() - sent
            await requeued_at_once(nsqd, topic)
    assert 0.4 < returned < 3.0  # the drain's 0.5 s, not the job's 30 s
    assert cancelled
    assert consumer.stats().finished == 0 and consumer.stats().requeued == 1
    texts = [r.getMessage() for r in caplog.records]
    assert (
        texts.count(
            "SIGTERM received: draining the consumer (up to 0.5 s; SIGTERM again stops at once)"
        )
        == 1
    ), texts
    assert not [t for t in texts if "came too late" in t]

"""The anyio Producer's per-call guarantees that only the async API can show, against the
real nsqd: a deadline is per call; a cancelled publish that was already written is still
matched to its own answer; back-pressure bounds what is pending; waiting for a slot counts
against the deadline. Real-nsqd tests skip without the binaries; every test runs on asyncio
and on trio. The guarantees every runtime shares are in tests/clients/.
"""

from __future__ import annotations

import os
import signal

import anyio
import pytest
from support.brokers import needs_real, paused, topic_count, unique
from support.runtimes import recorder

from nsq_sansio.errors import BadMessage
from transports.anyio import Producer
from transports.testing.real_nsq import RealNSQD

pytestmark = pytest.mark.anyio

# --- per-call deadline, cancellation -----------------------------------------------------------


@needs_real
async def test_cancelled_publish_already_written_is_matched_to_its_answer_real() -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        topic = unique()
        seen, observe = recorder()
        async with Producer(nsqd.tcp_address, publish_observer=observe) as p:
            await p.publish(topic, b"warm")
            refused: list[BaseException] = []

            async def big() -> None:
                try:
                    await p.publish(topic, b"B" * 2000)
                except BadMessage as exc:
                    refused.append(exc)

            async with anyio.create_task_group() as tg:
                with paused(nsqd):
                    with anyio.move_on_after(0.2) as scope:
                        await p.publish(topic, b"cancelled")  # written, then cancelled
                    assert scope.cancelled_caught
                    assert p.stats().pending == 1  # still waiting for its answer
                    tg.start_soon(big)
                    await anyio.sleep(0.1)  # written behind the cancelled one
            # Refused by nsqd: had the cancelled publish's OK been given to it, it would pass.
            assert len(refused) == 1
            with anyio.fail_after(5):
                await p.publish(topic, b"next")
            assert p.stats().pending == 0
        assert topic_count(nsqd, topic) == 3  # warm, cancelled (written: at-least-once), next
    outcomes = [(t, n, e if e is None else type(e)) for t, n, _, e in seen]
    assert outcomes == [
        (topic, 1, None),  # warm
        (topic, 1, None),  # the cancelled one: reported when its OK arrived
        (topic, 1, BadMessage),
        (topic, 1, None),
    ]


# --- back-pressure ------------------------------------------------------------------------------


@needs_real
async def test_pending_publishes_are_bounded_by_max_pending_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        async with Producer(nsqd.tcp_address, max_pending=100, timeout=30) as p:
            await p.publish(topic, b"warm")
            peak = 0
            with paused(nsqd):
                async with anyio.create_task_group() as tg:
                    for _ in range(2000):
                        tg.start_soon(p.publish, topic, b"x" * 1000)
                    for _ in range(20):
                        await anyio.sleep(0.01)
                        peak = max(peak, p.stats().pending)
                    sent = p.stats().connections[0].bytes_sent
                    os.kill(nsqd.pid or 0, signal.SIGCONT)
            assert peak == 100  # the other 1900 callers wait for a slot, nothing buffered
            assert sent < 100 * 1100 + 10_000  # what was written: the 100 pending, no more
            assert p.stats().published == 2001
        assert topic_count(nsqd, topic) == 2001


# --- waiting for a slot, partial writes ------------------------------------------------------


@needs_real
async def test_large_pipelined_publishes_survive_partial_writes_real() -> None:
    # 20 MPUBs of 1 MB at once: far more than the socket takes in one write, so the rest is
    # written by the writer task as the socket drains, in order.
    with RealNSQD(["--max-body-size=2000000", "--mem-queue-size=1000"]) as nsqd:
        topic = unique()
        async with Producer(nsqd.tcp_address) as p:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(20):
                        tg.start_soon(p.multi_publish, topic, [bytes([65 + i]) * 100_000] * 10)
                    for _ in range(50):
                        tg.start_soon(p.publish, topic, b"small")
            assert p.stats().published == 70
        assert topic_count(nsqd, topic) == 250

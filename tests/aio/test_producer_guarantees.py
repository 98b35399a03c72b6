"""The anyio Producer's per-call guarantees, against the real nsqd and the embedded broker.

Each publish gets its own answer or its own error: a refused publish fails only itself and the
next one reconnects (issue 12.1); a refused IDENTIFY is raised, not retried forever (issue
12.4); a deadline is per call; a cancelled publish that was already written is still matched to
its own answer; back-pressure bounds what is pending; the publish observer sees every request
once. Real-nsqd tests skip without the binaries; every test runs on asyncio and on trio.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from nsq_sansio.errors import BadMessage, IdentifyRejected
from transports.anyio import NoNSQDAvailable, Producer
from transports.real_nsq import RealNSQD, find_binaries

from .conftest import NSQDFactory

pytestmark = pytest.mark.anyio

needs_real = pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found")


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


@contextmanager
def paused(nsqd: RealNSQD) -> Iterator[None]:
    """SIGSTOP the real nsqd: connections stay up, nothing is answered until SIGCONT."""
    assert nsqd.pid is not None
    os.kill(nsqd.pid, signal.SIGSTOP)
    try:
        _wait_stopped(nsqd.pid)
        yield
    finally:
        os.kill(nsqd.pid, signal.SIGCONT)


def _wait_stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped (SIGSTOP takes effect asynchronously)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat") as f:
                states.add(f.read().rsplit(")", 1)[1].split()[0])
        if states <= {"T", "t"}:
            return
        time.sleep(0.001)
    raise AssertionError(f"nsqd {pid} did not stop")


def topic_count(nsqd: RealNSQD, topic: str) -> int:
    entry = nsqd.topic_stats(topic)
    return 0 if entry is None else int(entry["message_count"])


Observed = list[tuple[str, int, float, "BaseException | None"]]


def recorder() -> tuple[Observed, Any]:
    seen: Observed = []

    def observe(topic: str, count: int, seconds: float, error: BaseException | None) -> None:
        seen.append((topic, count, seconds, error))

    return seen, observe


# --- issue 12.1: after a refused publish, the next one works -------------------------------


async def _refused_then_next(address: str) -> None:
    topic = fresh()
    async with Producer(address) as p:
        await p.publish(topic, b"first")
        with pytest.raises(BadMessage):
            await p.publish(topic, b"B" * 2000)
        # nsqd closed the connection after E_BAD_MESSAGE: the next publishes reconnect at once.
        started = time.monotonic()
        with anyio.fail_after(5):
            for i in range(3):
                await p.publish(topic, b"small %d" % i)
        assert time.monotonic() - started < 1.0
        stats = p.stats()
    assert (stats.published, stats.failed) == (4, 1)


@needs_real
async def test_next_publish_after_a_refused_one_succeeds_real() -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        await _refused_then_next(nsqd.tcp_address)
        topics = [t["topic_name"] for t in nsqd.stats()["topics"]]
        assert len(topics) == 1 and topic_count(nsqd, topics[0]) == 4


async def test_next_publish_after_a_refused_one_succeeds_embedded(
    make_nsqd: NSQDFactory,
) -> None:
    server = make_nsqd(max_msg_size=1024)
    await _refused_then_next(server.tcp_address)


# --- issue 12.4: a refused IDENTIFY is raised, once per publish, never retried -------------


async def _identify_refused(addresses: list[str]) -> None:
    seen, observe = recorder()
    async with Producer(
        addresses, output_buffer_timeout=0.01, publish_observer=observe, timeout=30
    ) as p:
        for _ in range(2):  # a later publish tries again, and fails the same way, quickly
            started = time.monotonic()
            with anyio.fail_after(10), pytest.raises(IdentifyRejected) as info:
                await p.publish("t", b"x")
            assert time.monotonic() - started < 5.0
            assert info.value.code == "E_BAD_BODY"
            assert "output buffer timeout" in info.value.text
        assert p.stats().published == 0
    assert [type(e) for _, _, _, e in seen] == [IdentifyRejected, IdentifyRejected]


@needs_real
async def test_refused_identify_is_raised_not_retried_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        await _identify_refused([first.tcp_address])
        # Several nsqd: no failover with a configuration error (and no NoNSQDAvailable).
        await _identify_refused([first.tcp_address, second.tcp_address])
        assert first.stats()["topics"] == [] and second.stats()["topics"] == []


async def test_refused_identify_is_raised_not_retried_embedded(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd()
    await _identify_refused([server.tcp_address])


@needs_real
async def test_msg_timeout_above_nsqd_limit_is_refused_identify_real() -> None:
    with RealNSQD(["--max-msg-timeout=5s"]) as nsqd:
        async with Producer(nsqd.tcp_address, msg_timeout=10.0) as p:
            with anyio.fail_after(10), pytest.raises(IdentifyRejected):
                await p.publish("t", b"x")


# --- per-call deadline, cancellation, ordering ----------------------------------------------


@needs_real
async def test_each_publish_has_its_own_deadline_real() -> None:
    with RealNSQD() as nsqd:
        topic = fresh()
        async with Producer(nsqd.tcp_address, timeout=0.6) as p:
            await p.publish(topic, b"warm")
            raised: dict[str, float] = {}

            async def publish(name: str, delay: float) -> None:
                await anyio.sleep(delay)
                with pytest.raises(TimeoutError):
                    await p.publish(topic, name.encode())
                raised[name] = time.monotonic()

            with paused(nsqd):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(publish, "early", 0.0)
                    tg.start_soon(publish, "late", 0.45)
            # The late one had its own deadline, not the early one's.
            assert raised["late"] - raised["early"] > 0.2
            # nsqd answers the two timed-out publishes after SIGCONT: the answers are matched to
            # them (and dropped), so the next publish gets its own.
            with anyio.fail_after(5):
                await p.publish(topic, b"after")
        assert topic_count(nsqd, topic) == 4


@needs_real
async def test_cancelled_publish_already_written_is_matched_to_its_answer_real() -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        topic = fresh()
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


async def test_refused_publish_in_a_pipeline_fails_only_itself_embedded(
    make_nsqd: NSQDFactory,
) -> None:
    server = make_nsqd(max_msg_size=1024)
    topic = fresh()
    results: dict[int, str] = {}
    async with Producer(server.tcp_address) as p:
        await p.publish(topic, b"warm")

        async def pub(i: int) -> None:
            try:
                if i % 10 == 5:
                    await p.multi_publish(topic, [b"ok", b"B" * 2000])
                else:
                    await p.publish(topic, b"%d" % i)
                results[i] = "ok"
            except Exception as exc:
                results[i] = type(exc).__name__

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(pub, i)
    assert {i for i, r in results.items() if r != "ok"} == set(range(5, 100, 10))
    assert {r for r in results.values() if r != "ok"} == {"BadMessage"}


# --- failover and back-pressure ---------------------------------------------------------------


@needs_real
async def test_failover_when_an_nsqd_dies_with_publishes_pending_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = fresh()
        async with Producer([first.tcp_address, second.tcp_address], timeout=10) as p:
            for _ in range(4):  # both connections up
                await p.publish(topic, b"warm")
            first.kill()
            with anyio.fail_after(15):
                async with anyio.create_task_group() as tg:
                    for i in range(200):
                        tg.start_soon(p.publish, topic, b"%d" % i)
            assert p.stats().published == 204
        assert topic_count(second, topic) >= 200  # every one stored (maybe some twice)


@needs_real
async def test_pending_publishes_are_bounded_by_max_pending_real() -> None:
    with RealNSQD() as nsqd:
        topic = fresh()
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


async def test_no_reachable_nsqd_still_raises_no_nsqd_available() -> None:
    async with Producer(["127.0.0.1:1", "127.0.0.1:2"], connect_timeout=1, timeout=5) as p:
        with pytest.raises(NoNSQDAvailable):
            await p.publish("t", b"x")


# --- the publish observer ---------------------------------------------------------------------


async def test_publish_observer_sees_every_request_once(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd(max_msg_size=1024)
    topic = fresh()
    seen, observe = recorder()
    async with Producer(server.tcp_address, publish_observer=observe) as p:
        await p.publish(topic, b"one")
        await p.multi_publish(topic, [b"a", b"b", b"c"])
        await p.deferred_publish(topic, b"later", 0.5)
        with pytest.raises(BadMessage):
            await p.publish(topic, b"B" * 2000)
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(p.publish, topic, b"x")
    assert [(t, n) for t, n, _, _ in seen[:4]] == [(topic, 1), (topic, 3), (topic, 1), (topic, 1)]
    assert [e for _, _, _, e in seen[:3]] == [None, None, None]
    assert isinstance(seen[3][3], BadMessage)
    assert len(seen) == 54 and all(e is None for _, _, _, e in seen[4:])
    assert all(0 <= s < 10 for _, _, s, _ in seen)
    # Settable later as an attribute; None switches it off.
    p.publish_observer = None


@needs_real
async def test_waiting_for_a_slot_counts_against_the_deadline_real() -> None:
    with RealNSQD() as nsqd:
        seen, observe = recorder()
        async with Producer(
            nsqd.tcp_address, max_pending=1, timeout=0.5, publish_observer=observe
        ) as p:
            await p.publish("t", b"warm")
            with paused(nsqd):
                started = time.monotonic()
                with anyio.fail_after(5):
                    async with anyio.create_task_group() as tg:

                        async def publish() -> None:
                            with pytest.raises(TimeoutError):
                                await p.publish("t", b"x")

                        tg.start_soon(publish)  # takes the only slot, never answered
                        tg.start_soon(publish)  # waits for the slot: same deadline
                assert time.monotonic() - started < 2.0
    assert [type(e) for _, _, _, e in seen] == [type(None), TimeoutError, TimeoutError]


@needs_real
async def test_large_pipelined_publishes_survive_partial_writes_real() -> None:
    # 20 MPUBs of 1 MB at once: far more than the socket takes in one write, so the rest is
    # written by the writer task as the socket drains, in order.
    with RealNSQD(["--max-body-size=2000000", "--mem-queue-size=1000"]) as nsqd:
        topic = fresh()
        async with Producer(nsqd.tcp_address) as p:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for i in range(20):
                        tg.start_soon(p.multi_publish, topic, [bytes([65 + i]) * 100_000] * 10)
                    for _ in range(50):
                        tg.start_soon(p.publish, topic, b"small")
            assert p.stats().published == 70
        assert topic_count(nsqd, topic) == 250

"""The blocking Producer's per-call guarantees, against the real nsqd and the embedded broker.

Each publish gets its own answer or its own error: a refused publish fails only itself and the
next one works (issue 12.1); a refused IDENTIFY is raised by the publish and its future, not
retried (issue 12.4); every publish has its own deadline and a timed-out publish that was
written is still matched to its own answer; back-pressure bounds memory; the publish observer
sees every request once. Real-nsqd tests skip without the binaries.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from nsq_sansio.errors import BadMessage, IdentifyRejected
from transports.real_nsq import RealNSQD, find_binaries
from transports.sync import Producer

from ._helpers import running_nsqd, unique

needs_real = pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found")


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


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


Observed = list[tuple[str, int, float, "BaseException | None"]]


def recorder() -> tuple[Observed, Any]:
    seen: Observed = []
    lock = threading.Lock()

    def observe(topic: str, count: int, seconds: float, error: BaseException | None) -> None:
        with lock:
            seen.append((topic, count, seconds, error))

    return seen, observe


# --- issue 12.1 ---------------------------------------------------------------------------------


def _refused_then_next(address: str) -> None:
    topic = unique()
    with Producer(address) as p:
        p.publish(topic, b"first")
        with pytest.raises(BadMessage):
            p.publish(topic, b"B" * 2000)
        started = time.monotonic()
        for i in range(3):
            p.publish(topic, b"small %d" % i, timeout=5)
        assert time.monotonic() - started < 1.0
        stats = p.stats()
    assert (stats.published, stats.failed) == (4, 1)


@needs_real
def test_next_publish_after_a_refused_one_succeeds_real() -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        _refused_then_next(nsqd.tcp_address)


def test_next_publish_after_a_refused_one_succeeds_embedded() -> None:
    with running_nsqd(max_msg_size=1024) as (server, _):
        _refused_then_next(server.tcp_address)


def test_refused_publishes_in_a_pipeline_fail_only_themselves_embedded() -> None:
    topic = unique()
    with running_nsqd(max_msg_size=1024) as (server, _), Producer(server.tcp_address) as p:
        p.publish(topic, b"warm")
        futures = [
            p.multi_publish_async(topic, [b"ok", b"B" * 2000])
            if i % 10 == 5
            else p.publish_async(topic, b"%d" % i)
            for i in range(100)
        ]
        failed = {i for i, f in enumerate(futures) if f.exception(15) is not None}
        assert failed == set(range(5, 100, 10))
        assert all(isinstance(futures[i].exception(), BadMessage) for i in failed)


# --- issue 12.4 ---------------------------------------------------------------------------------


def _identify_refused(addresses: list[str]) -> None:
    seen, observe = recorder()
    with Producer(addresses, output_buffer_timeout=0.01, publish_observer=observe) as p:
        for _ in range(2):  # a later publish tries again, and fails the same way, quickly
            started = time.monotonic()
            with pytest.raises(IdentifyRejected) as info:
                p.publish("t", b"x", timeout=10)
            assert time.monotonic() - started < 5.0
            assert info.value.code == "E_BAD_BODY"
            assert "output buffer timeout" in info.value.text
        future = p.publish_async("t", b"x", timeout=10)
        assert isinstance(future.exception(10), IdentifyRejected)
        assert p.stats().published == 0
    assert [type(e) for _, _, _, e in seen] == [IdentifyRejected] * 3


@needs_real
def test_refused_identify_is_raised_not_retried_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        _identify_refused([first.tcp_address])
        _identify_refused([first.tcp_address, second.tcp_address])  # no failover either
        assert first.stats()["topics"] == [] and second.stats()["topics"] == []


def test_refused_identify_is_raised_not_retried_embedded() -> None:
    with running_nsqd() as (server, _):
        _identify_refused([server.tcp_address])


@needs_real
def test_msg_timeout_above_nsqd_limit_is_refused_identify_real() -> None:
    with (
        RealNSQD(["--max-msg-timeout=5s"]) as nsqd,
        Producer(nsqd.tcp_address, msg_timeout=10.0) as p,
        pytest.raises(IdentifyRejected),
    ):
        p.publish("t", b"x", timeout=10)


# --- deadlines, failover, back-pressure ---------------------------------------------------------


@needs_real
def test_each_publish_has_its_own_deadline_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        with Producer(nsqd.tcp_address, timeout=30) as p:
            p.publish(topic, b"warm")
            with paused(nsqd):
                short = p.publish_async(topic, b"short", timeout=0.4)
                long = p.publish_async(topic, b"long", timeout=1.2)
                started = time.monotonic()
                assert isinstance(short.exception(5), TimeoutError)
                short_at = time.monotonic() - started
                assert not long.done()  # its own, later deadline
                assert isinstance(long.exception(5), TimeoutError)
                long_at = time.monotonic() - started
                assert short_at < 0.9 and 1.0 < long_at < 2.5
                assert p.stats().pending == 0  # a timed-out publish frees its slot
            # The late answers to the two timed-out publishes are matched to them (and dropped):
            # the next publish gets its own.
            p.publish(topic, b"after", timeout=5)
        assert topic_count(nsqd, topic) == 4


@needs_real
def test_failover_when_an_nsqd_dies_with_publishes_pending_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = unique()
        with Producer([first.tcp_address, second.tcp_address], timeout=10) as p:
            for _ in range(4):
                p.publish(topic, b"warm")
            first.kill()
            futures = [p.publish_async(topic, b"%d" % i) for i in range(200)]
            assert all(f.exception(15) is None for f in futures)
        assert topic_count(second, topic) >= 200


@needs_real
def test_memory_with_100k_publishes_is_bounded_by_max_pending_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        body = b"x" * 1000
        with Producer(nsqd.tcp_address, max_pending=1000, timeout=60) as p:
            p.publish(topic, b"warm")
            before = rss_bytes()
            done = threading.Event()
            peaks: list[int] = []

            def publish_all() -> None:
                for _ in range(100_000):
                    p.publish_async(topic, body)
                done.set()

            with paused(nsqd):
                thread = threading.Thread(target=publish_all)
                thread.start()
                deadline = time.monotonic() + 10
                while p.stats().pending < 1000 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.2)
                peaks.append(p.stats().pending)
                grown = rss_bytes() - before
                assert not done.is_set()  # the publisher is held back, not buffering
            thread.join(60)
            p.flush(30)
        assert peaks == [1000]
        # 100,000 bodies of 1 KB would be 100 MB; 1000 pending are about 1 MB.
        assert grown < 30 * 1024 * 1024
        assert topic_count(nsqd, topic) == 100_001


# --- the publish observer ---------------------------------------------------------------------


def test_publish_observer_sees_every_request_once() -> None:
    topic = unique()
    seen, observe = recorder()
    with (
        running_nsqd(max_msg_size=1024) as (server, _),
        Producer(server.tcp_address, publish_observer=observe) as p,
    ):
        p.publish(topic, b"one")
        p.multi_publish(topic, [b"a", b"b", b"c"])
        p.deferred_publish(topic, b"later", 0.5)
        with pytest.raises(BadMessage):
            p.publish(topic, b"B" * 2000)
        futures = [p.publish_async(topic, b"x") for _ in range(50)]
        for f in futures:
            f.result(10)
    assert [(t, n) for t, n, _, _ in seen[:4]] == [(topic, 1), (topic, 3), (topic, 1), (topic, 1)]
    assert [e for _, _, _, e in seen[:3]] == [None, None, None]
    assert isinstance(seen[3][3], BadMessage)
    assert len(seen) == 54 and all(e is None for _, _, _, e in seen[4:])
    assert all(0 <= s < 10 for _, _, s, _ in seen)


@needs_real
def test_waiting_for_a_slot_counts_against_the_deadline_real() -> None:
    seen, observe = recorder()
    with (
        RealNSQD() as nsqd,
        Producer(nsqd.tcp_address, max_pending=1, publish_observer=observe) as p,
    ):
        p.publish("t", b"warm")
        with paused(nsqd):
            first = p.publish_async("t", b"x", timeout=0.5)
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                p.publish("t", b"y", timeout=0.5)  # no slot within its own deadline
            assert time.monotonic() - started < 2.0
            assert isinstance(first.exception(5), TimeoutError)
    assert sorted(type(e).__name__ for _, _, _, e in seen) == [
        "NoneType",
        "TimeoutError",
        "TimeoutError",
    ]

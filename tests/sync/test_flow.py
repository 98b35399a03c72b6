"""Flow control, message policy and long jobs, checked on the broker's side where it matters."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import pytest

from nsq_sansio.consumer import GiveUp
from nsq_sansio.errors import LocalProtocolError
from nsq_sansio.events import Message as CoreMessage
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, KeepaliveExpired, Message, Producer

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def test_max_in_flight_is_respected_on_the_broker(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(300)])
    peak = 0
    done = 0
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=7) as consumer:
        held: list[Message] = []
        while done < 300:
            msg = consumer.get(timeout=5)
            assert msg is not None
            held.append(msg)
            if len(held) == 7 or done + len(held) == 300:
                stats = channel_stats(runner, topic, "c")
                assert stats is not None
                peak = max(peak, stats["in_flight_count"])
                assert stats["in_flight_count"] <= 7
                # holding 7: nothing more is delivered until one is answered
                assert consumer.get(timeout=0.05) is None or done + len(held) > 300
                for m in held:
                    m.finish()
                done += len(held)
                held = []
    assert peak == 7


def test_backoff_on_failures(nsqd: Pair) -> None:
    """A failure sends RDY 0 to the broker for the backoff window; then the test: RDY = what
    the consumer still holds + 1, so one message comes beside those (RDY 1 would let none
    in while five are held); successes bring full RDY back."""
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(6)])
    with Consumer(
        topic,
        "c",
        nsqd=[server.tcp_address],
        max_in_flight=10,
        backoff_multiplier=1.0,  # a 2 s window: RDY 0 is seen on the broker even under load
        max_backoff_duration=2.0,
    ) as consumer:
        first = consumer.get(timeout=5)
        assert first is not None
        wait_for(lambda: consumer.stats().in_flight == 6, what="6 in flight")
        first.requeue(delay=0)
        wait_for(lambda: consumer.stats().backoff_level == 1, what="backoff level 1")
        stats = consumer.stats()
        assert stats.backoff_phase == "waiting" and stats.rdy == 0

        def client_stats() -> dict[str, Any]:
            s = channel_stats(runner, topic, "c")
            return s["clients"][0] if s and s["clients"] else {}

        wait_for(lambda: client_stats().get("ready_count") == 0, what="RDY 0 on the broker")
        # after the window: the five still held, and one test message (the requeued one)
        wait_for(lambda: consumer.stats().backoff_phase == "testing", timeout=5, what="testing")
        wait_for(lambda: client_stats().get("ready_count") == 6, what="RDY 5 + 1 while testing")
        wait_for(lambda: client_stats().get("in_flight_count") == 6, what="the test message")
        while True:
            msg = consumer.get(timeout=5)
            assert msg is not None
            msg.finish()
            if consumer.stats().backoff_phase == "normal":
                break
        wait_for(lambda: client_stats().get("ready_count") == 10, what="full RDY again")


def test_max_attempts_and_give_up(nsqd: Pair, caplog: pytest.LogCaptureFixture) -> None:
    server, _ = nsqd
    topic = unique()
    given_up: list[CoreMessage] = []
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    with Producer(server.tcp_address) as producer:
        producer.publish(topic, b"poison")
        producer.publish(topic, b"fine")
    deliveries = 0
    with Consumer(
        topic,
        "c",
        nsqd=[server.tcp_address],
        max_in_flight=2,
        max_attempts=3,
        backoff_enabled=False,
        on_event=lambda event: isinstance(event, GiveUp) and given_up.append(event.message),
    ) as consumer:
        deadline = time.monotonic() + 10
        while not given_up and time.monotonic() < deadline:
            msg = consumer.get(timeout=0.1)
            if msg is None:
                continue
            if msg.body == b"poison":
                deliveries += 1
                msg.requeue(delay=0)
            else:
                msg.finish()
        stats = consumer.stats()
    assert deliveries == 3  # attempts 1..3 reached user code; the 4th was given up
    assert [m.body for m in given_up] == [b"poison"] and given_up[0].attempts == 4
    assert stats.given_up == 1
    assert "giving up on message" in caplog.text


def test_drain_with_messages_in_flight_loses_and_redelivers_nothing(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(100)])
    processed: list[bytes] = []
    consumer = Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=20)
    with consumer:
        held = [consumer.get(timeout=5) for _ in range(3)]
        assert all(m is not None for m in held)
        wait_for(lambda: consumer.stats().in_flight == 20, what="20 in flight")
        result: list[bool] = []

        def drain() -> None:
            consumer.drain(timeout=10)
            result.append(True)

        drainer = threading.Thread(target=drain)
        drainer.start()
        time.sleep(0.3)  # the drain waits for the 3 messages user code holds
        assert drainer.is_alive()
        for m in held:
            assert m is not None
            processed.append(m.body)
            m.finish()  # answered during the drain: FIN'd, not requeued
        drainer.join(10)
        assert result == [True]
        # iteration ends once drained
        assert list(consumer) == []
    wait_for(
        lambda: (channel_stats(runner, topic, "c") or {}).get("in_flight_count") == 0,
        what="nothing in flight on the broker",
    )
    # a second consumer gets exactly the rest, each once, first attempt or requeued-by-drain
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=50) as second:
        while len(processed) < 100:
            msg = second.get(timeout=5)
            assert msg is not None
            processed.append(msg.body)
            msg.finish()
        assert second.get(timeout=0.3) is None
    assert sorted(processed) == sorted(b"%d" % i for i in range(100))


def test_slow_handler_does_not_block_heartbeats(nsqd: Pair) -> None:
    """heartbeat_interval=1s: a handler busy for 3.5 s (past 2.5 intervals) keeps the link."""
    server, _ = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"slow", b"next"])
    with Consumer(
        topic, "c", nsqd=[server.tcp_address], heartbeat_interval=1.0, max_in_flight=1
    ) as consumer:
        msg = consumer.get(timeout=5)
        assert msg is not None
        time.sleep(3.5)  # user code hogs this thread; the IO thread answers heartbeats
        msg.finish()
        nxt = consumer.get(timeout=5)
        assert nxt is not None and nxt.body == b"next" and nxt.attempts == 1
        nxt.finish()
        stats = consumer.stats()
    assert stats.reconnects == 0 and stats.connection_errors == 0 and stats.taken_back == 0


def test_keepalive_keeps_a_job_3x_msg_timeout_alive() -> None:
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, runner):
        with Producer(server.tcp_address) as producer:
            producer.publish(topic, b"long job")
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
            msg = consumer.get(timeout=5)
            assert msg is not None
            with msg.keepalive():
                time.sleep(3.2)
            assert not msg.taken_back and not msg.keepalive_expiring
            msg.finish()
            assert consumer.get(timeout=0.5) is None  # not redelivered
            stats = consumer.stats()
        channel = channel_stats(runner, topic, "c")
    assert stats.taken_back == 0 and stats.finished == 1
    assert channel is not None and channel["timeout_count"] == 0


def test_without_keepalive_nothing_is_touched_and_the_message_times_out() -> None:
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, _):
        with Producer(server.tcp_address) as producer:
            producer.publish(topic, b"long job")
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
            msg = consumer.get(timeout=5)
            assert msg is not None
            again = consumer.get(timeout=5)  # nsqd took it back after 1 s and sent it again
            assert again is not None and again.id == msg.id and again.attempts == 2
            again.finish()
            msg.finish()  # late: reported, not raised
            wait_for(lambda: consumer.stats().taken_back >= 1, what="taken back")
            assert msg.taken_back


def test_keepalive_stops_at_max_msg_timeout_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    topic = unique()
    with running_nsqd(msg_timeout=1.0, max_msg_timeout=2.0) as (server, _):
        with Producer(server.tcp_address) as producer:
            producer.publish(topic, b"too long")
        events: list[object] = []
        with Consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=5, on_event=events.append
        ) as consumer:
            msg = consumer.get(timeout=5)
            assert msg is not None
            with msg.keepalive():
                wait_for(lambda: msg.keepalive_expiring, timeout=3, what="expiry warning")
                expired = [e for e in events if isinstance(e, KeepaliveExpired)]
                assert len(expired) == 1 and expired[0].message_id == msg.id
                assert expired[0].deadline - msg.received_at == pytest.approx(2.0, abs=0.05)
                again = consumer.get(timeout=3)  # nsqd took it back at max_msg_timeout
            assert again is not None and again.id == msg.id
            again.finish()
    assert "max_msg_timeout" in caplog.text


def test_fetch_batch_expiry_and_no_wait(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(25)])
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=100, pull=True) as c:
        batch = c.fetch(10, timeout=5.0)
        assert [m.body for m in batch] == [b"%d" % i for i in range(10)]
        # RDY follows the fetches: the broker holds only what was asked
        stats = channel_stats(runner, topic, "c")
        assert stats is not None and stats["in_flight_count"] <= 10
        for m in batch:
            m.finish()
        started = time.monotonic()
        rest = c.fetch(100, timeout=0.5)  # expires with what arrived: the other 15
        assert 0.4 <= time.monotonic() - started < 3.0
        assert sorted(m.body for m in rest) == sorted(b"%d" % i for i in range(10, 25))
        for m in rest:
            m.finish()
        started = time.monotonic()
        assert c.fetch(5, no_wait=True) == []  # nothing buffered: answers at once
        assert time.monotonic() - started < 1.0
        with pytest.raises(LocalProtocolError, match="pull consumers use fetch"):
            iter(c)
    wait_for(
        lambda: (channel_stats(runner, topic, "c") or {}).get("in_flight_count") == 0,
        what="all answered",
    )


def test_pull_batch_held_under_keepalive_then_finished_after_commit() -> None:
    """The Spark source's pattern: fetch a batch, keep it alive while committing (longer than
    msg_timeout), FIN after the commit: nothing times out, nothing is delivered twice."""
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, runner):
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(topic, [b"%d" % i for i in range(30)])
        with Consumer(
            topic, "spark", nsqd=[server.tcp_address], pull=True, max_in_flight=100
        ) as consumer:
            batch = consumer.fetch(20, timeout=5.0)
            assert len(batch) == 20
            with contextlib.ExitStack() as stack:
                for m in batch:
                    stack.enter_context(m.keepalive())
                time.sleep(2.5)  # "commit"
            for m in batch:
                assert not m.taken_back
                m.finish()
            rest = consumer.fetch(10, timeout=5.0)  # filled at once: no wait past msg_timeout
            assert len(rest) == 10 and all(m.attempts == 1 for m in rest)
            for m in rest:
                m.finish()
        # the last FINs are applied by the broker a little after close() returns
        wait_for(
            lambda: (channel_stats(runner, topic, "spark") or {}).get("in_flight_count") == 0,
            what="every FIN applied",
        )
        channel = channel_stats(runner, topic, "spark")
    assert channel is not None and channel["timeout_count"] == 0
    assert channel["depth"] == 0 and channel["in_flight_count"] == 0

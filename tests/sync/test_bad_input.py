"""The blocking clients' own arguments (``get``, a publish's ``timeout=``, ``flush``) raise
in the caller, and what slips past the checks into the IO thread (which owns every connection
of the consumer) is reported, never fatal. Real loopback sockets, embedded nsqd. What every
runtime shares is in tests/clients/test_bad_input.py."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import pytest
from support.brokers import embedded_topic_count

from nsq_sansio.errors import LocalProtocolError
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, Message, Producer

from ._helpers import channel_stats, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]

NOT_SECONDS: tuple[Any, ...] = (math.inf, math.nan, -math.inf, -1, -0.5, "1", True, object())


def publish(server: EmbeddedNSQD, topic: str, count: int) -> None:
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(count)])


def assert_io_alive(consumer: Consumer) -> None:
    loop = consumer._io.loop
    assert loop.failure is None, f"IO thread crashed: {loop.failure!r}"
    assert loop.thread is not None and loop.thread.is_alive()


def take(consumer: Consumer) -> Message:
    msg = consumer.get(timeout=5)
    assert msg is not None, "no message delivered"
    return msg


def test_bad_blocking_only_arguments_raise_in_caller(nsqd: Pair) -> None:
    """What only the blocking consumer has: ``get(timeout=)``; a bad ``run()`` starts no worker
    thread."""
    server, _ = nsqd
    topic = unique()
    publish(server, topic, 1)
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=1) as consumer:
        for timeout in NOT_SECONDS:
            with pytest.raises(LocalProtocolError, match="get timeout"):
                consumer.get(timeout=timeout)
        with pytest.raises(LocalProtocolError, match="concurrency"):
            consumer.run(lambda m: None, concurrency=0)
        with pytest.raises(LocalProtocolError, match="handler"):
            consumer.run("not callable", concurrency=1)  # type: ignore[arg-type]
        assert not [t for t in threading.enumerate() if t.name.startswith("nsq-sync-worker")]
        assert_io_alive(consumer)
        assert take(consumer).finish()
        assert consumer.get(timeout=0) is None  # 0 is a valid poll


def test_failing_user_action_on_io_thread_is_reported_not_fatal(
    nsqd: Pair, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever slips past the checks in the caller (here: a core call made to fail) is
    logged and reported to that caller; the IO thread and its connections live on."""
    server, runner = nsqd
    topic = unique()
    publish(server, topic, 3)
    caplog.set_level(logging.ERROR, logger="nsq_sansio.sync")
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=1) as consumer:
        coordinator = consumer._io.coordinator

        def boom(*args: object, **kwargs: object) -> None:
            raise RuntimeError("injected failure")

        # set_max_in_flight: the IO thread's error is raised in the caller.
        monkeypatch.setattr(coordinator, "set_max_in_flight", boom)
        with pytest.raises(RuntimeError, match="injected failure"):
            consumer.set_max_in_flight(2)
        monkeypatch.undo()
        assert_io_alive(consumer)

        # An answer: fire-and-forget, so it is logged and the message can be answered again.
        msg = take(consumer)
        monkeypatch.setattr(coordinator, "requeue", boom)
        assert msg.requeue(delay=0)
        wait_for(lambda: not msg.answered, what="the failed REQ to be undone")
        monkeypatch.undo()
        assert_io_alive(consumer)
        assert msg.finish()

        # drain: raised in the caller, nothing drained, the consumer goes on.
        monkeypatch.setattr(coordinator, "drain", boom)
        with pytest.raises(RuntimeError, match="injected failure"):
            consumer.drain(timeout=5)
        monkeypatch.undo()
        assert not consumer.draining
        assert_io_alive(consumer)
        for _ in range(2):
            assert take(consumer).finish()
        assert "injected failure" in caplog.text
    ch = channel_stats(runner, topic, "c")
    assert ch is not None and ch["in_flight_count"] == 0 and ch["depth"] == 0


def test_failing_fin_batch_on_io_thread_is_logged_once_and_answerable_again(
    nsqd: Pair, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FINs are taken back by the IO thread in batches: a batch that fails there (a core call
    made to fail) is logged once, and each of its messages can be answered again."""
    server, runner = nsqd
    topic = unique()
    publish(server, topic, 3)
    caplog.set_level(logging.ERROR, logger="nsq_sansio.sync")
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=3) as consumer:
        coordinator = consumer._io.coordinator
        held = [take(consumer) for _ in range(3)]

        def boom(*args: object, **kwargs: object) -> None:
            raise RuntimeError("injected failure")

        monkeypatch.setattr(coordinator, "finish_many", boom)
        paused, resume = threading.Event(), threading.Event()

        def pause() -> None:
            paused.set()
            resume.wait(10)

        consumer._io.loop.call_soon(pause)  # the IO thread waits: the three FINs make one batch
        assert paused.wait(10)
        assert all(msg.finish() for msg in held)
        resume.set()
        wait_for(lambda: not any(msg.answered for msg in held), what="the failed FINs to be undone")
        monkeypatch.undo()
        assert_io_alive(consumer)
        failures = [r for r in caplog.records if "failed on the IO thread" in r.getMessage()]
        assert len(failures) == 1 and "3 messages" in failures[0].getMessage()
        assert all(msg.finish() for msg in held)
        assert not any(msg.taken_back for msg in held)
        wait_for(
            lambda: (channel_stats(runner, topic, "c") or {}).get("in_flight_count") == 0,
            what="nsqd to see the FINs",
        )
    ch = channel_stats(runner, topic, "c")
    assert ch is not None and ch["depth"] == 0 and ch["requeue_count"] == 0


def test_bad_per_call_timeouts_raise_in_caller_and_publish_nothing(nsqd: Pair) -> None:
    """What only the blocking producer has: a publish's own ``timeout=``, ``flush``."""
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        for timeout in (0, *NOT_SECONDS):
            with pytest.raises(LocalProtocolError, match="PUB timeout"):
                producer.publish(topic, b"x", timeout=timeout)
            with pytest.raises(LocalProtocolError, match="MPUB timeout"):
                producer.multi_publish_async(topic, [b"x"], timeout=timeout)
            with pytest.raises(LocalProtocolError, match="DPUB timeout"):
                producer.deferred_publish(topic, b"x", 1.0, timeout=timeout)
        for timeout in NOT_SECONDS:
            with pytest.raises(LocalProtocolError, match="flush timeout"):
                producer.flush(timeout)
        assert producer.stats().pending == 0
        assert producer._loop.failure is None
        assert embedded_topic_count(runner, topic) == 0  # nothing bad was sent
        producer.publish(topic, b"ok")  # still open and working
        producer.flush(5)
    assert embedded_topic_count(runner, topic) == 1

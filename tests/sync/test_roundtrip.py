"""Publish and consume through the blocking transport against the embedded nsqd over loopback."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from nsq_sansio.errors import BadMessage, InvalidName
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, HTTPProducer, HTTPPublishError, Message, Producer

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def _consume(consumer: Consumer, count: int, timeout: float = 10.0) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        message = consumer.get(timeout=max(deadline - time.monotonic(), 0.01))
        if message is None:
            break
        got.append(message)
        message.finish()
    return got


def test_publish_consume_round_trip(nsqd: Pair) -> None:
    server, _ = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        for i in range(50):
            producer.publish(topic, b"message %d" % i)
    with Consumer(topic, "archive", nsqd=[server.tcp_address], max_in_flight=10) as consumer:
        got = []
        for msg in consumer:
            got.append(msg.body)
            assert msg.attempts == 1
            assert msg.nsqd_address == server.tcp_address
            msg.finish()
            if len(got) == 50:
                break
        stats = consumer.stats()
    assert got == [b"message %d" % i for i in range(50)]
    assert stats.finished == 50 and stats.received == 50


def test_multi_publish_and_deferred_publish(nsqd: Pair) -> None:
    server, _ = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"a", b"b", b"c"])
        published_at = time.monotonic()
        producer.deferred_publish(topic, b"later", delay=0.6)
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
        first = _consume(consumer, 3)
        assert [m.body for m in first] == [b"a", b"b", b"c"]
        late = _consume(consumer, 1)
        arrived = time.monotonic()
    assert [m.body for m in late] == [b"later"]
    assert arrived - published_at >= 0.55


def test_publish_async_pipelines_many_on_one_connection(nsqd: Pair) -> None:
    server, _ = nsqd
    topic = unique()
    with Producer(server.tcp_address, max_pending=500) as producer:
        futures = [producer.publish_async(topic, b"%d" % i) for i in range(2000)]
        for future in futures:
            future.result(10)
        stats = producer.stats()
    assert stats.published == 2000 and stats.failed == 0 and stats.pending == 0
    assert stats.reconnects == 0  # one connection carried them all
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=200) as consumer:
        bodies = {m.body for m in _consume(consumer, 2000)}
    assert bodies == {b"%d" % i for i in range(2000)}


def test_refused_publish_raises_the_server_error(nsqd: Pair) -> None:
    server, _ = nsqd
    with Producer(server.tcp_address, max_attempts=5) as producer:
        with pytest.raises(InvalidName) as info:
            producer.publish("bad topic name!", b"x")
        # names are checked before anything is sent: the documented type, exactly
        assert type(info.value) is InvalidName
        assert "topic" in str(info.value).lower()
        assert producer.stats().published == 0
        producer.publish(unique(), b"still usable")


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compressed_connections(nsqd: Pair, compression: str) -> None:
    server, runner = nsqd
    topic = unique()
    options: dict[str, Any] = {compression: True}
    body = b"compressible " * 200
    with Producer(server.tcp_address, **options) as producer:
        producer.multi_publish(topic, [body + b"%d" % i for i in range(100)])
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=20, **options) as c:
        got = _consume(c, 100)
        clients = channel_stats(runner, topic, "c")
    assert [m.body for m in got] == [body + b"%d" % i for i in range(100)]
    assert clients is not None
    assert clients["clients"][0][compression] is True


def test_run_with_threads_finishes_on_return_and_requeues_on_raise(nsqd: Pair) -> None:
    server, _ = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(40)])
    seen: dict[bytes, int] = {}
    lock = threading.Lock()
    active = 0
    peak = 0
    with Consumer(
        topic,
        "c",
        nsqd=[server.tcp_address],
        max_in_flight=4,
        backoff_enabled=False,
        default_requeue_delay=0.0,
    ) as consumer:

        def handler(msg: Message) -> None:
            nonlocal active, peak
            with lock:
                active += 1
                peak = max(peak, active)
                seen[msg.body] = seen.get(msg.body, 0) + 1
            try:
                time.sleep(0.01)
                if msg.attempts == 1 and int(msg.body) % 5 == 0:
                    raise ValueError("fail once")
            finally:
                with lock:
                    active -= 1
                    if len(seen) == 40 and all(
                        n == (2 if int(b) % 5 == 0 else 1) for b, n in seen.items()
                    ):
                        consumer.start_drain(5.0)

        consumer.run(handler, concurrency=8)
        stats = consumer.stats()
    assert set(seen) == {b"%d" % i for i in range(40)}
    assert all(n == (2 if int(b) % 5 == 0 else 1) for b, n in seen.items())
    assert stats.requeued >= 8
    assert peak <= 4  # concurrency bounded by max_in_flight, not by the 8 threads


def test_leaving_the_block_requeues_what_was_not_answered(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(20)])
    with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=10) as consumer:
        held = consumer.get(timeout=5)
        assert held is not None
        wait_for(lambda: consumer.stats().in_flight == 10, what="10 in flight")
    # nothing is in flight on the broker any more: all 20 are back in the queue
    wait_for(
        lambda: (channel_stats(runner, topic, "c") or {}).get("in_flight_count") == 0,
        what="broker in_flight 0",
    )
    stats = channel_stats(runner, topic, "c")
    assert stats is not None and stats["depth"] + stats["deferred_count"] == 20
    assert held.finish() is True  # after close: harmless (nsqd requeued it already)
    assert held.finish() is False  # answered already: nothing is sent twice


def test_http_producer_with_failover() -> None:
    topic = unique()
    with running_nsqd(max_msg_size=1000) as (server, _):
        # the first URL refuses connections: every publish fails over to the second
        with HTTPProducer(["http://127.0.0.1:1", server.http_url]) as producer:
            producer.publish(topic, b"one")
            producer.multi_publish(topic, [b"two\nlines", b"three"])
            producer.deferred_publish(topic, b"four", delay=0.2)
            with pytest.raises(HTTPPublishError) as info:
                producer.publish(topic, b"x" * 2000)
            assert info.value.status >= 400
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
            bodies = [m.body for m in _consume(consumer, 4)]
    assert bodies == [b"one", b"two\nlines", b"three", b"four"]


def test_consumer_survives_unreachable_nsqd_and_reports_it() -> None:
    with running_nsqd() as (server, _):
        address = server.tcp_address
    # the port is closed now: connection errors are logged and counted, never raised
    with Consumer(
        unique(), "c", nsqd=[address], reconnect_delay=0.05, max_reconnect_delay=0.1
    ) as consumer:
        wait_for(lambda: consumer.stats().connection_errors >= 3, what="retries")
        assert consumer.get(timeout=0.05) is None


def test_a_refused_publish_fails_alone_and_the_pipeline_goes_on() -> None:
    """nsqd closes the connection on E_BAD_MESSAGE: the refused publish raises the server's
    error; the others pipelined behind it are sent again after the reconnect."""
    topic = unique()
    with running_nsqd(max_msg_size=100) as (server, _):
        with Producer(server.tcp_address, reconnect_delay=0.05, max_reconnect_delay=0.1) as p:
            futures = [p.publish_async(topic, b"ok %d" % i) for i in range(50)]
            bad = p.publish_async(topic, b"x" * 500)
            futures += [p.publish_async(topic, b"ok %d" % i) for i in range(50, 100)]
            for future in futures:
                future.result(10)
            with pytest.raises(BadMessage) as info:
                bad.result(10)
            assert type(info.value) is BadMessage and info.value.code == "E_BAD_MESSAGE"
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=100) as consumer:
            bodies = {m.body for m in _consume(consumer, 100)}
    assert bodies == {b"ok %d" % i for i in range(100)}


def test_publish_future_interface(nsqd: Pair) -> None:
    server, _ = nsqd
    called: list[object] = []
    with Producer(server.tcp_address) as producer:
        future = producer.multi_publish_async(unique(), [b"a", b"b"])
        future.add_done_callback(called.append)
        future.result(5)
        assert future.done() and future.exception() is None
        wait_for(lambda: called == [future], what="callback")
        late: list[object] = []
        future.add_done_callback(late.append)  # already done: called at once
        assert late == [future]
        refused = producer.publish_async(unique(), b"x" * (2 * 1024 * 1024))
        assert type(refused.exception(5)) is BadMessage  # over nsqd's max_msg_size


def test_host_names_are_resolved_off_the_io_thread(nsqd: Pair) -> None:
    server, _ = nsqd
    port = server.tcp_address.rsplit(":", 1)[1]
    topic = unique()
    with Producer(f"localhost:{port}") as producer:
        producer.publish(topic, b"by name")
    with Consumer(topic, "c", nsqd=[f"localhost:{port}"]) as consumer:
        msg = consumer.get(timeout=5)
        assert msg is not None and msg.body == b"by name"
        msg.finish()

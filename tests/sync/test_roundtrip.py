"""Publish and consume through the blocking transport against the embedded nsqd over loopback."""

from __future__ import annotations

import time

from nsq_sansio.errors import BadMessage
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, Message, Producer

from ._helpers import channel_stats, unique, wait_for

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

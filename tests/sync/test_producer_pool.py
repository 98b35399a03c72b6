"""The blocking Producer's ``connections_per_nsqd``: publishes spread over the connections,
failover unchanged, a caller's sequential publishes stay in order. Real nsqd (skipped without
the binaries) and the embedded broker."""

from __future__ import annotations

import threading

import pytest

from nsq_sansio.errors import ConfigError
from transports.sync import Consumer, Producer
from transports.testing.real_nsq import RealNSQD, find_binaries

from ._helpers import running_nsqd, unique, wait_for

needs_real = pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found")


def pub_counts(nsqd: RealNSQD, topic: str) -> list[int]:
    """PUBs per client connection, as the real nsqd counts them."""
    counts = []
    for client in nsqd.stats().get("producers") or ():
        for entry in client.get("pub_counts") or ():
            if entry["topic"] == topic:
                counts.append(int(entry["count"]))
    return sorted(counts)


def all_connected(p: Producer, count: int) -> bool:
    connections = p.stats().connections
    return len(connections) == count and all(c.connected for c in connections)


@pytest.mark.parametrize("value", [0, -1, 65, 1.5, True, "2"])
def test_connections_per_nsqd_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match="connections_per_nsqd"):
        Producer("127.0.0.1:4150", connections_per_nsqd=value)  # type: ignore[arg-type]


@needs_real
def test_publishes_spread_over_the_pool_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        with Producer(nsqd.tcp_address, connections_per_nsqd=3) as p:
            p.publish(topic, b"warm")
            wait_for(lambda: all_connected(p, 3), what="3 connections")
            for i in range(60):  # one caller, one by one: round robin
                p.publish(topic, b"%d" % i)
            counts = pub_counts(nsqd, topic)
            assert len(counts) == 3 and sum(counts) == 61
            assert counts[0] >= 10  # every connection carried a share

            threads = [
                threading.Thread(target=lambda: [p.publish(topic, b"t") for _ in range(50)])
                for _ in range(12)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
            counts = pub_counts(nsqd, topic)
            assert sum(counts) == 61 + 600 and counts[0] >= 61 // 3 + 50


def test_publishes_spread_over_the_pool_embedded() -> None:
    with running_nsqd() as (server, _), Producer(server.tcp_address, connections_per_nsqd=3) as p:
        topic = unique()
        p.publish(topic, b"warm")
        wait_for(lambda: all_connected(p, 3), what="3 connections")
        before = [c.bytes_sent for c in p.stats().connections]
        for i in range(60):
            p.publish(topic, b"%d" % i)
        after = [c.bytes_sent for c in p.stats().connections]
        pub = len(f"PUB {topic}\n") + 4 + 2  # one PUB of a 2-byte body
        assert all(b - a >= 10 * pub for a, b in zip(before, after, strict=True))


@needs_real
def test_failover_with_a_pool_per_nsqd_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = unique()
        addresses = [first.tcp_address, second.tcp_address]
        with Producer(addresses, connections_per_nsqd=3, timeout=10) as p:
            wait_for(lambda: all_connected(p, 6), what="6 connections")
            for _ in range(12):
                p.publish(topic, b"warm")
            first.kill()
            futures = [p.publish_async(topic, b"%d" % i) for i in range(300)]
            assert all(f.exception(15) is None for f in futures)
            sync = [p.publish(topic, b"s") for _ in range(30)]  # one by one, after the loss
            assert sync == [None] * 30
        stored = second.topic_stats(topic)
        assert stored is not None and stored["message_count"] >= 300 + 30


def _in_order(address: str) -> None:
    topic = unique()
    with Producer(address, connections_per_nsqd=4) as p:
        p.publish(topic, b"first")
        wait_for(lambda: all_connected(p, 4), what="4 connections")
        for i in range(200):  # each waits for its answer before the next is sent
            p.publish(topic, b"%d" % i)
    with Consumer(topic, "c", nsqd=[address], max_in_flight=50) as consumer:
        got = []
        for msg in consumer:
            got.append(msg.body)
            msg.finish()
            if len(got) == 201:
                break
    assert got == [b"first"] + [b"%d" % i for i in range(200)]


@needs_real
def test_one_callers_sequential_publishes_stay_in_order_real() -> None:
    with RealNSQD() as nsqd:
        _in_order(nsqd.tcp_address)


def test_one_callers_sequential_publishes_stay_in_order_embedded() -> None:
    with running_nsqd() as (server, _):
        _in_order(server.tcp_address)

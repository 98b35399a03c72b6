"""The anyio Producer's ``connections_per_nsqd``: publishes spread over the connections,
failover unchanged, a caller's sequential publishes stay in order. Real nsqd (skipped without
the binaries) and the embedded broker; asyncio and trio."""

from __future__ import annotations

import uuid

import anyio
import pytest

from nsq_sansio.errors import ConfigError
from transports.anyio import Consumer, Producer
from transports.embedded import EmbeddedNSQD
from transports.testing.real_nsq import RealNSQD, find_binaries

pytestmark = pytest.mark.anyio

needs_real = pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found")


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def pub_counts(nsqd: RealNSQD, topic: str) -> list[int]:
    """PUBs per client connection, as the real nsqd counts them."""
    counts = []
    for client in nsqd.stats().get("producers") or ():
        for entry in client.get("pub_counts") or ():
            if entry["topic"] == topic:
                counts.append(int(entry["count"]))
    return sorted(counts)


@pytest.mark.parametrize("value", [0, 65, 2.0, True])
async def test_connections_per_nsqd_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match="connections_per_nsqd"):
        Producer("127.0.0.1:4150", connections_per_nsqd=value)  # type: ignore[arg-type]


@needs_real
async def test_publishes_spread_over_the_pool_real() -> None:
    with RealNSQD() as nsqd:
        topic = fresh()
        async with Producer(nsqd.tcp_address, connections_per_nsqd=3) as p:
            for i in range(60):  # one caller, one by one: round robin
                await p.publish(topic, b"%d" % i)
            counts = pub_counts(nsqd, topic)
            assert len(counts) == 3 and sum(counts) == 60 and counts[0] >= 10

            async def caller() -> None:
                for _ in range(50):
                    await p.publish(topic, b"t")

            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(caller)
            counts = pub_counts(nsqd, topic)
            assert sum(counts) == 660 and counts[0] >= 20 + 50
            assert len(p.stats().connections) == 3


async def test_publishes_spread_over_the_pool_embedded(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    async with Producer(nsqd.tcp_address, connections_per_nsqd=3) as p:
        for i in range(60):
            await p.publish(topic, b"%d" % i)
        sent = [c.bytes_sent for c in p.stats().connections]
    pub = len(f"PUB {topic}\n") + 4 + 2  # one PUB of a 2-byte body
    assert len(sent) == 3 and all(b >= 10 * pub for b in sent)


@needs_real
async def test_failover_with_a_pool_per_nsqd_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = fresh()
        addresses = [first.tcp_address, second.tcp_address]
        async with Producer(addresses, connections_per_nsqd=3, timeout=10) as p:
            for _ in range(12):
                await p.publish(topic, b"warm")
            assert sum(c.connected for c in p.stats().connections) == 6
            first.kill()
            with anyio.fail_after(15):
                async with anyio.create_task_group() as tg:
                    for i in range(300):
                        tg.start_soon(p.publish, topic, b"%d" % i)
                for _ in range(30):
                    await p.publish(topic, b"s")
        stored = second.topic_stats(topic)
        assert stored is not None and stored["message_count"] >= 300 + 30


async def _in_order(address: str) -> None:
    topic = fresh()
    async with Producer(address, connections_per_nsqd=4) as p:
        for i in range(200):  # each waits for its answer before the next is sent
            await p.publish(topic, b"%d" % i)
        assert sum(c.connected for c in p.stats().connections) == 4
    got: list[bytes] = []
    async with Consumer(topic, "c", nsqd=[address], max_in_flight=50) as consumer:
        with anyio.fail_after(10):
            async for msg in consumer:
                got.append(msg.body)
                await msg.finish()
                if len(got) == 200:
                    break
    assert got == [b"%d" % i for i in range(200)]


@needs_real
async def test_one_callers_sequential_publishes_stay_in_order_real() -> None:
    with RealNSQD() as nsqd:
        await _in_order(nsqd.tcp_address)


async def test_one_callers_sequential_publishes_stay_in_order_embedded(nsqd: EmbeddedNSQD) -> None:
    await _in_order(nsqd.tcp_address)

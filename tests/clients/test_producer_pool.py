"""The Producer's ``connections_per_nsqd`` on every runtime: publishes spread over the
connections, failover unchanged, a caller's sequential publishes stay in order. Real nsqd
(skipped without the binaries) and the embedded broker."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from support.brokers import needs_real, pub_counts, running_nsqd, unique
from support.runtimes import ProducerDriver, Runtime

from nsq_sansio.errors import ConfigError
from transports.embedded import EmbeddedNSQD
from transports.testing.real_nsq import RealNSQD

pytestmark = pytest.mark.anyio


def all_connected(p: ProducerDriver, count: int) -> bool:
    connections = p.stats().connections
    return len(connections) == count and all(c.connected for c in connections)


async def warm_up(p: ProducerDriver, topic: str, count: int) -> None:
    """One publish per connection (the anyio pool connects a connection when it is first
    picked, the blocking one all at once), then until all ``count`` are connected."""
    for i in range(count):
        await p.publish(topic, b"warm%d" % i)
    with anyio.fail_after(10):
        while not all_connected(p, count):
            await anyio.sleep(0.01)


@pytest.mark.parametrize("value", [0, -1, 65, 1.5, 2.0, True, "2"])
async def test_connections_per_nsqd_is_checked(value: object, runtime: Runtime) -> None:
    with pytest.raises(ConfigError, match="connections_per_nsqd"):
        runtime.module.Producer("127.0.0.1:4150", connections_per_nsqd=value)


@pytest.mark.parametrize("value", [None, 1, "yes"])
async def test_coalesce_is_checked(value: object, runtime: Runtime) -> None:
    with pytest.raises(ConfigError, match="coalesce"):
        runtime.module.Producer("127.0.0.1:4150", coalesce=value)


@needs_real
async def test_publishes_spread_over_the_pool_real(runtime: Runtime) -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        async with runtime.producer(nsqd.tcp_address, connections_per_nsqd=3) as p:
            await warm_up(p, topic, 3)
            for i in range(60):  # one caller, one by one: round robin
                await p.publish(topic, b"%d" % i)
            counts = await anyio.to_thread.run_sync(pub_counts, nsqd, topic)
            assert len(counts) == 3 and sum(counts) == 63
            assert counts[0] >= 10  # every connection carried a share

            async def caller() -> None:
                for _ in range(50):
                    await p.publish(topic, b"t")

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for _ in range(12):  # 12 callers at once, each one by one
                        tg.start_soon(caller)
            counts = await anyio.to_thread.run_sync(pub_counts, nsqd, topic)
            assert sum(counts) == 63 + 600 and counts[0] >= 63 // 3 + 50
            assert len(p.stats().connections) == 3


async def test_publishes_spread_over_the_pool_embedded(
    nsqd: EmbeddedNSQD, runtime: Runtime
) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address, connections_per_nsqd=3) as p:
        await warm_up(p, topic, 3)
        before = [c.bytes_sent for c in p.stats().connections]
        for i in range(60):
            await p.publish(topic, b"%d" % i)
        after = [c.bytes_sent for c in p.stats().connections]
    pub = len(f"PUB {topic}\n") + 4 + 2  # one PUB of a 2-byte body
    assert len(after) == 3
    assert all(b - a >= 10 * pub for a, b in zip(before, after, strict=True))


@needs_real
async def test_failover_with_a_pool_per_nsqd_real(runtime: Runtime) -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = unique()
        addresses = [first.tcp_address, second.tcp_address]
        async with runtime.producer(addresses, connections_per_nsqd=3, timeout=10) as p:
            for _ in range(12):
                await p.publish(topic, b"warm")
            assert sum(c.connected for c in p.stats().connections) == 6
            first.kill()
            outcomes = await p.concurrently(
                [("publish", (topic, b"%d" % i)) for i in range(300)], timeout=15
            )
            assert outcomes == [None] * 300
            for _ in range(30):  # one by one, after the loss
                await p.publish(topic, b"s", timeout=15)
        stored = second.topic_stats(topic)
        assert stored is not None and stored["message_count"] >= 300 + 30


async def _in_order(runtime: Runtime, address: str) -> None:
    topic = unique()
    async with runtime.producer(address, connections_per_nsqd=4) as p:
        await warm_up(p, topic, 4)
        for i in range(200):  # each waits for its answer before the next is sent
            await p.publish(topic, b"%d" % i)
        assert sum(c.connected for c in p.stats().connections) == 4
    async with runtime.consumer(topic, "c", nsqd=[address], max_in_flight=50) as consumer:
        got = await consumer.bodies(204, timeout=10)
    assert got == [b"warm%d" % i for i in range(4)] + [b"%d" % i for i in range(200)]


@needs_real
async def test_one_callers_sequential_publishes_stay_in_order_real(runtime: Runtime) -> None:
    with RealNSQD() as nsqd:
        await _in_order(runtime, nsqd.tcp_address)


async def test_one_callers_sequential_publishes_stay_in_order_embedded(runtime: Runtime) -> None:
    with running_nsqd() as (server, _):
        await _in_order(runtime, server.tcp_address)

"""anyio transport against the embedded broker over loopback: publish/consume and features.

Every test runs on asyncio and on trio (the ``anyio_backend`` fixture).
"""

from __future__ import annotations

import uuid

import anyio
import pytest

from transports.anyio import (
    Consumer,
    NoNSQDAvailable,
    Producer,
)
from transports.embedded import EmbeddedNSQD

from .conftest import channel_stats

pytestmark = pytest.mark.anyio


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def collect(consumer: Consumer, count: int, timeout: float = 10.0) -> list[bytes]:
    bodies: list[bytes] = []
    with anyio.fail_after(timeout):
        async for msg in consumer:
            bodies.append(msg.body)
            await msg.finish()
            if len(bodies) >= count:
                break
    return bodies


async def test_producer_failover_and_back_pressure(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    dead = "127.0.0.1:1"  # nothing listens there
    peak = 0
    async with Producer([dead, nsqd.tcp_address], max_pending=2, connect_timeout=1) as p:

        async def watch() -> None:
            nonlocal peak
            while True:  # sampled at every scheduler turn
                peak = max(peak, p.stats().pending)
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as outer:
            outer.start_soon(watch)
            async with anyio.create_task_group() as tg:
                for i in range(30):
                    tg.start_soon(p.publish, topic, b"%d" % i)
            outer.cancel_scope.cancel()
        stats = p.stats()
    assert 1 <= peak <= 2  # back-pressure: never more than max_pending awaiting an answer
    assert stats.published == 30
    assert stats.pending == 0
    ch = await channel_stats(nsqd, topic, "ch")
    assert ch == {}  # no channel yet; count through a consumer instead
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=30) as c:
        assert len(set(await collect(c, 30))) == 30


async def test_producer_with_no_reachable_nsqd() -> None:
    async with Producer(["127.0.0.1:1"], connect_timeout=1, timeout=5) as p:
        with pytest.raises(NoNSQDAvailable):
            await p.publish("t", b"x")

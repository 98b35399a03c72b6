"""Readers sharing one anyio consumer: wake-ups go one at a time, yet nobody is starved."""

from __future__ import annotations

import uuid

import anyio
import pytest
from support.runtimes import wait_channel

from transports.anyio import Consumer, Message, Producer
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


def fresh(prefix: str = "r") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(address) as p:
        await p.multi_publish(topic, bodies)


async def test_run_reaches_its_concurrency_with_handlers_that_wait(nsqd: EmbeddedNSQD) -> None:
    # A batch wakes one worker, which wakes the next as it takes a message: handlers that
    # wait must still all run at once, up to `concurrency`.
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(12)])
    running = 0
    peak = 0
    gate = anyio.Event()
    handled: list[bytes] = []
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=12) as c:

        async def handler(msg: Message) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            if running == 6:
                gate.set()
            await gate.wait()
            running -= 1
            handled.append(msg.body)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.run(handler, concurrency=6))
            with anyio.fail_after(10):
                await gate.wait()
                while len(handled) < 12:
                    await anyio.sleep(0.01)
            await c.drain(timeout=5)
    assert peak == 6
    assert sorted(handled) == sorted(b"%d" % i for i in range(12))
    assert c.stats().finished == 12


async def test_readers_cancelled_midway_strand_nothing(nsqd: EmbeddedNSQD) -> None:
    # Four `async for` readers; two are cancelled (while waiting or right after a wake-up)
    # once they took a few messages. The other two still get every message left.
    topic = fresh()
    total = 80
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(total)])
    seen: list[bytes] = []
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=7) as c:

        async def reader(quota: int | None, scope: anyio.CancelScope) -> None:
            with scope:
                taken = 0
                async for msg in c:
                    seen.append(msg.body)
                    await msg.finish()
                    taken += 1
                    if quota is not None and taken >= quota:
                        scope.cancel()  # cancelled at its next wait
                    await anyio.sleep(0)

        scopes = [anyio.CancelScope() for _ in range(4)]
        async with anyio.create_task_group() as tg:
            for quota, scope in zip((3, 5, None, None), scopes, strict=True):
                tg.start_soon(reader, quota, scope)
            with anyio.fail_after(15):
                while len(seen) < total:
                    await anyio.sleep(0.01)
            for scope in scopes:
                scope.cancel()
    assert sorted(seen) == sorted(b"%d" % i for i in range(total))
    await wait_channel(nsqd, topic, "ch", lambda ch: ch.get("in_flight_count") == 0)

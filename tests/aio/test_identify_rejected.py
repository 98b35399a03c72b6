"""Issue 12.4 on the anyio transport (asyncio and trio): a configuration nsqd refuses at
IDENTIFY fails the consumer once, clearly (IdentifyRejected with nsqd's message), instead of
reconnecting forever; against the embedded nsqd and the real one (skipped without the
binaries)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from nsq_sansio.consumer import ConsumerFailed, Disconnected
from nsq_sansio.errors import IdentifyRejected
from transports.anyio import Consumer, Message
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.real_nsq import RealNSQD, find_binaries

pytestmark = pytest.mark.anyio

KINDS = [
    "embedded",
    pytest.param(
        "real",
        marks=pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found"),
    ),
]

#: nsqd's --min-output-buffer-timeout is 25 ms: 10 ms is refused.
REFUSED = {"output_buffer_timeout": 0.01, "reconnect_delay": 0.05, "max_reconnect_delay": 0.1}
TEXT = "IDENTIFY output buffer timeout (10) is invalid"


@asynccontextmanager
async def broker(kind: str) -> AsyncIterator[str]:
    """An nsqd's TCP address (started and stopped on a thread: both block)."""
    if kind == "real":
        real = RealNSQD()
        await anyio.to_thread.run_sync(real.start)
        try:
            yield real.tcp_address
        finally:
            await anyio.to_thread.run_sync(real.close)
    else:
        thread = ServerThread(EmbeddedNSQD())
        server = await anyio.to_thread.run_sync(thread.start)
        try:
            yield server.tcp_address
        finally:
            await anyio.to_thread.run_sync(thread.stop)


def topic() -> str:
    return f"refused{uuid.uuid4().hex[:10]}"


async def check(error: IdentifyRejected, events: list[object]) -> None:
    assert error.code == "E_BAD_BODY" and error.text == TEXT
    assert TEXT in str(error)
    # One connection, one refusal: after it nothing is retried (reconnect_delay is 50 ms).
    await anyio.sleep(0.3)
    assert len([e for e in events if isinstance(e, Disconnected)]) == 1
    assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1


@pytest.mark.parametrize("kind", KINDS)
async def test_iteration_raises_the_refusal(kind: str) -> None:
    events: list[object] = []
    async with broker(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with Consumer(
                topic(), "ch", nsqd=[address], on_event=events.append, **REFUSED
            ) as consumer:
                async for _ in consumer:
                    raise AssertionError("no message can come")
        await check(info.value, events)
        with pytest.raises(IdentifyRejected):  # every later ask says the same
            await consumer.__anext__()


@pytest.mark.parametrize("kind", KINDS)
async def test_run_raises_the_refusal(kind: str) -> None:
    events: list[object] = []

    async def handler(message: Message) -> None:
        raise AssertionError("no message can come")

    async with broker(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with Consumer(
                topic(), "ch", nsqd=[address], on_event=events.append, **REFUSED
            ) as consumer:
                await consumer.run(handler, concurrency=4)
        await check(info.value, events)


@pytest.mark.parametrize("kind", KINDS)
async def test_fetch_raises_the_refusal(kind: str) -> None:
    events: list[object] = []
    async with broker(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with Consumer(
                topic(), "ch", nsqd=[address], pull=True, on_event=events.append, **REFUSED
            ) as consumer:
                while True:
                    assert await consumer.fetch(5, timeout=1.0) == []
        await check(info.value, events)


async def test_leaving_the_block_raises_a_refusal_nobody_waited_for() -> None:
    events: list[object] = []
    async with broker("embedded") as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected, match=r"timeout \(10\)"):
            async with Consumer(topic(), "ch", nsqd=[address], on_event=events.append, **REFUSED):
                while not any(isinstance(e, ConsumerFailed) for e in events):
                    await anyio.sleep(0.01)
        assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1

"""On every runtime: a configuration nsqd refuses at IDENTIFY fails the consumer
once, clearly (IdentifyRejected with nsqd's message), instead of reconnecting forever; against
the embedded nsqd and the real one (skipped without the binaries)."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from support.brokers import BROKER_KINDS, started_nsqd, unique
from support.runtimes import Runtime

from nsq_sansio.consumer import ConsumerFailed, Disconnected
from nsq_sansio.errors import IdentifyRejected

pytestmark = pytest.mark.anyio

#: nsqd's --min-output-buffer-timeout is 25 ms: 10 ms is refused.
REFUSED = {"output_buffer_timeout": 0.01, "reconnect_delay": 0.05, "max_reconnect_delay": 0.1}
TEXT = "IDENTIFY output buffer timeout (10) is invalid"


async def check(error: IdentifyRejected, events: list[object]) -> None:
    assert error.code == "E_BAD_BODY" and error.text == TEXT
    assert TEXT in str(error)
    # One connection, one refusal: after it nothing is retried (reconnect_delay is 50 ms).
    await anyio.sleep(0.3)
    assert len([e for e in events if isinstance(e, Disconnected)]) == 1
    assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1


def no_message(message: object) -> None:
    raise AssertionError("no message can come")


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_iteration_and_get_raise_the_refusal(kind: str, runtime: Runtime) -> None:
    events: list[object] = []
    with started_nsqd(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with runtime.consumer(
                unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED
            ) as consumer:
                async for message in consumer.messages():
                    no_message(message)
        await check(info.value, events)
        with pytest.raises(IdentifyRejected):  # every later ask says the same
            await consumer.get(timeout=1.0)


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_run_raises_the_refusal(kind: str, runtime: Runtime) -> None:
    events: list[object] = []
    with started_nsqd(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with runtime.consumer(
                unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED
            ) as consumer:
                await consumer.run(no_message, workers=4)
        await check(info.value, events)


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_fetch_raises_the_refusal(kind: str, runtime: Runtime) -> None:
    events: list[object] = []
    with started_nsqd(kind) as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected) as info:
            async with runtime.consumer(
                unique(), "ch", nsqd=[address], pull=True, on_event=events.append, **REFUSED
            ) as consumer:
                while True:
                    assert await consumer.fetch(5, timeout=1.0) == []
        await check(info.value, events)


async def test_leaving_the_block_raises_a_refusal_nobody_waited_for(runtime: Runtime) -> None:
    events: list[object] = []
    with started_nsqd("embedded") as address:
        with anyio.fail_after(20), pytest.raises(IdentifyRejected, match=r"timeout \(10\)"):
            async with runtime.consumer(
                unique(), "ch", nsqd=[address], on_event=events.append, **REFUSED
            ):
                while not any(isinstance(e, ConsumerFailed) for e in events):
                    await anyio.sleep(0.01)
        assert len([e for e in events if isinstance(e, ConsumerFailed)]) == 1

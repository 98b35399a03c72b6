"""On every runtime: max_in_flight bounds what the user holds when an nsqd joins,
against two embedded nsqd and against two real ones (skipped without the binaries).

The user holds all 10 messages of nsqd A; nsqd B comes up with messages. Before the fix B got
RDY (its share, 5) while A's 10 were still in flight: 15 held. Now B gets budget only as A's
messages are answered, and everything is still consumed.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest
from support.brokers import BROKER_KINDS, LateBroker, unique
from support.runtimes import Runtime

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_joining_nsqd_never_takes_the_held_messages_over_max_in_flight(
    kind: str, runtime: Runtime
) -> None:
    topic, channel = unique("held"), "ch"
    a, b = LateBroker(kind), LateBroker(kind)
    run = anyio.to_thread.run_sync
    try:
        await run(a.start)
        await run(a.publish, topic, 30, "a")
        async with runtime.consumer(
            topic,
            channel,
            nsqd=[a.tcp_address, b.tcp_address],  # B is down: retried every 0.1-0.2 s
            max_in_flight=10,
            reconnect_delay=0.1,
            max_reconnect_delay=0.2,
            msg_timeout=300.0,  # nothing times out on a loaded machine
        ) as consumer:
            with anyio.fail_after(60):
                held = []
                for _ in range(10):
                    message = await consumer.get(timeout=10)
                    assert message is not None, f"only {len(held)} of A's 10 came"
                    held.append(message)
                await run(b.start)
                await run(b.publish, topic, 30, "b")
                while consumer.stats().connected < 2:  # B subscribed
                    await anyio.sleep(0.02)
                # The user holds 10 and answers nothing for a second: B gets no message, on
                # nsqd's own count and on the library's.
                until = anyio.current_time() + 1.0
                while anyio.current_time() < until:
                    assert consumer.stats().in_flight <= 10, consumer.stats()
                    in_a = await run(a.in_flight, topic, channel)
                    in_b = await run(b.in_flight, topic, channel)
                    assert in_a + in_b <= 10, (in_a, in_b)
                    await anyio.sleep(0.05)
                assert await run(b.in_flight, topic, channel) == 0
                assert all(m.body.startswith(b"a-") for m in held)
                # Answering returns the budget: B's messages come, never more than 10 held.
                for message in held:
                    assert await consumer.finish(message)
                    assert consumer.stats().in_flight <= 10
                seen = {m.body for m in held}
                while len(seen) < 60:
                    message = await consumer.get(timeout=10)
                    assert message is not None, f"only {len(seen)} of 60 consumed"
                    assert consumer.stats().in_flight <= 10
                    seen.add(message.body)
                    assert await consumer.finish(message)
                assert sum(body.startswith(b"b-") for body in seen) == 30
    finally:
        await run(a.close)
        await run(b.close)

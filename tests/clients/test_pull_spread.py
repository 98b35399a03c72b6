"""Pull mode over two nsqd on every runtime: a fetch asked as the consumer starts (before
the second connection is subscribed) is filled from both at once, against two embedded nsqd
and two real ones (skipped without the binaries).

Before the fix it took 10-15 s on the anyio transport (its timer slept through the settle
times the core set while reading, so each step of moving the share waited for the fetch's
own timeout) and 2.3 s on the blocking one (the nsqd that had sent all it had kept counting as
active and kept half of the share at every step).
"""

from __future__ import annotations

import time

import anyio
import anyio.to_thread
import pytest
from support.brokers import BROKER_KINDS, LateBroker, unique
from support.runtimes import Runtime

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_fetch_at_start_is_filled_from_both_nsqd_at_once(
    kind: str, runtime: Runtime
) -> None:
    topic = unique("spread")
    a, b = LateBroker(kind), LateBroker(kind)
    run = anyio.to_thread.run_sync
    try:
        await run(a.start)
        await run(b.start)
        await run(a.publish, topic, 100, "a")
        await run(b.publish, topic, 100, "b")
        async with runtime.consumer(
            topic, "ch", nsqd=[a.tcp_address, b.tcp_address], pull=True, max_in_flight=200
        ) as consumer:
            started = time.monotonic()
            got = await consumer.fetch(200, timeout=8.0)
            took = time.monotonic() - started
            assert len(got) == 200, (len(got), took)
            assert {m.body[:2] for m in got} == {b"a-", b"b-"}
            assert took < 4.0, took  # about 1 s here; one fetch timeout (8 s) before the fix
            for message in got:
                assert await consumer.finish(message)
    finally:
        await run(a.close)
        await run(b.close)

"""After nsqd refuses a publish it closes the connection; that connection worked, so the
producer reconnects at once (backoff is for connections that fail to open): the next
publish, and the refusing nsqd's share of the following ones, are stored without waiting
for a reconnect delay (1 s by default). Measured on every runtime, against the real nsqd and
the embedded one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import anyio
import pytest
from support.brokers import BROKER_KINDS, embedded_topic_count, running_nsqd, topic_count, unique
from support.runtimes import Runtime

from nsq_sansio.errors import BadMessage, NoNSQDAvailable
from transports.testing.real_nsq import RealNSQD, free_port

pytestmark = pytest.mark.anyio

#: Far above a reconnect on loopback (a few ms), below the reconnect delay's shortest draw
#: (1 s less its 30% jitter): the bound a producer waiting for its backoff cannot meet.
BOUND = 0.5
#: A body over the brokers' --max-msg-size.
TOO_BIG = b"B" * 2000


@contextmanager
def _brokers(kind: str, count: int) -> Iterator[list[tuple[str, Callable[[str], int]]]]:
    """``count`` nsqd refusing bodies over 1 KiB: (TCP address, topic -> messages stored)."""
    with ExitStack() as stack:
        made: list[tuple[str, Callable[[str], int]]] = []
        for _ in range(count):
            if kind == "real":
                real = stack.enter_context(RealNSQD(["--max-msg-size=1024"]))
                made.append((real.tcp_address, lambda topic, real=real: topic_count(real, topic)))
            else:
                server, runner = stack.enter_context(running_nsqd(max_msg_size=1024))
                made.append(
                    (
                        server.tcp_address,
                        lambda topic, runner=runner: embedded_topic_count(runner, topic),
                    )
                )
        yield made


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_the_next_publish_after_a_refusal_is_stored_at_once(
    runtime: Runtime, kind: str
) -> None:
    topic = unique()
    with _brokers(kind, 1) as [(address, stored)]:
        async with runtime.producer(address) as p:
            await p.publish(topic, b"warm")
            for i in range(3):  # a refusal does not add up to a longer wait either
                with pytest.raises(BadMessage):
                    await p.publish(topic, TOO_BIG)
                refused = time.monotonic()
                await p.publish(topic, b"next %d" % i, timeout=5)
                elapsed = time.monotonic() - refused
                assert elapsed < BOUND, f"the publish after refusal {i} took {elapsed:.3f} s"
            # each refusal closed a connection that the next publish made again: the same
            # count on every runtime (connections made again, not attempts)
            assert p.stats().reconnects == 3
        assert await anyio.to_thread.run_sync(stored, topic) == 4


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_the_refusing_nsqd_gets_its_share_again_at_once(runtime: Runtime, kind: str) -> None:
    """Two nsqd: after one refused a publish, the publishes that follow (one at a time) are
    stored on both again within BOUND, not only on the other one until a reconnect delay."""
    topic = unique()
    with _brokers(kind, 2) as brokers:
        addresses = [address for address, _ in brokers]
        async with runtime.producer(addresses) as p:

            def counts() -> list[int]:
                return [stored(topic) for _, stored in brokers]

            for i in range(100):  # until both are connected and used
                await p.publish(topic, b"warm %d" % i)
                before = await anyio.to_thread.run_sync(counts)
                if all(before):
                    break
            assert all(before), before
            with pytest.raises(BadMessage):
                await p.publish(topic, TOO_BIG)
            refused = time.monotonic()
            sent = 0
            while True:
                await p.publish(topic, b"after %d" % sent, timeout=5)
                sent += 1
                now = await anyio.to_thread.run_sync(counts)
                elapsed = time.monotonic() - refused
                if all(after > first for after, first in zip(now, before, strict=True)):
                    break
                assert elapsed < BOUND, (
                    f"{sent} publishes in {elapsed:.3f} s after the refusal all went to one nsqd: "
                    f"{before} -> {now}"
                )


async def test_attempts_that_never_connect_are_not_reconnects(runtime: Runtime) -> None:
    """``reconnects`` counts connections made again after one was up, the same on every
    runtime: attempts refused while nsqd is down are not reconnects, and the first connection
    made after them is not one either."""
    address = f"127.0.0.1:{free_port()}"
    topic = unique()
    async with runtime.producer(address, reconnect_delay=0.05, max_reconnect_delay=0.1) as p:
        for _ in range(3):
            with pytest.raises(NoNSQDAvailable):
                await p.publish(topic, b"nobody there", timeout=2)
            await anyio.sleep(0.15)  # past the reconnect delay: the next publish tries again
        with running_nsqd(tcp_address=address) as (_, runner):
            await p.publish(topic, b"first connection", timeout=5)
            assert p.stats().reconnects == 0
            assert await anyio.to_thread.run_sync(embedded_topic_count, runner, topic) == 1

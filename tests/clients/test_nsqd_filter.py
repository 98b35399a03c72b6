"""On every runtime: a lookupd that lists an nsqd the consumer did not expect.

Two embedded nsqd register with one embedded nsqlookupd; the consumer trusts only the first
(``nsqd_filter=allow_nsqd(...)``). It connects to that one alone, consumes only its messages,
and reports the other once (a ``NodeRefused`` event and a warning naming it), whereas without
the filter it would connect to whatever the lookupd lists.
"""

from __future__ import annotations

import logging

import anyio
import anyio.to_thread
import pytest
from support.brokers import running_cluster, unique
from support.runtimes import Runtime

from nsq_sansio.consumer import NodeRefused
from nsq_sansio.discovery import allow_nsqd

pytestmark = pytest.mark.anyio


async def test_a_consumer_connects_only_to_the_nsqd_its_filter_accepts(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    topic = unique("filtered")
    with running_cluster(2) as runner:
        cluster = runner.server
        trusted, unexpected = cluster.nsqds
        for nsqd, tag in ((trusted, b"trusted"), (unexpected, b"unexpected")):
            async with runtime.producer(nsqd.tcp_address) as producer:
                await producer.multi_publish(topic, [tag + b"-%d" % i for i in range(5)])
        await anyio.to_thread.run_sync(cluster.wait_registered_blocking, topic, 2)
        events: list[object] = []
        async with runtime.consumer(
            topic,
            "c",
            lookupd=cluster.lookupd_http_urls,
            nsqd_filter=allow_nsqd(trusted.tcp_address),
            max_in_flight=10,
            on_event=events.append,
        ) as consumer:
            bodies = await consumer.bodies(5, timeout=20)
            assert consumer.stats().connected == 1
            assert await consumer.get(timeout=0.5) is None  # nothing from the other one
            stats = consumer.stats()
    assert sorted(bodies) == [b"trusted-%d" % i for i in range(5)]
    assert [c.address for c in stats.connections] == [trusted.tcp_address]
    refused = [e for e in events if isinstance(e, NodeRefused)]
    assert [str(e.address) for e in refused] == [unexpected.tcp_address]
    assert f"lookupd listed nsqd {unexpected.tcp_address}; nsqd_filter refused it" in caplog.text

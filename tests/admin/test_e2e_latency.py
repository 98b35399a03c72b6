"""End-to-end latency percentiles: present when nsqd measures them (the real nsqd with
``--e2e-processing-latency-percentile``), None otherwise (the embedded nsqd never does)."""

from __future__ import annotations

import anyio
import pytest

from ._wire import Wire, publish
from .conftest import AdminRuntime, Brokers, real_brokers

pytestmark = pytest.mark.anyio


async def test_percentiles_when_nsqd_measures_them(runtime: AdminRuntime) -> None:
    with real_brokers("--e2e-processing-latency-percentile=0.99,0.5") as real:
        publish(real.nsqd_tcp, "adm_e2e", [b"a", b"b", b"c"])
        async with runtime.nsqd(real.nsqd_http) as nsqd:
            await nsqd.create_channel("adm_e2e", "timed")
            with Wire(real.nsqd_tcp) as consumer:
                consumer.subscribe("adm_e2e", "timed")
                consumer.rdy(3)
                for message_id in [consumer.message_id() for _ in range(3)]:
                    consumer.finish(message_id)
                with anyio.fail_after(10):
                    while True:
                        chan = await nsqd.channel_stats("adm_e2e", "timed")
                        if chan.e2e_latency is not None and chan.e2e_latency.count == 3:
                            break
                        await anyio.sleep(0.01)
            assert [p.quantile for p in chan.e2e_latency.percentiles] == [0.99, 0.5]
            p99 = chan.e2e_latency.percentile(0.99)
            assert p99 is not None and 0 < p99 < 60  # seconds, not nanoseconds
            topic = await nsqd.topic_stats("adm_e2e")
            assert topic.e2e_latency is not None and topic.e2e_latency.count == 3


async def test_no_percentiles_by_default(runtime: AdminRuntime, brokers: Brokers) -> None:
    publish(brokers.nsqd_tcp, "adm_e2e", [b"a"])
    async with runtime.nsqd(brokers.nsqd_http) as nsqd:
        await nsqd.create_channel("adm_e2e", "timed")
        chan = await nsqd.channel_stats("adm_e2e", "timed")
        assert chan.e2e_latency is None
        assert (await nsqd.topic_stats("adm_e2e")).e2e_latency is None

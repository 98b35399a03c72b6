"""Every client names itself to nsqd as go-nsq does: IDENTIFY's ``client_id`` is the short
host name and ``hostname`` the full one unless the user sets them, so nsqd's ``/stats`` (and
nsqadmin) tell clients apart. Read back from the real nsqd and the embedded one, for a
consumer and a producer of every runtime.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
from support.brokers import BROKER_KINDS, find_channel, get_json, running_nsqd, unique
from support.runtimes import Runtime

from transports.testing.real_nsq import RealNSQD

pytestmark = pytest.mark.anyio


@contextmanager
def _nsqd(kind: str) -> Iterator[tuple[str, str]]:
    """A running nsqd of ``kind``: (TCP address, HTTP URL)."""
    if kind == "real":
        with RealNSQD() as real:
            yield real.tcp_address, real.http_url
    else:
        with running_nsqd() as (server, _):
            yield server.tcp_address, server.http_url


async def _names_seen(runtime: Runtime, kind: str, **options: Any) -> list[tuple[str, str]]:
    """(client_id, hostname) nsqd shows for a consumer, then for a producer, of ``runtime``."""
    topic, channel = unique(), unique("c")
    with _nsqd(kind) as (address, http_url):
        async with (
            runtime.consumer(topic, channel, nsqd=[address], **options) as consumer,
            runtime.producer(address, **options) as producer,
        ):
            await producer.publish(topic, b"x")
            assert await consumer.bodies(1, timeout=10) == [b"x"]
            stats = await anyio.to_thread.run_sync(get_json, f"{http_url}/stats?format=json")
    entry = find_channel(stats, topic, channel)
    assert entry is not None, stats
    (consumer_client,) = entry["clients"]
    (producer_client,) = stats["producers"]
    return [
        (client["client_id"], client["hostname"]) for client in (consumer_client, producer_client)
    ]


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_clients_send_the_host_names_by_default(runtime: Runtime, kind: str) -> None:
    full = socket.gethostname()
    expected = (full.split(".")[0], full)
    assert expected[0] and expected[1]
    assert await _names_seen(runtime, kind) == [expected, expected]


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_the_names_can_be_set(runtime: Runtime, kind: str) -> None:
    names = {"client_id": "billing-7", "hostname": "billing-7.example.org"}
    seen = await _names_seen(runtime, kind, **names)
    assert seen == [(names["client_id"], names["hostname"])] * 2

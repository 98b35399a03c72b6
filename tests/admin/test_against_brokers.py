"""Every admin call against a live broker, on every runtime: the embedded one and the real
nsqd + nsqlookupd v1.3.0 run the same test bodies with the same expectations, so each call
gives the same result on both (the real one is skipped where its binaries are absent).

Messages are put in place with a raw protocol connection (:mod:`._wire`): published, held in
flight, deferred by a REQ with a delay, finished; the admin client then has to see exactly
that, and the lag has to add up.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest

from nsq_sansio.admin import (
    AdminHTTPError,
    ChannelNotFound,
    ChannelStats,
    TopicNotFound,
)
from nsq_sansio.errors import InvalidName
from transports.sync.admin import LookupdAdmin, NSQDAdmin

from ._wire import Wire, publish
from .conftest import AdminRuntime, Brokers

pytestmark = pytest.mark.anyio

T = TypeVar("T")


async def eventually(
    get: Callable[[], Awaitable[T]], ok: Callable[[T], bool], what: str, timeout: float = 10.0
) -> T:
    """``await get()`` until ``ok`` says yes (the broker applies some changes a moment after
    answering: a topic's messages reach its channels, a REQ lands, a registration arrives)."""
    deadline = anyio.current_time() + timeout
    while True:
        value = await get()
        if ok(value):
            return value
        if anyio.current_time() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout}s")
        await anyio.sleep(0.01)


async def raises(call: Awaitable[Any], kind: type[AdminHTTPError]) -> AdminHTTPError:
    with pytest.raises(AdminHTTPError) as raised:
        await call
    assert type(raised.value) is kind, raised.value
    return raised.value


def counts(chan: ChannelStats) -> tuple[int, ...]:
    return (chan.topic_depth, chan.depth, chan.in_flight_count, chan.deferred_count, chan.lag)


async def test_nsqd_topics_channels_stats_and_lag(runtime: AdminRuntime, brokers: Brokers) -> None:
    topic, channel = "adm_orders", "billing"
    async with runtime.nsqd(brokers.nsqd_http) as nsqd:
        await nsqd.ping()
        info = await nsqd.info()
        assert info.version == "1.3.0" and info.broadcast_address == "127.0.0.1"
        assert (info.tcp_port, info.http_port) == (brokers.nsqd_tcp_port, brokers.nsqd_http_port)
        assert (info.max_heartbeat_interval, info.max_output_buffer_timeout) == (60.0, 30.0)
        assert (info.max_output_buffer_size, info.max_deflate_level) == (65536, 6)

        # nothing exists yet: every call on the topic says so, and /stats is simply empty
        for call in (
            nsqd.delete_topic(topic),
            nsqd.empty_topic(topic),
            nsqd.pause_topic(topic),
            nsqd.unpause_topic(topic),
            nsqd.create_channel(topic, channel),
            nsqd.topic_stats(topic),
            nsqd.channel_stats(topic, channel),
        ):
            error = await raises(call, TopicNotFound)
            assert (error.status, error.message) == (404, "TOPIC_NOT_FOUND")
        assert (await nsqd.stats(topic)).topics == ()
        with pytest.raises(InvalidName):
            await nsqd.create_topic("no spaces")

        await nsqd.create_topic(topic)
        await nsqd.create_topic(topic)  # again: nothing changes
        await nsqd.create_channel(topic, channel)
        for call in (
            nsqd.delete_channel(topic, "nope"),
            nsqd.empty_channel(topic, "nope"),
            nsqd.pause_channel(topic, "nope"),
            nsqd.unpause_channel(topic, "nope"),
            nsqd.channel_stats(topic, "nope"),
        ):
            error = await raises(call, ChannelNotFound)
            assert (error.status, error.message) == (404, "CHANNEL_NOT_FOUND")

        def settled(count: int) -> Callable[[ChannelStats], bool]:
            # every one of ``count`` messages in the channel: the topic's depth is 0 as soon as
            # nsqd's topic pump took the last one, a moment before the channel has it
            return lambda chan: chan.topic_depth == 0 and chan.message_count == count

        async def chan() -> ChannelStats:
            return await nsqd.channel_stats(topic, channel)  # type: ignore[no-any-return]

        publish(brokers.nsqd_tcp, topic, [b"m%d" % i for i in range(5)])
        stats = await eventually(chan, settled(5), "5 published")
        assert counts(stats) == (0, 5, 0, 0, 5)
        assert (stats.message_count, stats.client_count, stats.paused) == (5, 0, False)

        with Wire(brokers.nsqd_tcp) as consumer:
            consumer.subscribe(topic, channel)
            consumer.rdy(2)
            first, second = consumer.message_id(), consumer.message_id()
            consumer.rdy(0)
            stats = await eventually(chan, lambda c: c.in_flight_count == 2, "2 in flight")
            assert counts(stats) == (0, 3, 2, 0, 5)  # delivered but not finished: still lag
            (client,) = stats.clients
            assert (client.state, client.in_flight_count, client.message_count) == (3, 2, 2)
            assert client.user_agent == "admin-tests/1" and client.client_id == "admin-tests"
            assert stats.client_count == 1

            consumer.requeue(first, 60_000)
            stats = await eventually(chan, lambda c: c.deferred_count == 1, "1 deferred")
            assert counts(stats) == (0, 3, 1, 1, 5) and stats.requeue_count == 1
            consumer.finish(second)
            # nsqd takes a FIN off the channel's in-flight count, then counts it on the client:
            # a read in between sees neither, so wait for both
            stats = await eventually(
                chan,
                lambda c: c.in_flight_count == 0 and c.clients[0].finish_count == 1,
                "1 finished",
            )
            assert counts(stats) == (0, 3, 0, 1, 4)

            await nsqd.pause_channel(topic, channel)
            assert (await chan()).paused
            publish(brokers.nsqd_tcp, topic, [b"more", b"more"])
            stats = await eventually(chan, lambda c: c.depth == 5, "2 more")
            assert counts(stats) == (0, 5, 0, 1, 6)
            await nsqd.unpause_channel(topic, channel)
            assert not (await chan()).paused

            # a paused topic keeps what is published: the channel's lag counts it
            await nsqd.pause_topic(topic)
            assert (await nsqd.topic_stats(topic)).paused
            publish(brokers.nsqd_tcp, topic, [b"held"] * 3)
            stats = await eventually(chan, lambda c: c.topic_depth == 3, "3 held")
            assert counts(stats) == (3, 5, 0, 1, 9)
            await nsqd.empty_topic(topic)  # drops what the topic holds, not its channels'
            stats = await eventually(chan, lambda c: c.topic_depth == 0, "topic emptied")
            assert counts(stats) == (0, 5, 0, 1, 6)
            await nsqd.unpause_topic(topic)
            assert not (await nsqd.topic_stats(topic)).paused

            consumer.rdy(1)
            held = consumer.message_id()
            consumer.rdy(0)
            stats = await eventually(chan, lambda c: c.in_flight_count == 1, "1 in flight")
            assert counts(stats) == (0, 4, 1, 1, 6)
            await nsqd.empty_channel(topic, channel)  # queued, in flight and deferred all go
            stats = await eventually(chan, lambda c: c.lag == 0, "channel emptied")
            assert counts(stats) == (0, 0, 0, 0, 0) and stats.message_count == 7
            consumer.finish(held)  # too late: nsqd answers E_FIN_FAILED, nothing changes

            whole = await nsqd.stats(include_memory=True)
            assert [t.name for t in whole.topics] == [topic] and whole.memory is not None
            assert whole.health == "OK" and whole.version == "1.3.0"
            lean = await nsqd.stats(topic, channel, include_clients=False)
            assert lean.memory is None and lean.producers == ()
            lean_chan = lean.channel(topic, channel)
            assert lean_chan is not None and lean_chan.clients == ()
            assert lean_chan.client_count == 1

            await nsqd.delete_channel(topic, channel)
            assert consumer.closed_by_broker()  # its consumers are disconnected
        await raises(nsqd.channel_stats(topic, channel), ChannelNotFound)
        assert (await nsqd.topic_stats(topic)).channels == ()
        await nsqd.delete_topic(topic)
        await raises(nsqd.topic_stats(topic), TopicNotFound)

        # a topic with no channel keeps what is published; its first channel gets all of it
        publish(brokers.nsqd_tcp, "adm_early", [b"early"] * 3)
        assert (await nsqd.topic_stats("adm_early")).depth == 3
        await nsqd.create_channel("adm_early", "first")
        # the lag counts the backlog wherever it is, in the topic or in the channel (a read
        # while nsqd's pump holds one between the two is retried; a lag that stays short fails)
        first = await eventually(
            lambda: nsqd.channel_stats("adm_early", "first"), lambda c: c.lag == 3, "lag"
        )
        first = await eventually(
            lambda: nsqd.channel_stats("adm_early", "first"), settled(3), "backlog moved"
        )
        assert counts(first) == (0, 3, 0, 0, 3)
        await nsqd.create_channel("adm_early", "second")
        assert counts(await nsqd.channel_stats("adm_early", "second")) == (0, 0, 0, 0, 0)

    # the server's own refusals keep its status and message: here, nsqlookupd has no /stats
    async with runtime.nsqd(brokers.lookupd_http) as wrong:
        error = await raises(wrong.stats(), AdminHTTPError)
        assert (error.status, error.message) == (404, "NOT_FOUND")


async def test_lookupd_registry_tombstones_and_deletion(
    runtime: AdminRuntime, brokers: Brokers
) -> None:
    topic, channel = "adm_events", "archive"
    async with (
        runtime.lookupd(brokers.lookupd_http) as lookupd,
        runtime.nsqd(brokers.nsqd_http) as nsqd,
    ):
        await lookupd.ping()
        assert (await lookupd.info()).version == "1.3.0"
        nodes = await eventually(lookupd.nodes, lambda n: len(n) == 1, "nsqd registered")
        (node,) = nodes
        assert node.tcp_address == brokers.nsqd_tcp and node.http_address == brokers.nsqd_http
        assert node.version == "1.3.0" and node.topics == () and node.tombstoned_topics == ()
        assert await lookupd.topics() == ()
        assert await lookupd.channels(topic) == ()
        await raises(lookupd.lookup(topic), TopicNotFound)

        await nsqd.create_topic(topic)
        await nsqd.create_channel(topic, channel)

        async def lookup() -> Any:
            return await lookupd.lookup(topic)

        found = await eventually(
            lookup_or_none(lookup), lambda f: f is not None and f.channels == (channel,), "reg."
        )
        (producer,) = found.producers
        assert (producer.tcp_address, producer.http_address) == (
            brokers.nsqd_tcp,
            brokers.nsqd_http,
        )
        assert await lookupd.topics() == (topic,)
        assert await lookupd.channels(topic) == (channel,)
        (node,) = await lookupd.nodes()
        assert node.topics == (topic,)

        # a tombstone hides the producer from /lookup; /nodes shows it
        await lookupd.tombstone(topic, producer)
        assert (await lookupd.lookup(topic)).producers == ()
        (node,) = await lookupd.nodes()
        assert node.topics == (topic,) and node.tombstoned_topics == (topic,)
        await lookupd.tombstone(topic, "127.0.0.1:1")  # an unknown node: accepted, no effect
        await lookupd.tombstone("adm_unknown", producer.http_address)

        await raises(lookupd.delete_channel(topic, "nope"), ChannelNotFound)
        await lookupd.delete_channel(topic, channel)
        assert await lookupd.channels(topic) == ()

        # registered here only, with no producer
        await lookupd.create_topic("adm_planned")
        await lookupd.create_channel("adm_planned", "later")
        planned = await lookupd.lookup("adm_planned")
        assert planned.producers == () and planned.channels == ("later",)
        assert await lookupd.topics() == tuple(sorted((topic, "adm_planned")))
        await lookupd.delete_topic("adm_planned")
        await raises(lookupd.lookup("adm_planned"), TopicNotFound)
        await lookupd.delete_topic("adm_never")  # forgetting an unknown topic is not an error

        # deleted on its nsqd, the topic stays registered with no producer until nsqlookupd
        # is told to forget it too
        await nsqd.delete_topic(topic)
        (node,) = await eventually(lookupd.nodes, lambda n: n[0].topics == (), "unregistered")
        assert await lookupd.topics() == (topic,)
        assert (await lookupd.lookup(topic)).producers == ()
        await lookupd.delete_topic(topic)
        assert await lookupd.topics() == ()
        await raises(lookupd.lookup(topic), TopicNotFound)


def lookup_or_none(lookup: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    async def call() -> Any:
        try:
            return await lookup()
        except TopicNotFound:
            return None

    return call


def test_a_new_topic_gets_the_channels_nsqlookupd_knows(brokers: Brokers) -> None:
    """nsqd creating a topic asks its nsqlookupd for the topic's channels and creates them,
    so none misses the first messages."""
    with LookupdAdmin(brokers.lookupd_http) as lookupd, NSQDAdmin(brokers.nsqd_http) as nsqd:
        deadline = time.monotonic() + 10
        while not lookupd.nodes():  # nsqd learns nsqlookupd's HTTP port when it registers
            assert time.monotonic() < deadline, "nsqd did not register"
            time.sleep(0.01)
        lookupd.create_channel("adm_planned", "early")
        nsqd.create_topic("adm_planned")
        assert [c.name for c in nsqd.topic_stats("adm_planned").channels] == ["early"]

"""``#ephemeral`` channels and topics vanish with their last client (nsqd's channel.go /
topic.go): the channel when its last consumer leaves, the topic when its last channel goes."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from .conftest import Target
from .wire import RawConn, http_json, unique, wait_for, wait_until_equal


def _topics(target: Target) -> dict[str, list[str]]:
    stats: Any = http_json(target.http, "GET", "/stats?format=json")
    return {t["topic_name"]: [ch["channel_name"] for ch in t["channels"]] for t in stats["topics"]}


def _channel_depths(target: Target, topic: str) -> list[tuple[str, int]]:
    stats: Any = http_json(target.http, "GET", f"/stats?format=json&topic={quote(topic)}")
    (found,) = stats["topics"]
    return [(ch["channel_name"], ch["depth"]) for ch in found["channels"]]


def test_ephemeral_channel_and_topic_vanish_with_the_last_client(target: Target) -> None:
    topic = unique("eph") + "#ephemeral"
    channel = "ch#ephemeral"
    first, second = RawConn(target.tcp), RawConn(target.tcp)
    try:
        for conn in (first, second):
            conn.identify()
            conn.sub(topic, channel)
        first.command("RDY 1")
        with RawConn(target.tcp) as producer:
            producer.pub(topic, b"x")
            producer.expect_ok()
        assert first.read_message().body == b"x"
        assert _topics(target)[topic] == [channel]
        first.close()  # one client left: the channel stays
        assert second.nothing_within(0.3)
        assert _topics(target).get(topic) == [channel]
        second.close()  # the last one: channel gone, and with it the ephemeral topic
        wait_for(lambda: topic not in _topics(target))
    finally:
        first.close()
        second.close()


def test_ephemeral_channel_of_a_durable_topic_vanishes_and_the_topic_stays(
    target: Target,
) -> None:
    topic = unique()
    durable, ephemeral = "durable", unique("c") + "#ephemeral"
    with RawConn(target.tcp) as keeper:
        keeper.sub(topic, durable)
        with RawConn(target.tcp) as passing:
            passing.sub(topic, ephemeral)
            assert sorted(_topics(target)[topic]) == sorted([durable, ephemeral])
        wait_until_equal(lambda: _topics(target).get(topic), [durable])
        # what is published now is kept for the durable channel only
        with RawConn(target.tcp) as producer:
            producer.pub(topic, b"kept")
            producer.expect_ok()
        # nsqd's topic pump moves it into the channels after the OK: poll until it has
        wait_until_equal(lambda: _channel_depths(target, topic), [(durable, 1)])
    # a durable channel does not vanish with its last client
    assert _topics(target).get(topic) == [durable]

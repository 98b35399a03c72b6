"""``/topic/empty`` and ``/channel/empty`` checked against ``/stats`` depths (nsqd's
Topic.Empty / Channel.Empty): a topic empties its own queue only; a channel empties its
queue, its in-flight and deferred messages, and no other channel."""

from __future__ import annotations

from typing import Any

from .conftest import Target
from .wire import RawConn, http_json, http_request, unique, wait_for, wait_until_equal


def _topic(target: Target, topic: str) -> Any:
    stats: Any = http_json(target.http, "GET", f"/stats?format=json&topic={topic}")
    (found,) = stats["topics"]
    return found


def _channel(target: Target, topic: str, channel: str) -> Any:
    (found,) = [ch for ch in _topic(target, topic)["channels"] if ch["channel_name"] == channel]
    return found


def _post(target: Target, path: str) -> None:
    status, body, _ = http_request(target.http, "POST", path)
    assert status == 200, (status, body)


def test_topic_empty_drops_what_waits_in_the_topic_only(target: Target) -> None:
    topic = unique()
    for i in range(5):
        assert http_request(target.http, "POST", f"/pub?topic={topic}", b"w%d" % i)[0] == 200
    assert (_topic(target, topic)["depth"], _topic(target, topic)["message_count"]) == (5, 5)
    _post(target, f"/topic/empty?topic={topic}")
    assert _topic(target, topic)["depth"] == 0
    # nothing of it reaches a channel created afterwards
    with RawConn(target.tcp) as c:
        c.sub(topic, "late")
        c.command("RDY 10")
        assert c.nothing_within(0.3)


def test_topic_empty_leaves_channel_queues_alone(target: Target) -> None:
    topic = unique()
    _post(target, f"/topic/create?topic={topic}")  # /channel/create needs an existing topic
    _post(target, f"/channel/create?topic={topic}&channel=c")
    for i in range(3):
        assert http_request(target.http, "POST", f"/pub?topic={topic}", b"c%d" % i)[0] == 200
    # nsqd's topic pump moves them into the channel after the answer: let it, then pause
    wait_until_equal(lambda: _channel(target, topic, "c")["depth"], 3)
    _post(target, f"/topic/pause?topic={topic}")
    for i in range(4):
        assert http_request(target.http, "POST", f"/pub?topic={topic}", b"p%d" % i)[0] == 200
    assert _topic(target, topic)["depth"] == 4  # held in the paused topic
    assert _channel(target, topic, "c")["depth"] == 3
    _post(target, f"/topic/empty?topic={topic}")
    assert _topic(target, topic)["depth"] == 0
    assert _channel(target, topic, "c")["depth"] == 3
    _post(target, f"/topic/unpause?topic={topic}")
    with RawConn(target.tcp) as c:
        c.sub(topic, "c")
        c.command("RDY 10")
        assert [c.read_message().body for _ in range(3)] == [b"c0", b"c1", b"c2"]
        assert c.nothing_within(0.3)


def test_channel_empty_drops_queued_in_flight_and_deferred_of_that_channel_only(
    target: Target,
) -> None:
    topic = unique()
    _post(target, f"/topic/create?topic={topic}")  # /channel/create needs an existing topic
    _post(target, f"/channel/create?topic={topic}&channel=c")
    _post(target, f"/channel/create?topic={topic}&channel=other")
    with RawConn(target.tcp) as consumer, RawConn(target.tcp) as producer:
        consumer.identify()
        consumer.sub(topic, "c")
        producer.identify()
        producer.mpub(topic, [b"m%d" % i for i in range(6)])
        producer.expect_ok()
        producer.command(f"DPUB {topic} 60000", b"later")
        producer.expect_ok()
        consumer.command("RDY 1")
        held = consumer.read_message()

        def every_copy_in_place() -> bool:
            # nsqd's topic pump copies each message into both channels after the MPUB and
            # DPUB are answered (the first copy in "c" was delivered, the rest may still be
            # on their way): read until they are, then empty (one never made fails here)
            ch, other = _channel(target, topic, "c"), _channel(target, topic, "other")
            return (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (5, 1, 1) and (
                other["depth"],
                other["deferred_count"],
            ) == (6, 1)

        wait_for(every_copy_in_place)
        _post(target, f"/channel/empty?topic={topic}&channel=c")
        ch = _channel(target, topic, "c")
        assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"]) == (0, 0, 0)
        other = _channel(target, topic, "other")
        assert (other["depth"], other["deferred_count"]) == (6, 1)
        # the message that was in flight is gone from the channel: FIN fails, not fatally
        consumer.command(f"FIN {held.id.decode()}")
        consumer.expect_error("E_FIN_FAILED")
        # the consumer is still served: its in-flight count was reset with the channel
        producer.pub(topic, b"after")
        producer.expect_ok()
        assert consumer.read_message().body == b"after"

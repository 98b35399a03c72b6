"""The HTTP API as pure calls, options validation, backends, and restart through metadata."""

from __future__ import annotations

import random

import pytest

from nsq_sansio import frames
from nsq_sansio.errors import ConfigError, LocalProtocolError
from nsq_sansio.server import (
    NSQD,
    AdminError,
    BackendError,
    ChannelCreated,
    DiscardBackend,
    MemoryBackend,
    NSQDOptions,
    TopicCreated,
    decode_record,
    encode_record,
)

from ._wire import Client, make_node


def _code(call: object) -> tuple[int, str]:
    assert callable(call)
    with pytest.raises(AdminError) as info:
        call()
    return info.value.status, info.value.code


def test_publish_errors_match_nsqd_http_answers() -> None:
    node = make_node(max_msg_size=4, max_body_size=6, max_req_timeout=1.0)
    assert _code(lambda: node.publish("t", b"", 0.0)) == (400, "MSG_EMPTY")
    assert _code(lambda: node.publish("t", b"12345", 0.0)) == (413, "MSG_TOO_BIG")
    assert _code(lambda: node.publish("bad topic", b"1", 0.0)) == (400, "INVALID_TOPIC")
    assert _code(lambda: node.publish("t", b"1", 0.0, defer_ms=1001)) == (400, "INVALID_DEFER")
    assert _code(lambda: node.publish("t", b"1", 0.0, defer_ms=-1)) == (400, "INVALID_DEFER")
    assert _code(lambda: node.multi_publish("t", [b"123", b"456", b"7"], 0.0)) == (
        413,
        "BODY_TOO_BIG",
    )
    assert _code(lambda: node.multi_publish("t", [b"1", b""], 0.0)) == (400, "MSG_EMPTY")
    assert node.topic_names() == []  # nothing was created by a refused publish


def test_http_publish_reaches_consumers_and_defers() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=10)
    node.publish("t", b"now", 0.0)
    node.multi_publish("t", [b"a", b"b"], 0.0)
    node.publish("t", b"later", 0.0, defer_ms=500)
    assert [m.body for m in consumer.messages()] == [b"now", b"a", b"b"]
    node.handle_timer(0.5)
    assert [m.body for m in consumer.messages()] == [b"later"]


def test_topic_and_channel_admin_not_found_and_invalid() -> None:
    node = make_node()
    assert _code(lambda: node.delete_topic("nope", 0.0)) == (404, "TOPIC_NOT_FOUND")
    assert _code(lambda: node.pause_topic("nope", 0.0)) == (404, "TOPIC_NOT_FOUND")
    assert _code(lambda: node.empty_topic("bad topic", 0.0)) == (400, "INVALID_TOPIC")
    assert _code(lambda: node.create_topic("bad topic", 0.0)) == (400, "INVALID_TOPIC")
    assert _code(lambda: node.create_channel("nope", "c", 0.0)) == (404, "TOPIC_NOT_FOUND")
    node.create_topic("t", 0.0)
    assert _code(lambda: node.create_channel("t", "bad chan", 0.0)) == (400, "INVALID_ARG_CHANNEL")
    assert _code(lambda: node.delete_channel("t", "c", 0.0)) == (404, "CHANNEL_NOT_FOUND")
    assert _code(lambda: node.empty_channel("t", "c", 0.0)) == (404, "CHANNEL_NOT_FOUND")
    node.create_channel("t", "c", 0.0)
    assert node.channel_names("t") == ["c"]
    assert node.take_registry_events() == [TopicCreated("t"), ChannelCreated("t", "c")]


def test_messages_wait_in_a_channel_created_over_http() -> None:
    node = make_node()
    node.create_topic("t", 0.0)
    node.create_channel("t", "c", 0.0)
    node.publish("t", b"kept", 0.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    assert [m.body for m in consumer.messages()] == [b"kept"]


def test_empty_topic_only_drops_what_waits_in_the_topic() -> None:
    node = make_node()
    node.publish("t", b"1", 0.0)
    node.empty_topic("t", 0.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    assert consumer.messages() == []


def test_info_and_stats_filters() -> None:
    node = NSQD(
        NSQDOptions(broadcast_address="b.example", tcp_port=1, http_port=2, hostname="h"),
        random.Random(1),
        epoch_offset=1000.0,
    )
    assert node.info() == {
        "version": "1.3.0",
        "broadcast_address": "b.example",
        "hostname": "h",
        "http_port": 2,
        "tcp_port": 1,
        "start_time": 1000,
        # nsqd's client limits, durations in nanoseconds (Go's time.Duration in JSON)
        "max_heartbeat_interval": 60_000_000_000,
        "max_output_buffer_size": 65536,
        "max_output_buffer_timeout": 30_000_000_000,
        "max_deflate_level": 6,
    }
    node.create_topic("a", 0.0)
    node.create_topic("b", 0.0)
    node.create_channel("b", "x", 0.0)
    node.create_channel("b", "y", 0.0)
    stats = node.stats(0.0, topic="b", channel="y", include_clients=False)
    assert [t["topic_name"] for t in stats["topics"]] == ["b"]
    assert [c["channel_name"] for c in stats["topics"][0]["channels"]] == ["y"]
    assert stats["topics"][0]["channels"][0]["clients"] == []  # not asked for
    assert stats["health"] == "OK" and stats["start_time"] == 1000


def test_stats_filters_follow_nsqd() -> None:
    node = NSQD(NSQDOptions(), random.Random(1))
    assert node.stats(0.0)["topics"] == []
    assert node.stats(0.0, topic="nope")["topics"] == []  # null over HTTP, as nsqd's nil
    node.publish("a", b"1", 0.0)
    node.create_topic("b", 0.0)
    node.create_channel("b", "y", 0.0)
    # a channel filter leaves out the topics that lack the channel
    assert [t["topic_name"] for t in node.stats(0.0, channel="y")["topics"]] == ["b"]
    assert node.stats(0.0, topic="a", channel="y")["topics"] == []
    # HTTP publishes make no producer
    assert node.stats(0.0)["producers"] == []
    publisher = Client(node)
    publisher.send(frames.encode_pub("a", b"2"))
    (producer,) = node.stats(0.0)["producers"]
    assert producer["pub_counts"] == [{"topic": "a", "count": 1}]
    # a topic filter keeps every producer, with only that topic's count (omitted when none)
    (producer,) = node.stats(0.0, topic="b")["producers"]
    assert "pub_counts" not in producer
    assert node.stats(0.0, include_clients=False)["producers"] == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"node_id": 1024},
        {"mem_queue_size": -1},
        {"max_rdy_count": 0},
        {"msg_timeout": 901.0},
        {"max_msg_size": 10, "max_body_size": 5},
        {"max_deflate_level": 10},
        {"tls_required": True},
        {"tcp_port": 70000},
        {"max_channel_consumers": -1},
        {"client_timeout": 0},
    ],
)
def test_options_are_validated(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        NSQDOptions(**overrides)  # type: ignore[arg-type]


def test_backend_record_round_trip_and_garbage() -> None:
    record = encode_record(b"0123456789abcdef", 123, 4, b"body")
    decoded = decode_record(record)
    assert decoded is not None
    assert tuple(decoded) == (b"0123456789abcdef", 123, 4, b"body")
    assert decode_record(b"short") is None


def test_memory_backend_bounds_and_discard() -> None:
    backend = MemoryBackend(max_depth=1)
    backend.put(b"a")
    with pytest.raises(BackendError):
        backend.put(b"b")
    assert backend.get() == b"a" and backend.get() is None
    sized = MemoryBackend(max_bytes=3)
    sized.put(b"ab")
    with pytest.raises(BackendError):
        sized.put(b"cd")
    discard = DiscardBackend()
    discard.put(b"x")
    assert discard.depth == 0 and discard.get() is None and discard.discarded == 1


def test_full_backend_makes_pub_fail_fatally() -> None:
    node = NSQD(
        NSQDOptions(mem_queue_size=1),
        random.Random(1),
        backend_factory=lambda name: MemoryBackend(max_depth=1),
    )
    client = Client(node)
    assert client.pub("t", b"1") == b"OK"  # memory
    assert client.pub("t", b"2") == b"OK"  # backend
    client.send(frames.encode_pub("t", b"3"))
    (answer,) = client.responses()
    assert answer.startswith(b"E_PUB_FAILED PUB failed memory backend is full")
    assert client.closed
    assert _code(lambda: node.publish("t", b"4", 0.0)) == (503, "EXITING")


def test_close_and_restart_keep_every_message() -> None:
    stores: dict[str, MemoryBackend] = {}

    def factory(name: str) -> MemoryBackend:
        return stores.setdefault(name, MemoryBackend())

    options = NSQDOptions(mem_queue_size=2)
    node = NSQD(options, random.Random(1), backend_factory=factory)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    node.create_channel("t", "other", 0.0)
    node.pause_channel("t", "other", 0.0)
    node.multi_publish("t", [b"%d" % i for i in range(5)], 0.0)
    (in_flight,) = consumer.messages()
    consumer.send(frames.encode_req(in_flight.id, 60_000))  # deferred at shutdown
    node.publish("waiting", b"w", 0.0)  # a topic without channels
    metadata = node.metadata()
    node.close(1.0)
    with pytest.raises(LocalProtocolError):
        node.publish("t", b"late", 1.0)

    restarted = NSQD(options, random.Random(2), backend_factory=factory)
    restarted.load_metadata(metadata, 2.0)
    assert restarted.topic_names() == ["t", "waiting"]
    assert restarted.channel_names("t") == ["c", "other"]
    stats = restarted.stats(2.0)
    assert stats["topics"][0]["channels"][1]["paused"] is True
    again = Client(restarted, now=2.0)
    again.sub("t", "c", rdy=100, now=2.0)
    assert sorted(m.body for m in again.messages()) == [b"%d" % i for i in range(5)]
    other = Client(restarted, now=2.0)
    other.sub("t", "other", rdy=100, now=2.0)
    restarted.unpause_channel("t", "other", 2.0)
    assert sorted(m.body for m in other.messages()) == [b"%d" % i for i in range(5)]
    waiting = Client(restarted, now=2.0)
    waiting.sub("waiting", "c", rdy=1, now=2.0)
    assert [m.body for m in waiting.messages()] == [b"w"]


def test_load_metadata_skips_garbage() -> None:
    node = make_node()
    node.load_metadata(
        {
            "topics": [
                {"name": "ok", "channels": [{"name": "bad name"}, "junk", {"name": "c"}]},
                {"name": 5},
                "junk",
                {"name": "x#ephemeral"},
            ]
        },
        0.0,
    )
    assert node.topic_names() == ["ok"] and node.channel_names("ok") == ["c"]
    node.load_metadata({"topics": "nope"}, 0.0)


def test_message_ids_are_unique_hex_with_node_id() -> None:
    node = make_node(node_id=5)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=2500)
    node.multi_publish("t", [b"x"] * 1000, 0.0)
    ids = [m.id for m in consumer.messages()]
    assert len(set(ids)) == 1000
    assert all(int(i, 16) >> 54 == 5 for i in ids)

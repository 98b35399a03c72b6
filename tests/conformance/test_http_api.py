"""nsqd's HTTP API (modern v1 shape: bare JSON, ``{"message": ...}`` errors)."""

from __future__ import annotations

import json
import struct

import pytest

from .conftest import Target
from .wire import RawConn, http_json, http_request, unique


def test_ping_and_info(target: Target) -> None:
    status, body, _ = http_request(target.http, "GET", "/ping")
    assert (status, body) == (200, b"OK")
    info = http_json(target.http, "GET", "/info")
    for key in ("version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time"):
        assert key in info, key
    assert info["tcp_port"] == int(target.tcp.rsplit(":", 1)[1])


def test_pub_over_http_is_consumed_over_tcp(target: Target) -> None:
    topic = unique()
    status, body, _ = http_request(target.http, "POST", f"/pub?topic={topic}", b"via http")
    assert (status, body) == (200, b"OK")
    with RawConn(target.tcp) as c:
        c.sub(topic, unique("c"))
        c.command("RDY 1")
        assert c.read_message().body == b"via http"


def test_mpub_newline_and_binary(target: Target) -> None:
    topic = unique()
    status, _, _ = http_request(target.http, "POST", f"/mpub?topic={topic}", b"a\nbb\n\nccc\n")
    assert status == 200
    payload = struct.pack(">i", 2) + struct.pack(">i", 2) + b"dd" + struct.pack(">i", 1) + b"e"
    status, _, _ = http_request(target.http, "POST", f"/mpub?topic={topic}&binary=true", payload)
    assert status == 200
    with RawConn(target.tcp) as c:
        c.sub(topic, unique("c"))
        c.command("RDY 10")
        assert [c.read_message().body for _ in range(5)] == [b"a", b"bb", b"ccc", b"dd", b"e"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/pub?topic=t", b"", 400, "MSG_EMPTY"),
        ("POST", "/pub", b"x", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/pub?topic=bad/name", b"x", 400, "INVALID_TOPIC"),
        ("POST", "/pub?topic=t", b"x" * 1_048_577, 413, "MSG_TOO_BIG"),
        ("POST", "/pub?topic=t&defer=abc", b"x", 400, "INVALID_DEFER"),
        ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x00", 413, "BAD_BODY"),
        ("POST", "/topic/delete?topic=never-created-xyz", b"", 404, "TOPIC_NOT_FOUND"),
        ("POST", "/channel/create?topic=t", b"", 400, "MISSING_ARG_CHANNEL"),
        ("GET", "/nothing/here", None, 404, "NOT_FOUND"),
        ("GET", "/pub?topic=t", None, 405, "METHOD_NOT_ALLOWED"),
    ],
)
def test_http_errors(
    target: Target, method: str, path: str, body: bytes | None, status: int, message: str
) -> None:
    got_status, got_body, _ = http_request(target.http, method, path, body)
    assert got_status == status, got_body
    assert json.loads(got_body) == {"message": message}


def stats_topic(target: Target, topic: str) -> dict | None:  # type: ignore[type-arg]
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}")
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            return t  # type: ignore[no-any-return]
    return None


def test_stats_json_shape(target: Target) -> None:
    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    http_request(target.http, "POST", f"/channel/create?topic={topic}&channel=ch")
    http_request(target.http, "POST", f"/pub?topic={topic}", b"x")
    stats = http_json(target.http, "GET", "/stats?format=json")
    for key in ("version", "health", "start_time", "topics"):
        assert key in stats, key
    t = stats_topic(target, topic)
    assert t is not None
    for key in ("topic_name", "channels", "depth", "backend_depth", "message_count", "paused"):
        assert key in t, key
    assert t["message_count"] == 1
    (ch,) = t["channels"]
    for key in (
        "channel_name",
        "depth",
        "backend_depth",
        "in_flight_count",
        "deferred_count",
        "message_count",
        "requeue_count",
        "timeout_count",
        "clients",
        "paused",
    ):
        assert key in ch, key
    assert ch["channel_name"] == "ch" and ch["depth"] == 1


def test_topic_and_channel_lifecycle(target: Target) -> None:
    topic = unique()
    assert http_request(target.http, "POST", f"/topic/create?topic={topic}")[0] == 200
    assert http_request(target.http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
    http_request(target.http, "POST", f"/pub?topic={topic}", b"1")
    http_request(target.http, "POST", f"/pub?topic={topic}", b"2")
    assert stats_topic(target, topic)["channels"][0]["depth"] == 2  # type: ignore[index]
    assert http_request(target.http, "POST", f"/channel/empty?topic={topic}&channel=c")[0] == 200
    assert stats_topic(target, topic)["channels"][0]["depth"] == 0  # type: ignore[index]
    assert http_request(target.http, "POST", f"/channel/delete?topic={topic}&channel=c")[0] == 200
    assert stats_topic(target, topic)["channels"] == []  # type: ignore[index]
    status, body, _ = http_request(target.http, "POST", f"/channel/delete?topic={topic}&channel=c")
    assert (status, json.loads(body)) == (404, {"message": "CHANNEL_NOT_FOUND"})
    http_request(target.http, "POST", f"/pub?topic={topic}", b"3")
    assert http_request(target.http, "POST", f"/topic/empty?topic={topic}")[0] == 200
    assert stats_topic(target, topic)["depth"] == 0  # type: ignore[index]
    assert http_request(target.http, "POST", f"/topic/delete?topic={topic}")[0] == 200
    assert stats_topic(target, topic) is None


def test_channel_pause_holds_messages_until_unpause(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as c:
        c.sub(topic, "c")
        c.command("RDY 5")
        assert (
            http_request(target.http, "POST", f"/channel/pause?topic={topic}&channel=c")[0] == 200
        )
        assert stats_topic(target, topic)["channels"][0]["paused"] is True  # type: ignore[index]
        http_request(target.http, "POST", f"/pub?topic={topic}", b"held")
        assert c.nothing_within(0.3)
        http_request(target.http, "POST", f"/channel/unpause?topic={topic}&channel=c")
        assert c.read_message().body == b"held"


def test_topic_pause_holds_messages_until_unpause(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as c:
        c.sub(topic, "c")
        c.command("RDY 5")
        assert http_request(target.http, "POST", f"/topic/pause?topic={topic}")[0] == 200
        http_request(target.http, "POST", f"/pub?topic={topic}", b"held")
        assert c.nothing_within(0.3)
        assert stats_topic(target, topic)["paused"] is True  # type: ignore[index]
        http_request(target.http, "POST", f"/topic/unpause?topic={topic}")
        assert c.read_message().body == b"held"


def test_deleting_a_topic_closes_its_consumers(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as c:
        c.sub(topic, "c")
        assert http_request(target.http, "POST", f"/topic/delete?topic={topic}")[0] == 200
        c.expect_closed()


def test_keep_alive_serves_several_requests_on_one_connection(target: Target) -> None:
    import http.client

    from .wire import split_address

    conn = http.client.HTTPConnection(*split_address(target.http), timeout=5)
    try:
        for _ in range(3):
            conn.request("GET", "/ping")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"OK")
    finally:
        conn.close()


def test_deferred_http_pub(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as c:
        c.sub(topic, "c")
        c.command("RDY 1")
        http_request(target.http, "POST", f"/pub?topic={topic}&defer=1500", b"later")
        assert c.nothing_within(0.5)
        assert c.read_message().body == b"later"

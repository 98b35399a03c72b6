"""nsqd's HTTP API (modern v1 shape: bare JSON, ``{"message": ...}`` errors)."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from .conftest import Target
from .wire import (
    RawConn,
    http_json,
    http_request,
    split_address,
    unique,
    wait_for,
    wait_until_equal,
)


def test_ping_and_info(target: Target) -> None:
    status, body, headers = http_request(target.http, "GET", "/ping")
    assert (status, body) == (200, b"OK")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert "x-nsq-content-type" not in headers  # /ping is plain text, not nsq's v1 answer
    info = http_json(target.http, "GET", "/info")
    for key in ("version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time"):
        assert key in info, key
    assert info["tcp_port"] == int(target.tcp.rsplit(":", 1)[1])


def test_info_reports_the_limits_clients_may_ask_for(target: Target) -> None:
    # what a client may set in IDENTIFY; durations in nanoseconds (Go's time.Duration)
    info = http_json(target.http, "GET", "/info")
    assert info["max_heartbeat_interval"] == 60 * 1_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30 * 1_000_000_000
    assert info["max_deflate_level"] == 6


def test_status_line_has_its_reason_phrase(target: Target) -> None:
    host, port = split_address(target.http)
    for request, line in [
        (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
        (b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 Not Found\r\n"),
        (b"POST /ping HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed\r\n"),
    ]:
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(request)
            answer = b""
            while b"\r\n" not in answer:
                chunk = sock.recv(4096)
                assert chunk, answer
                answer += chunk
        assert answer.startswith(line), answer[:60]


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("POST", "/ping", 405, "GET, OPTIONS"),
        ("HEAD", "/stats", 405, "GET, OPTIONS"),  # nsqd routes GET only, not HEAD
        ("GET", "/pub?topic=t", 405, "OPTIONS, POST"),
        ("OPTIONS", "/ping", 200, "GET, OPTIONS"),
        ("OPTIONS", "/channel/create", 200, "OPTIONS, POST"),
    ],
)
def test_methods_not_routed_get_an_allow_list(
    target: Target, method: str, path: str, status: int, allow: str
) -> None:
    got_status, body, headers = http_request(target.http, method, path)
    assert (got_status, headers.get("allow")) == (status, allow), body
    if method == "OPTIONS":
        assert body == b""


def test_stats_memory_block(target: Target) -> None:
    keys = {
        "heap_objects",
        "heap_idle_bytes",
        "heap_in_use_bytes",
        "heap_released_bytes",
        "gc_pause_usec_100",
        "gc_pause_usec_99",
        "gc_pause_usec_95",
        "next_gc_bytes",
        "gc_total_runs",
    }
    memory = http_json(target.http, "GET", "/stats?format=json")["memory"]
    assert set(memory) == keys
    assert all(isinstance(v, int) and v >= 0 for v in memory.values()), memory
    assert memory["heap_objects"] > 0 and memory["heap_in_use_bytes"] > 0
    assert "memory" not in http_json(target.http, "GET", "/stats?format=json&include_mem=false")
    _, text, _ = http_request(target.http, "GET", "/stats")
    assert b"\nMemory:\n   heap_objects" in text
    _, text, _ = http_request(target.http, "GET", "/stats?include_mem=0")
    assert b"Memory:" not in text


def test_stats_nulls_follow_go(target: Target) -> None:
    # Go's nil slices: a topic asked for that does not exist gives "topics": null (and
    # "producers": null); no producer at all gives "producers": null
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={unique()}")
    assert (stats["topics"], stats["producers"]) == (None, None)
    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    http_request(target.http, "POST", f"/channel/create?topic={topic}&channel=c")
    # a channel that topic lacks: the topic is left out, the list stays a list
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}&channel=nope")
    assert stats["topics"] == []
    # without clients: each channel's "clients" and the producers are null
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}&include_clients=0")
    assert stats["topics"][0]["channels"][0]["clients"] is None
    assert stats["producers"] is None
    with RawConn(target.tcp) as producer:
        producer.pub(topic, b"x")
        producer.expect_ok()
        other = unique()
        stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}")
        mine = [p for p in stats["producers"] if p["pub_counts"] == [{"topic": topic, "count": 1}]]
        assert len(mine) == 1
        producer.pub(other, b"y")
        producer.expect_ok()
        # filtered by another topic, the producer is still listed, with that topic's count
        stats = http_json(target.http, "GET", f"/stats?format=json&topic={other}")
        counts = [p.get("pub_counts") for p in stats["producers"]]
        assert [{"topic": other, "count": 1}] in counts


def test_mpub_binary_param_takes_go_booleans(target: Target) -> None:
    topic = unique()
    # binary=false is the newline-separated form; any value nsqd does not know means binary
    status, _, _ = http_request(target.http, "POST", f"/mpub?topic={topic}&binary=false", b"a\nb")
    assert status == 200
    status, body, _ = http_request(target.http, "POST", f"/mpub?topic={topic}&binary=yes", b"a\nb")
    assert (status, json.loads(body)) == (413, {"message": "BAD_BODY"})
    assert stats_topic(target, topic)["message_count"] == 2  # type: ignore[index]


def test_stats_text_layout(target: Target) -> None:
    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    http_request(target.http, "POST", f"/channel/create?topic={topic}&channel=c")
    http_request(target.http, "POST", f"/topic/pause?topic={topic}")
    with RawConn(target.tcp) as consumer:
        consumer.identify(hostname="conformance", user_agent="probe/1")
        consumer.sub(topic, "c")
        _, body, _ = http_request(target.http, "GET", f"/stats?topic={topic}&include_mem=false")
    text = body.decode()
    lines = text.splitlines()
    assert lines[0].startswith("nsqd v1.3.0 ")
    assert lines[1].startswith("start_time ") and lines[2].startswith("uptime ")
    assert lines[3:6] == ["", "Health: OK", ""]
    assert lines[6] == "Topics:"
    assert lines[7].startswith(f"*P [{topic:<15}] depth: 0     be-depth: 0     msgs: 0 ")
    assert lines[8].startswith(f"      [{'c':<25}] depth: 0     be-depth: 0     inflt: 0 ")
    assert lines[9].startswith("        [V2 conformance:")
    assert " probe/1" in lines[9] and "] state: 3 inflt: 0    rdy: 0 " in lines[9]
    assert text.endswith("\n\nProducers: None\n")


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
    for t in stats["topics"] or ():  # null when the topic does not exist
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

    def copied_into_the_channel() -> dict | None:  # type: ignore[type-arg]
        # nsqd answers /pub once the topic has the message; its topic pump copies it into the
        # channel afterwards: read until it has (a message that never arrives fails here)
        found = stats_topic(target, topic)
        return found if found and found["channels"][0]["depth"] == 1 else None

    t = wait_for(copied_into_the_channel)
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
    # answered once in the topic; nsqd's topic pump moves them into the channel afterwards
    wait_until_equal(lambda: stats_topic(target, topic)["channels"][0]["depth"], 2)  # type: ignore[index]
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


def test_config_reads_options_and_sets_the_log_level(target: Target) -> None:
    assert http_json(target.http, "GET", "/config/mem_queue_size") == 10000
    assert http_json(target.http, "GET", "/config/msg_timeout") == 60 * 1_000_000_000  # ns
    assert http_json(target.http, "GET", "/config/max_rdy_count") == 2500
    status, body, headers = http_request(target.http, "GET", "/config/broadcast_address")
    assert (status, headers["content-type"]) == (200, "text/plain; charset=utf-8")  # a string
    assert body == split_address(target.tcp)[0].encode()
    for method, path, body, status, message in [
        ("GET", "/config/no_such_option", None, 400, "INVALID_OPTION"),
        ("PUT", "/config/mem_queue_size", b"5", 400, "INVALID_OPTION"),
        ("PUT", "/config/log_level", b"loud", 400, "INVALID_VALUE"),
        ("PUT", "/config/log_level", b"", 413, "INVALID_VALUE"),
        ("POST", "/config/log_level", b"info", 405, "METHOD_NOT_ALLOWED"),
    ]:
        got_status, got_body, _ = http_request(target.http, method, path, body)
        assert (got_status, json.loads(got_body)) == (status, {"message": message}), path
    level = http_json(target.http, "GET", "/config/log_level")
    assert http_json(target.http, "PUT", "/config/log_level", b"warn") == 3
    assert http_json(target.http, "GET", "/config/log_level") == 3
    names = {1: b"debug", 2: b"info", 3: b"warn", 4: b"error", 5: b"fatal"}
    assert http_json(target.http, "PUT", "/config/log_level", names[level]) == level


def test_config_changes_the_nsqlookupd_it_registers_with(target: Target) -> None:
    if target.lookupd_http is None or target.lookupd_tcp is None:
        pytest.skip("no nsqlookupd configured")
    lookupd_http = target.lookupd_http
    tcp_port = split_address(target.tcp)[1]

    def registered() -> bool:
        nodes = http_json(lookupd_http, "GET", "/nodes")["producers"]
        return any(node["tcp_port"] == tcp_port for node in nodes)

    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    wait_for(registered)
    original = http_json(target.http, "GET", "/config/nsqlookupd_tcp_addresses")
    assert target.lookupd_tcp in original
    try:
        assert http_json(target.http, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]") == []
        wait_for(lambda: not registered())  # the connection closed: nsqlookupd forgot it
    finally:
        restored = json.dumps(original).encode()
        assert http_json(target.http, "PUT", "/config/nsqlookupd_tcp_addresses", restored) == (
            original
        )
    wait_for(registered)  # back, with what it has
    wait_for(lambda: topic in http_json(lookupd_http, "GET", "/topics")["topics"])

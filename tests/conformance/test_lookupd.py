"""nsqlookupd: nsqd registers what it has; /lookup, /topics, /channels, /nodes answer it."""

from __future__ import annotations

import json
import struct
import time

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


def lookup(lookupd_http: str, topic: str) -> dict | None:  # type: ignore[type-arg]
    status, body, _ = http_request(lookupd_http, "GET", f"/lookup?topic={topic}")
    if status == 404:
        return None
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def test_nsqd_registers_topics_and_channels(target: Target, lookupd_http: str) -> None:
    topic = unique()
    http_request(target.http, "POST", f"/pub?topic={topic}", b"x")
    doc = wait_for(lambda: lookup(lookupd_http, topic))
    (producer,) = doc["producers"]
    assert set(producer) >= {
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
    }
    assert producer["tcp_port"] == split_address(target.tcp)[1]
    assert producer["http_port"] == split_address(target.http)[1]
    with RawConn(target.tcp) as c:
        c.sub(topic, "reader")
        wait_until_equal(lambda: lookup(lookupd_http, topic)["channels"], ["reader"])  # type: ignore[index]
    assert topic in http_json(lookupd_http, "GET", "/topics")["topics"]
    assert http_json(lookupd_http, "GET", f"/channels?topic={topic}") == {"channels": ["reader"]}
    nodes = http_json(lookupd_http, "GET", "/nodes")["producers"]
    mine = [n for n in nodes if n["tcp_port"] == producer["tcp_port"]]
    assert mine and topic in mine[0]["topics"]
    assert len(mine[0]["tombstones"]) == len(mine[0]["topics"])
    # deleting the topic on nsqd unregisters it (nsqlookupd keeps the keys of non-ephemeral
    # channels after UNREGISTER, with no producers, so /lookup still lists "reader")
    http_request(target.http, "POST", f"/topic/delete?topic={topic}")
    wait_for(lambda: not (lookup(lookupd_http, topic) or {"producers": []})["producers"])


def test_tombstone_hides_a_producer(target: Target, lookupd_http: str) -> None:
    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    doc = wait_for(lambda: lookup(lookupd_http, topic))
    producer = doc["producers"][0]
    node = f"{producer['broadcast_address']}:{producer['http_port']}"
    status, _, _ = http_request(lookupd_http, "POST", f"/topic/tombstone?topic={topic}&node={node}")
    assert status == 200
    assert lookup(lookupd_http, topic)["producers"] == []  # type: ignore[index]


def test_lookupd_http_basics(lookupd_http: str) -> None:
    status, body, headers = http_request(lookupd_http, "GET", "/ping")
    assert (status, body) == (200, b"OK") and "x-nsq-content-type" not in headers
    assert http_json(lookupd_http, "GET", "/info") == {"version": "1.3.0"}
    status, _, headers = http_request(lookupd_http, "HEAD", "/ping")  # routed for GET only
    assert (status, headers.get("allow")) == (405, "GET, OPTIONS")
    status, body, _ = http_request(lookupd_http, "GET", f"/lookup?topic={unique()}")
    assert (status, json.loads(body)) == (404, {"message": "TOPIC_NOT_FOUND"})
    status, body, _ = http_request(lookupd_http, "GET", "/lookup")
    assert (status, json.loads(body)) == (400, {"message": "MISSING_ARG_TOPIC"})
    topic = unique()
    assert http_request(lookupd_http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
    assert lookup(lookupd_http, topic) == {"channels": ["c"], "producers": []}
    assert http_request(lookupd_http, "POST", f"/channel/delete?topic={topic}&channel=c")[0] == 200
    assert http_request(lookupd_http, "POST", f"/topic/delete?topic={topic}")[0] == 200
    assert lookup(lookupd_http, topic) is None


def _v1_answer(c: RawConn) -> bytes:
    c._fill(4)
    (size,) = struct.unpack(">i", c.buf[:4])
    c._fill(4 + size)
    data = c.buf[4 : 4 + size]
    c.buf = c.buf[4 + size :]
    return data


def _lookupd_tcp(target: Target) -> str:
    if target.lookupd_tcp is None:
        pytest.skip("no nsqlookupd TCP address configured (NSQ_CONFORMANCE_LOOKUPD)")
    return target.lookupd_tcp


def test_lookupd_tcp_ping_and_register_before_identify(target: Target) -> None:
    with RawConn(_lookupd_tcp(target), magic=b"  V1") as c:
        c.send(b"PING\n")
        assert _v1_answer(c) == b"OK"
        c.send(b"REGISTER t\n")  # before IDENTIFY: fatal E_INVALID
        assert _v1_answer(c).startswith(b"E_INVALID")
        c.expect_closed()


@pytest.mark.parametrize(
    "body", [b"{x}", b"[1]", b'{"tcp_port": "4150"}', b'{"hostname": 7}'], ids=repr
)
def test_lookupd_tcp_identify_that_does_not_decode(target: Target, body: bytes) -> None:
    with RawConn(_lookupd_tcp(target), magic=b"  V1") as c:
        c.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        assert _v1_answer(c) == b"E_BAD_BODY IDENTIFY failed to decode JSON body"
        c.expect_closed()


def test_lookupd_debug_dumps_registrations(target: Target, lookupd_http: str) -> None:
    topic = unique()
    http_request(target.http, "POST", f"/topic/create?topic={topic}")
    http_request(target.http, "POST", f"/channel/create?topic={topic}&channel=c")
    dump = wait_for(
        lambda: (d := http_json(lookupd_http, "GET", "/debug")).get(f"channel:{topic}:c") and d
    )
    (entry,) = dump[f"topic:{topic}:"]
    assert entry["tcp_port"] == split_address(target.tcp)[1]
    assert set(entry) == {
        "id",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "last_update",
        "tombstoned",
        "tombstoned_at",
    }
    assert entry["tombstoned"] is False
    # wall-clock nanoseconds, within a minute of ours
    assert abs(entry["last_update"] / 1e9 - time.time()) < 60
    assert any(e["id"] == entry["id"] for e in dump["client::"])
    # a registration nobody produces for is not listed (nsqlookupd dumps producers)
    http_request(lookupd_http, "POST", f"/topic/create?topic={topic}-bare")
    assert f"topic:{topic}-bare:" not in http_json(lookupd_http, "GET", "/debug")


def test_lookupd_tcp_bad_magic(target: Target) -> None:
    with RawConn(_lookupd_tcp(target), magic=b"  V9") as c:
        assert _v1_answer(c).startswith(b"E_BAD_PROTOCOL")
        c.expect_closed()


def test_lookupd_tcp_identify_register_unregister(target: Target, lookupd_http: str) -> None:
    topic = unique()
    identity = {
        "broadcast_address": "192.0.2.7",
        "hostname": "fake-nsqd",
        "tcp_port": 14150,
        "http_port": 14151,
        "version": "1.3.0",
    }
    body = json.dumps(identity).encode()
    with RawConn(_lookupd_tcp(target), magic=b"  V1") as c:
        c.send(b"IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        info = json.loads(_v1_answer(c))
        assert {"tcp_port", "http_port", "version", "broadcast_address", "hostname"} <= set(info)
        c.send(f"REGISTER {topic} ch\nREGISTER {topic}\n".encode())
        assert _v1_answer(c) == b"OK" and _v1_answer(c) == b"OK"
        doc = lookup(lookupd_http, topic)
        assert doc is not None and doc["channels"] == ["ch"]
        (producer,) = doc["producers"]
        assert producer["broadcast_address"] == "192.0.2.7" and producer["tcp_port"] == 14150
        assert producer["remote_address"].startswith("127.0.0.1:")
        c.send(f"REGISTER {topic} bad/chan\n".encode())
        assert _v1_answer(c).startswith(b"E_BAD_CHANNEL")
        c.expect_closed()
    # the connection is gone, and with it the producer's registrations
    wait_until_equal(lambda: lookup(lookupd_http, topic)["producers"], [])  # type: ignore[index]

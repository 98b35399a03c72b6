"""Lookupd discovery: addresses, h11 request bytes, both answer shapes, garbage, polling."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.discovery import (
    MAX_RESPONSE_SIZE,
    LookupAnswer,
    LookupdAddress,
    LookupdPoller,
    LookupFailure,
    LookupRequest,
    NSQDAddress,
    parse_lookup_response,
)
from nsq_sansio.errors import ConfigError

L = LookupdAddress("127.0.0.1", 4161)


def http(status: int, body: bytes, reason: str = "OK") -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def producers(*pairs: tuple[str, int]) -> list[dict[str, object]]:
    return [
        {"broadcast_address": h, "tcp_port": p, "http_port": 4151, "hostname": h} for h, p in pairs
    ]


def test_addresses_parse_and_print() -> None:
    assert LookupdAddress.parse("127.0.0.1:4161") == L
    assert LookupdAddress.parse("http://lookupd") == LookupdAddress("lookupd", 4161)
    assert LookupdAddress.parse("https://l.example/") == LookupdAddress("l.example", 443, True)
    assert LookupdAddress.parse("http://[::1]:9/base/lookup").path_prefix == "/base"
    assert str(LookupdAddress("::1", 9)) == "http://[::1]:9"
    assert NSQDAddress.parse("[::1]:4150") == NSQDAddress("::1", 4150)
    assert str(NSQDAddress("::1", 4150)) == "[::1]:4150"
    for bad in ("nsqd", "host:0", "host:99999", ":4150", "::1:4150", "[::1"):
        with pytest.raises(ConfigError):
            NSQDAddress.parse(bad)
    with pytest.raises(ConfigError):
        LookupdAddress.parse("ftp://x:1")


def test_request_bytes_are_a_proper_http_get() -> None:
    req = LookupRequest(LookupdAddress("l", 4161, path_prefix="/p"), "clicks#ephemeral")
    head = req.data.decode()
    assert head.startswith("GET /p/lookup?topic=clicks%23ephemeral HTTP/1.1\r\n")
    assert "Host: l:4161\r\n" in head
    assert "Accept: application/vnd.nsq; version=1.0\r\n" in head
    assert head.endswith("\r\n\r\n")


def test_current_shape_any_chunking() -> None:
    body = json.dumps({"channels": ["c"], "producers": producers(("a", 4150), ("b", 4150))})
    raw = http(200, body.encode())
    for step in (1, 7, len(raw)):
        req = LookupRequest(L, "t")
        outcome = None
        for i in range(0, len(raw), step):
            got = req.receive_data(raw[i : i + step])
            if got is not None:
                outcome = got
        assert outcome == LookupAnswer(L, (NSQDAddress("a", 4150), NSQDAddress("b", 4150)))


def test_old_envelope_shape_and_legacy_address_field() -> None:
    body = {
        "status_code": 200,
        "status_txt": "OK",
        "data": {"channels": [], "producers": [{"address": "old", "tcp_port": 4150}]},
    }
    out = parse_lookup_response(L, 200, json.dumps(body).encode())
    assert out == LookupAnswer(L, (NSQDAddress("old", 4150),))
    bad = {"status_code": 500, "status_txt": "INTERNAL_ERROR", "data": None}
    assert isinstance(parse_lookup_response(L, 200, json.dumps(bad).encode()), LookupFailure)


def test_topic_not_found_is_an_empty_answer_in_both_shapes() -> None:
    assert parse_lookup_response(L, 404, b'{"message":"TOPIC_NOT_FOUND"}') == LookupAnswer(L, ())
    old = b'{"status_code":404,"status_txt":"TOPIC_NOT_FOUND","data":null}'
    assert parse_lookup_response(L, 200, old) == LookupAnswer(L, ())


def test_union_key_dedups_and_bad_entries_are_skipped() -> None:
    entries = [
        *producers(("a", 1), ("a", 1), ("a", 2)),
        {"broadcast_address": "x"},
        {"broadcast_address": "", "tcp_port": 1},
        {"broadcast_address": "y", "tcp_port": True},
        "junk",
        {"broadcast_address": "z", "tcp_port": 70000},
    ]
    out = parse_lookup_response(L, 200, json.dumps({"producers": entries}).encode())
    assert isinstance(out, LookupAnswer)
    assert out.producers == (NSQDAddress("a", 1), NSQDAddress("a", 2))
    assert out.skipped == 5


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (500, b'{"message":"INTERNAL_ERROR"}'),
        (200, b"not json"),
        (200, b"[1,2]"),
        (200, b'{"producers": 3}'),
        (200, b'{"status_code":"x"}'),
        (503, b""),
    ],
)
def test_error_status_and_garbage_are_failures(status: int, body: bytes) -> None:
    out = parse_lookup_response(L, status, body)
    assert isinstance(out, LookupFailure)
    assert str(L) in str(out.error)


def test_broken_http_truncated_and_oversized() -> None:
    assert isinstance(LookupRequest(L, "t").receive_data(b"SMTP hello\r\n\r\n"), LookupFailure)
    req = LookupRequest(L, "t")
    assert req.receive_data(http(200, b'{"producers": []}')[:-3]) is None
    assert isinstance(req.receive_data(b""), LookupFailure)
    assert req.done
    # an announced length over the bound fails before any of the body arrives
    announced = LookupRequest(L, "t")
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n"
    assert isinstance(announced.receive_data(head), LookupFailure)
    # a chunked body fails once what arrived passes it
    big = LookupRequest(L, "t")
    assert big.receive_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") is None
    chunk = b"10000\r\n" + b" " * 65536 + b"\r\n"
    outcome = None
    for _ in range(MAX_RESPONSE_SIZE // len(chunk) + 2):
        outcome = big.receive_data(chunk)
        if outcome is not None:
            break
    assert isinstance(outcome, LookupFailure)
    # body delimited by EOF (no Content-Length), as HTTP/1.0 servers do
    eof = LookupRequest(L, "t")
    assert eof.receive_data(b'HTTP/1.0 200 OK\r\n\r\n{"producers": []}') is None
    assert eof.receive_data(b"") == LookupAnswer(L, ())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_raises(data: bytes) -> None:
    req = LookupRequest(L, "t")
    first = req.receive_data(data)
    last = req.receive_data(b"")
    assert first is not None or last is not None  # EOF always settles it
    assert req.done


def make_poller(*lookupds: str, seed: int = 0) -> LookupdPoller:
    return LookupdPoller(
        lookupds, "t", interval=60.0, jitter=0.3, timeout=5.0, rng=random.Random(seed)
    )


def test_poller_bootstraps_all_then_polls_each_with_jitter() -> None:
    poller = make_poller("a:1", "b:1")
    reqs = poller.start(100.0)
    assert [r.lookupd.host for r in reqs] == ["a", "b"]
    for r in reqs:
        poller.receive_response(r.request_id, 200, b'{"producers": []}')
    due = poller.next_deadline()
    assert due is not None and 160.0 <= due <= 178.0
    assert poller.poll_due(159.9) == ([], [])
    reqs2, _ = poller.poll_due(178.0)
    assert len(reqs2) == 2


def test_poller_timeout_and_failure_keep_previous_answer() -> None:
    poller = make_poller("a:1", "b:1")
    ra, rb = poller.start(0.0)
    poller.receive_response(
        ra.request_id, 200, json.dumps({"producers": producers(("n1", 1))}).encode()
    )
    poller.receive_response(
        rb.request_id, 200, json.dumps({"producers": producers(("n2", 1))}).encode()
    )
    assert poller.known_nodes() == {NSQDAddress("n1", 1), NSQDAddress("n2", 1)}
    reqs, _ = poller.poll_due(100.0)
    ra2, rb2 = reqs
    assert isinstance(poller.receive_response(ra2.request_id, 500, b""), LookupFailure)
    _, failures = poller.poll_due(105.0)  # b never answered
    assert [f.lookupd.host for _, f in failures] == ["b"]
    assert poller.known_nodes() == {NSQDAddress("n1", 1), NSQDAddress("n2", 1)}
    assert poller.receive_data(rb2.request_id, b"late") is None  # already settled


def test_poller_does_not_pile_up_requests_and_stop() -> None:
    poller = LookupdPoller(
        ["a:1"], "t", interval=1.0, jitter=0.0, timeout=10.0, rng=random.Random(0)
    )
    (first,) = poller.start(0.0)
    reqs, _ = poller.poll_due(1.0)
    assert reqs == []  # the first request is still waiting
    assert poller.stop() == [first.request_id]
    assert poller.poll_due(50.0) == ([], [])
    assert poller.next_deadline() is None


def test_absurdly_nested_json_is_a_failure_not_a_crash() -> None:
    lookupd = LookupdAddress.parse("http://127.0.0.1:4161")
    answer = parse_lookup_response(lookupd, 200, b"[" * 200_000)
    assert isinstance(answer, LookupFailure) and "JSON" in str(answer.error)

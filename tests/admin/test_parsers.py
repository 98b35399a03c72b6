"""The admin answers, pure: recorded answers of the real nsqd/nsqlookupd v1.3.0 read into the
dataclasses, the lag arithmetic, error statuses into typed errors, and any JSON whatsoever
into a value or an AdminResponseError (hypothesis), never another exception."""

from __future__ import annotations

import contextlib
import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.admin import (
    NSQDAPI,
    AdminEndpoint,
    AdminHTTPError,
    AdminResponseError,
    ChannelNotFound,
    ChannelStats,
    LookupdAPI,
    LookupdProducer,
    TopicNotFound,
    http_error,
    parse_lookupd_info,
    parse_lookupd_nodes,
    parse_nsqd_info,
    parse_nsqd_stats,
    parse_topic_lookup,
)
from nsq_sansio.errors import ConfigError, InvalidName
from nsq_sansio.http_client import HTTPAnswer, HTTPClient

SAMPLES = Path(__file__).parent / "samples"


def sample(name: str) -> Any:
    return json.loads((SAMPLES / name).read_text())


def body(document: Any) -> bytes:
    return json.dumps(document).encode()


# --- recorded answers of the real v1.3.0 -----------------------------------------------------


def test_real_stats_read_into_dataclasses() -> None:
    stats = parse_nsqd_stats(body(sample("nsqd-1.3.0-stats.json")))
    assert stats.version == "1.3.0" and stats.health == "OK" and stats.start_time > 0
    assert [t.name for t in stats.topics] == ["t1", "t2"]
    t1 = stats.topics[0]
    assert (t1.depth, t1.message_count, t1.message_bytes, t1.paused) == (0, 6, 14, False)
    assert [c.name for c in t1.channels] == ["c1", "tail"]
    c1, tail = t1.channels
    assert (c1.depth, c1.message_count, c1.client_count, c1.clients) == (6, 6, 0, ())
    assert c1.topic == "t1" and c1.lag == 6
    # nsqd tracks e2e latency here (--e2e-processing-latency-percentile=0.99,0.5): nanoseconds
    # in the JSON, seconds in the dataclass
    assert tail.e2e_latency is not None and tail.e2e_latency.count == 5
    assert tail.e2e_latency.percentile(0.99) == pytest.approx(0.243207772)
    assert tail.e2e_latency.percentile(0.75) is None
    assert t1.e2e_latency is not None and t1.e2e_latency.count == 5
    (client,) = tail.clients
    assert client.user_agent == "nsq_tail/1.3.0 go-nsq/1.1.0"
    assert (client.state, client.ready_count, client.finish_count) == (3, 200, 5)
    assert client.tls is False and client.pub_counts == ()
    (producer,) = stats.producers
    assert [(p.topic, p.count) for p in producer.pub_counts] == [("t1", 1)]
    assert stats.memory is not None and stats.memory.next_gc_bytes == 4194304
    assert stats.channel("t1", "tail") == tail
    assert stats.channel("t1", "nope") is None and stats.topic("nope") is None


def test_real_info_durations_in_seconds() -> None:
    info = parse_nsqd_info(body(sample("nsqd-1.3.0-info.json")))
    assert info.version == "1.3.0" and (info.tcp_port, info.http_port) == (24150, 24151)
    assert info.max_heartbeat_interval == 60.0 and info.max_output_buffer_timeout == 30.0
    assert (info.max_output_buffer_size, info.max_deflate_level) == (65536, 6)


def test_real_lookupd_answers() -> None:
    (node,) = parse_lookupd_nodes(body(sample("lookupd-1.3.0-nodes.json")))
    assert node.topics == ("t1", "t2") and node.tombstoned_topics == ()
    assert (node.tcp_address, node.http_address) == ("127.0.0.1:24150", "127.0.0.1:24151")
    found = parse_topic_lookup("t1", body(sample("lookupd-1.3.0-lookup.json")))
    assert found.channels == ("c1", "tail")
    assert [p.http_address for p in found.producers] == ["127.0.0.1:24151"]
    nodes = sample("lookupd-1.3.0-nodes.json")
    nodes["producers"][0]["tombstones"] = [False, True]  # aligned with "topics": t2, t1
    (node,) = parse_lookupd_nodes(body(nodes))
    assert node.tombstoned_topics == ("t1",)
    assert parse_lookupd_info(b'{"version":"1.3.0"}').version == "1.3.0"


def test_old_envelope_is_unwrapped() -> None:
    """nsqd and nsqlookupd before 1.0 wrapped every answer in status_code/status_txt/data."""
    wrapped = {"status_code": 200, "status_txt": "OK", "data": sample("nsqd-1.3.0-stats.json")}
    assert parse_nsqd_stats(body(wrapped)) == parse_nsqd_stats(
        body(sample("nsqd-1.3.0-stats.json"))
    )
    old = {"status_code": 200, "status_txt": "OK", "data": {"producers": [{"address": "h"}]}}
    assert parse_topic_lookup("t", body(old)).producers[0].broadcast_address == "h"


def test_nil_slices_and_missing_fields() -> None:
    """Go's nil slices are null; an older nsqd leaves fields out: both read as empty/0."""
    stats = parse_nsqd_stats(b'{"version":"1.3.0","topics":null,"producers":null}')
    assert stats.topics == () and stats.producers == () and stats.memory is None
    assert stats.health == "OK"
    one = {"topics": [{"topic_name": "t", "channels": [{"channel_name": "c", "clients": None}]}]}
    chan = parse_nsqd_stats(body(one)).topics[0].channels[0]
    assert chan.clients == () and chan.client_count == 0 and chan.e2e_latency is None
    no_percentiles = {"count": 0, "percentiles": None}
    one["topics"][0]["channels"][0]["e2e_processing_latency"] = no_percentiles
    assert parse_nsqd_stats(body(one)).topics[0].channels[0].e2e_latency is None


# --- lag ---------------------------------------------------------------------------------------


def _channel(**counts: int) -> ChannelStats:
    fields: dict[str, Any] = dict.fromkeys(
        (
            "depth",
            "backend_depth",
            "in_flight_count",
            "deferred_count",
            "message_count",
            "requeue_count",
            "timeout_count",
            "client_count",
            "topic_depth",
        ),
        0,
    )
    fields.update(counts)
    return ChannelStats(topic="t", name="c", paused=False, clients=(), e2e_latency=None, **fields)


def test_lag_counts_everything_not_finished_once() -> None:
    # depth already includes backend_depth (nsqd: memory queue + disk queue)
    assert _channel(depth=10, backend_depth=7).lag == 10
    assert _channel(in_flight_count=3).lag == 3
    assert _channel(deferred_count=4).lag == 4
    assert _channel(topic_depth=5).lag == 5  # waiting in the (paused) topic
    assert _channel(depth=1, in_flight_count=2, deferred_count=3, topic_depth=4).lag == 10
    # counters since creation are history, not lag
    assert _channel(message_count=100, requeue_count=9, timeout_count=8).lag == 0


def test_lag_from_a_stats_answer_includes_the_topic_depth() -> None:
    document = {
        "topics": [
            {
                "topic_name": "t",
                "depth": 7,
                "paused": True,
                "channels": [
                    {
                        "channel_name": "c",
                        "depth": 2,
                        "backend_depth": 1,
                        "in_flight_count": 3,
                        "deferred_count": 4,
                    }
                ],
            }
        ]
    }
    chan = parse_nsqd_stats(body(document)).channel("t", "c")
    assert chan is not None and chan.topic_depth == 7 and chan.lag == 16


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "text", "kind", "message"),
    [
        (404, b'{"message":"TOPIC_NOT_FOUND"}', TopicNotFound, "TOPIC_NOT_FOUND"),
        (404, b'{"message":"CHANNEL_NOT_FOUND"}', ChannelNotFound, "CHANNEL_NOT_FOUND"),
        (404, b'{"message":"NOT_FOUND"}', AdminHTTPError, "NOT_FOUND"),
        (400, b'{"message":"INVALID_TOPIC"}', AdminHTTPError, "INVALID_TOPIC"),
        (500, b"NOK - disk full", AdminHTTPError, "NOK - disk full"),
        (
            500,
            b'{"status_code":404,"status_txt":"TOPIC_NOT_FOUND","data":null}',
            TopicNotFound,
            "TOPIC_NOT_FOUND",
        ),
        (503, b"", AdminHTTPError, ""),
    ],
)
def test_error_statuses_become_typed_errors(
    status: int, text: bytes, kind: type[AdminHTTPError], message: str
) -> None:
    error = http_error(status, text, "POST", "/topic/delete?topic=x", "http://h:4151")
    assert type(error) is kind and error.message == message
    assert "http://h:4151 POST /topic/delete?topic=x" in str(error)
    request = NSQDAPI.delete_topic("x")
    with pytest.raises(kind) as raised:
        request.read(HTTPAnswer(status, text), "http://h:4151")
    assert raised.value.target == "/topic/delete?topic=x"


def test_stats_derived_not_found_errors_name_the_call() -> None:
    answer = HTTPAnswer(200, body(sample("nsqd-1.3.0-stats.json")))
    with pytest.raises(ChannelNotFound) as raised:
        NSQDAPI.channel_stats("t1", "nope").read(answer, "http://h:1")
    assert raised.value.status == 404 and raised.value.endpoint == "http://h:1"
    with pytest.raises(TopicNotFound):
        NSQDAPI.channel_stats("nope", "c").read(answer)
    with pytest.raises(TopicNotFound):
        NSQDAPI.topic_stats("nope").read(answer)
    assert NSQDAPI.topic_stats("t2").read(answer).name == "t2"


def test_bad_names_fail_before_any_request() -> None:
    with pytest.raises(InvalidName):
        NSQDAPI.create_topic("bad name!")
    with pytest.raises(InvalidName):
        NSQDAPI.pause_channel("ok", "x" * 65)
    with pytest.raises(InvalidName):
        LookupdAPI.lookup("")
    with pytest.raises(ConfigError):
        LookupdAPI.tombstone("t", "no-port")


def test_request_targets_are_url_encoded() -> None:
    request = NSQDAPI.stats("t#ephemeral", "c", include_clients=False)
    assert request.method == "GET"
    assert request.target("/prefix") == (
        "/prefix/stats?format=json&topic=t%23ephemeral&channel=c"
        "&include_clients=false&include_mem=false"
    )
    producer = LookupdProducer("r", "h", "::1", 4150, 4151, "1.3.0")
    assert (
        LookupdAPI.tombstone("t", producer).target()
        == "/topic/tombstone?topic=t&node=%5B%3A%3A1%5D%3A4151"
    )


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("127.0.0.1:4151", AdminEndpoint("127.0.0.1", 4151)),
        ("nsqd.example", AdminEndpoint("nsqd.example", 4151)),
        ("https://[::1]:4152/nsq/", AdminEndpoint("::1", 4152, True, "/nsq")),
        (" http://h:1 ", AdminEndpoint("h", 1)),
        ("http://h:1/a b/ñ", AdminEndpoint("h", 1, False, "/a%20b/%C3%B1")),
        ("http://bücher.example", AdminEndpoint("bücher.example", 4151)),
    ],
)
def test_endpoints(url: str, expected: AdminEndpoint) -> None:
    endpoint = AdminEndpoint.parse(url, 4151)
    assert endpoint == expected
    HTTPClient(endpoint.host_header).request("GET", NSQDAPI.ping().target(endpoint.path_prefix))


@pytest.mark.parametrize(
    "url",
    [
        "ftp://h",
        "http://h:0",
        "http://h:99999",
        "http://h?x=1",
        "http://u@h",
        "::1",
        "",
        "http://a..b:1",
        "http://h x:1",
    ],
)
def test_bad_endpoints(url: str) -> None:
    with pytest.raises(ConfigError):
        AdminEndpoint.parse(url, 4151)


# --- any JSON ----------------------------------------------------------------------------------

PARSERS = [
    parse_nsqd_stats,
    parse_nsqd_info,
    parse_lookupd_info,
    parse_lookupd_nodes,
    lambda data: parse_topic_lookup("t", data),
    lambda data: NSQDAPI.channel_stats("t1", "tail").read(HTTPAnswer(200, data)),
    lambda data: LookupdAPI.topics().read(HTTPAnswer(200, data)),
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**400, -(10**400)])  # beyond a float
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Lists and objects of ``children``, with the keys the parsers look for."""
    return st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(
            [
                "topics",
                "channels",
                "producers",
                "clients",
                "topic_name",
                "channel_name",
                "depth",
                "e2e_processing_latency",
                "percentiles",
                "quantile",
                "value",
                "pub_counts",
                "tombstones",
                "memory",
                "status_code",
                "data",
                "version",
                "max_heartbeat_interval",
            ]
        )
        | st.text(max_size=6),
        children,
        max_size=5,
    )


json_values = st.recursive(scalars, _containers, max_leaves=30)


def _check(parse: Any, data: bytes) -> None:
    with contextlib.suppress(AdminResponseError, AdminHTTPError):
        parse(data)


@settings(max_examples=300, deadline=None)
@given(document=json_values)
def test_any_json_gives_a_value_or_a_typed_error(document: Any) -> None:
    data = json.dumps(document).encode()
    for parse in PARSERS:
        _check(parse, data)


def _leaves(document: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(document, dict):
        for key, value in document.items():
            found += _leaves(value, (*path, key))
    elif isinstance(document, list):
        for i, value in enumerate(document):
            found += _leaves(value, (*path, i))
    return found


REAL_DOCUMENTS = [
    sample("nsqd-1.3.0-stats.json"),
    sample("nsqd-1.3.0-info.json"),
    sample("lookupd-1.3.0-nodes.json"),
    sample("lookupd-1.3.0-lookup.json"),
]


@settings(max_examples=400, deadline=None)
@given(data=st.data(), replacement=scalars | json_values)
def test_real_answers_with_any_part_replaced(data: st.DataObject, replacement: Any) -> None:
    """Deep mutations: one node anywhere in a real answer becomes arbitrary JSON."""
    document = copy.deepcopy(data.draw(st.sampled_from(REAL_DOCUMENTS)))
    path = data.draw(st.sampled_from(_leaves(document)))
    if not path:
        document = replacement
    else:
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = replacement
    encoded = json.dumps(document).encode()
    for parse in PARSERS:
        _check(parse, encoded)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64))
def test_any_bytes_give_a_value_or_a_typed_error(raw: bytes) -> None:
    for parse in PARSERS:
        _check(parse, raw)
    for status in (200, 404, 500):
        error = http_error(status, raw)
        assert isinstance(error, AdminHTTPError) and error.status >= 100


def test_absurd_numbers_and_nesting_are_typed_errors() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    huge = '{"max_heartbeat_interval": ' + "9" * 400 + "}"
    latency = {"count": 1, "percentiles": [{"quantile": float("nan"), "value": 1}]}
    nan = {"topics": [{"topic_name": "t", "e2e_processing_latency": latency}]}
    for data in (deep, huge.encode(), json.dumps(nan).encode(), b"\xff\xfe", b"1e999999"):
        for parse in PARSERS:
            _check(parse, data)
    with pytest.raises(AdminResponseError, match="finite"):
        parse_nsqd_stats(json.dumps(nan).encode())
    assert math.isfinite(parse_nsqd_info(b'{"max_heartbeat_interval": 1}').max_heartbeat_interval)

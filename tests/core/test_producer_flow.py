"""Producer flow on ClientConnection: PUB, MPUB, DPUB answered in order, per-request results."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_sansio import (
    ClientConnection,
    ConnectionClosed,
    ConnectionLost,
    ConnectionState,
    Heartbeat,
    LocalProtocolError,
    MessageTakenBack,
    ProtocolError,
    frames,
)
from nsq_sansio import errors as E
from nsq_sansio.events import PublishAcknowledged, PublishFailed

from ._helpers import (
    HEARTBEAT,
    MID,
    OK,
    error,
    identify_answer,
    ready_conn,
    response,
    subscribed_conn,
)
from ._servers import ServerStream


def test_each_publish_kind_encodes_and_returns_increasing_request_ids() -> None:
    conn = ready_conn()
    first = conn.publish("t", b"one")
    second = conn.multi_publish("t", [b"a", b"bc"])
    third = conn.deferred_publish("t", b"later", 1.5)
    assert first < second < third
    assert conn.pending_requests == (first, second, third)
    assert conn.data_to_send() == (
        b"PUB t\n\x00\x00\x00\x03one"
        b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"
        b"DPUB t 1500\n\x00\x00\x00\x05later"
    )


def test_answers_are_correlated_in_order_even_when_split_and_mixed_with_heartbeats() -> None:
    conn = ready_conn()
    ids = [conn.publish("t", b"m%d" % i) for i in range(3)]
    stream = OK + HEARTBEAT + OK + OK
    events = []
    for byte in range(len(stream)):
        events.extend(conn.receive_data(stream[byte : byte + 1]))
    assert events == [
        PublishAcknowledged(ids[0]),
        Heartbeat(),
        PublishAcknowledged(ids[1]),
        PublishAcknowledged(ids[2]),
    ]
    assert conn.pending_requests == ()
    assert conn.data_to_send().count(b"NOP\n") == 1
    assert conn.state is ConnectionState.READY


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        ("E_PUB_FAILED", E.PubFailed),
        ("E_MPUB_FAILED", E.MPubFailed),
        ("E_DPUB_FAILED", E.DPubFailed),
        ("E_BAD_TOPIC", E.BadTopic),
        ("E_BAD_MESSAGE", E.BadMessage),
        ("E_UNAUTHORIZED", E.Unauthorized),
    ],
)
def test_error_answer_fails_its_request_and_closes_reporting_the_rest(
    code: str, error_type: type[E.ServerError]
) -> None:
    conn = ready_conn()
    a, b, c = (conn.publish("t", b"x") for _ in range(3))
    events = conn.receive_data(OK + error(f"{code} nope".encode()))
    assert events[0] == PublishAcknowledged(a)
    failed = events[1]
    assert isinstance(failed, PublishFailed) and failed.request_id == b
    assert isinstance(failed.error, error_type) and failed.error.code == code
    assert failed.error.text == "nope"
    closed = events[2]
    assert isinstance(closed, ConnectionClosed) and closed.error is failed.error
    assert closed.pending_requests == (c,)
    assert len(events) == 3
    assert conn.state is ConnectionState.CLOSED
    with pytest.raises(LocalProtocolError, match="CLOSED"):
        conn.publish("t", b"x")


def test_non_fatal_error_does_not_consume_a_publish_answer() -> None:
    conn = subscribed_conn()
    rid = conn.publish("other", b"x")
    events = conn.receive_data(error(b"E_FIN_FAILED FIN " + MID + b" failed") + OK)
    assert isinstance(events[0], MessageTakenBack)
    assert events[1] == PublishAcknowledged(rid)


def test_non_ok_answer_to_a_publish_is_a_protocol_error() -> None:
    conn = ready_conn()
    rid = conn.publish("t", b"x")
    other = conn.publish("t", b"y")
    events = conn.receive_data(response(b"WHAT"))
    closed = events[-1]
    assert isinstance(closed, ConnectionClosed) and isinstance(closed.error, ProtocolError)
    # the answered request must not vanish: failed explicitly, or reported as unanswered
    failed = [e.request_id for e in events if isinstance(e, PublishFailed)]
    assert sorted(failed + list(closed.pending_requests)) == [rid, other]


def test_eof_reports_unanswered_publishes() -> None:
    conn = ready_conn()
    ids = (conn.publish("t", b"x"), conn.multi_publish("t", [b"y"]))
    [closed] = conn.receive_data(b"")
    assert isinstance(closed, ConnectionClosed) and isinstance(closed.error, ConnectionLost)
    assert closed.pending_requests == ids


def test_publish_validation_happens_before_anything_is_queued() -> None:
    conn = ready_conn()
    bad_calls: list[Callable[[], object]] = [
        lambda: conn.publish("bad topic", b"x"),
        lambda: conn.publish("t", b""),
        lambda: conn.multi_publish("t", []),
        lambda: conn.multi_publish("t", [b"ok", b""]),
        lambda: conn.deferred_publish("t", b"x", -1),
        lambda: conn.deferred_publish("t", b"x", float("nan")),
        lambda: conn.deferred_publish("t", b"x", float("inf")),
    ]
    for call in bad_calls:
        with pytest.raises(LocalProtocolError):
            call()
    assert conn.pending_requests == () and conn.data_to_send() == b""
    assert conn.publish("t", b"x") == 1  # no request id was burnt


def test_publish_before_identify_answer_names_the_state() -> None:
    conn = ClientConnection()
    with pytest.raises(LocalProtocolError, match="IDENTIFYING"):
        conn.publish("t", b"x")


def test_publish_allowed_while_subscribed_and_answers_interleave_with_sub() -> None:
    conn = ready_conn()
    conn.subscribe("t", "c")
    rid = conn.publish("t", b"x")
    events = conn.receive_data(OK + OK)
    assert [type(e).__name__ for e in events] == ["Subscribed", "PublishAcknowledged"]
    assert events[1] == PublishAcknowledged(rid)


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_producer_over_compression(kind: str) -> None:
    conn = ClientConnection({kind: True})
    conn.data_to_send()
    server = ServerStream(kind)
    conn.receive_data(identify_answer(**{kind: True}) + server.compress(OK))
    ids = [conn.publish("t", b"body %d" % i) for i in range(3)]
    wire = server.decompress(conn.data_to_send())
    assert wire.count(b"PUB t\n") == 3
    events = conn.receive_data(server.compress(OK + OK) + server.compress(OK))
    assert events == [PublishAcknowledged(i) for i in ids]


_TOPICS = st.sampled_from(["t", "events", "a.b-c_d", "x" * 64, "e#ephemeral", "", "bad topic"])
_BODIES = st.one_of(
    st.binary(max_size=64),
    st.builds(bytearray, st.binary(min_size=1, max_size=8)),
    st.just("text"),
)


@given(st.lists(st.tuples(_TOPICS, _BODIES), min_size=1, max_size=30))
def test_pub_bytes_and_errors_match_the_encoder_with_the_topic_cache(
    publishes: list[tuple[str, object]],
) -> None:
    """publish() keeps each topic's validated header; what it sends and what it refuses stay
    exactly what frames.encode_pub sends and refuses, first time or not."""
    conn = ready_conn()
    expected: list[bytes] = []
    for topic, body in publishes:
        try:
            wire = frames.encode_pub(topic, body)  # type: ignore[arg-type]
        except (E.InvalidName, LocalProtocolError) as exc:
            with pytest.raises(type(exc)):
                conn.publish(topic, body)  # type: ignore[arg-type]
        else:
            conn.publish(topic, body)  # type: ignore[arg-type]
            expected.append(wire)
    assert conn.data_to_send() == b"".join(expected)
    assert len(conn.pending_requests) == len(expected)

"""PUBs coalesced into one MPUB by ClientConnection.publish(..., coalesce=True): what goes on the
wire, and that every request id still gets exactly one answer of its own, in order."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_sansio import ConnectionClosed, ConnectionState
from nsq_sansio.connection import COALESCE_BYTES
from nsq_sansio.errors import BadMessage, CoalescedPublishRefused, ProtocolError
from nsq_sansio.events import PublishAcknowledged, PublishFailed

from ._helpers import OK, error, ready_conn, response

_U32 = struct.Struct(">I")


def commands(wire: bytes) -> list[tuple[str, str, list[bytes]]]:
    """Parse PUB / MPUB / DPUB commands the way nsqd reads them: (verb, topic, bodies)."""
    parsed: list[tuple[str, str, list[bytes]]] = []
    at = 0
    while at < len(wire):
        end = wire.index(b"\n", at)
        verb, topic, *_ = wire[at:end].decode().split(" ")
        (size,) = _U32.unpack_from(wire, end + 1)
        body = wire[end + 5 : end + 5 + size]
        assert len(body) == size
        at = end + 5 + size
        if verb == "MPUB":
            (count,) = _U32.unpack_from(body)
            bodies, offset = [], 4
            for _ in range(count):
                (length,) = _U32.unpack_from(body, offset)
                bodies.append(body[offset + 4 : offset + 4 + length])
                offset += 4 + length
            assert offset == len(body)
            parsed.append((verb, topic, bodies))
        else:
            parsed.append((verb, topic, [body]))
    return parsed


def test_pubs_to_one_topic_queued_together_go_out_as_one_mpub() -> None:
    conn = ready_conn()
    ids = [conn.publish("t", b"m%d" % i, coalesce=True) for i in range(5)]
    assert ids == list(range(ids[0], ids[0] + 5))
    assert conn.pending_requests == tuple(ids)
    assert commands(conn.data_to_send()) == [("MPUB", "t", [b"m%d" % i for i in range(5)])]
    assert conn.receive_data(OK) == [PublishAcknowledged(i) for i in ids]
    assert conn.pending_requests == ()


def test_a_write_ends_the_group_and_a_lone_pub_stays_a_pub() -> None:
    conn = ready_conn()
    first = conn.publish("t", b"a", coalesce=True)
    assert commands(conn.data_to_send()) == [("PUB", "t", [b"a"])]
    second = conn.publish("t", b"b", coalesce=True)
    third = conn.publish("t", b"c", coalesce=True)
    assert commands(conn.data_to_send()) == [("MPUB", "t", [b"b", b"c"])]
    events = conn.receive_data(OK + OK)
    assert events == [
        PublishAcknowledged(first),
        PublishAcknowledged(second),
        PublishAcknowledged(third),
    ]


def test_what_does_not_join() -> None:
    conn = ready_conn()
    a = conn.publish("t", b"a", coalesce=True)
    b = conn.publish("u", b"b", coalesce=True)  # another topic
    c = conn.publish("u", b"c")  # not asked to coalesce
    d = conn.publish("u", b"d", coalesce=True)
    e = conn.multi_publish("u", [b"e"])  # another command in between
    f = conn.publish("u", b"f", coalesce=True)
    g = conn.deferred_publish("u", b"g", 1.0)
    h = conn.publish("u", bytearray(b"h"), coalesce=True)  # not bytes: a PUB of its own
    i = conn.publish("u", b"i", coalesce=True)
    assert commands(conn.data_to_send()) == [
        ("PUB", "t", [b"a"]),
        ("PUB", "u", [b"b"]),
        ("PUB", "u", [b"c"]),
        ("PUB", "u", [b"d"]),
        ("MPUB", "u", [b"e"]),
        ("PUB", "u", [b"f"]),
        ("DPUB", "u", [b"g"]),
        ("PUB", "u", [b"h"]),
        ("PUB", "u", [b"i"]),
    ]
    assert conn.receive_data(OK * 9) == [
        PublishAcknowledged(x) for x in (a, b, c, d, e, f, g, h, i)
    ]


def test_a_group_stops_growing_at_coalesce_bytes() -> None:
    conn = ready_conn()
    body = b"x" * (COALESCE_BYTES // 4)
    ids = [conn.publish("t", body, coalesce=True) for _ in range(6)]
    sent = commands(conn.data_to_send())
    assert [(verb, len(bodies)) for verb, _, bodies in sent] == [("MPUB", 4), ("MPUB", 2)]
    assert conn.receive_data(OK + OK) == [PublishAcknowledged(i) for i in ids]


def test_a_refused_group_fails_each_member_with_coalesced_publish_refused() -> None:
    conn = ready_conn()
    before = conn.publish("t", b"alone")
    ids = [conn.publish("t", b"m%d" % i, coalesce=True) for i in range(3)]
    after = conn.publish("t", b"after")
    conn.data_to_send()
    events = conn.receive_data(OK + error(b"E_BAD_MESSAGE MPUB message too big 9 > 8"))
    assert events[0] == PublishAcknowledged(before)
    refused = events[1:4]
    assert [e.request_id for e in refused] == ids
    for event in refused:
        assert isinstance(event, PublishFailed)
        assert isinstance(event.error, CoalescedPublishRefused)
        assert isinstance(event.error.error, BadMessage)
    closed = events[4]
    assert isinstance(closed, ConnectionClosed)
    assert closed.pending_requests == (after,)
    assert conn.state is ConnectionState.CLOSED


def test_closing_with_a_group_open_reports_every_member_unanswered() -> None:
    conn = ready_conn()
    ids = [conn.publish("t", b"m%d" % i, coalesce=True) for i in range(4)]
    closed = conn.close()
    assert closed is not None
    assert closed.pending_requests == tuple(ids)
    assert conn.data_to_send() == b""


def test_a_group_answered_with_something_else_than_ok_is_a_protocol_error() -> None:
    conn = ready_conn()
    ids = [conn.publish("t", b"m%d" % i, coalesce=True) for i in range(2)]
    conn.data_to_send()
    events = conn.receive_data(response(b"NOT OK"))
    assert [type(e) for e in events] == [PublishFailed, PublishFailed, ConnectionClosed]
    assert [e.request_id for e in events[:2]] == ids  # type: ignore[union-attr]
    assert isinstance(events[2].error, ProtocolError)  # type: ignore[union-attr]


_op = st.one_of(
    st.tuples(
        st.just("pub"), st.sampled_from("tu"), st.binary(min_size=1, max_size=40), st.booleans()
    ),
    st.tuples(
        st.just("mpub"),
        st.sampled_from("tu"),
        st.lists(st.binary(min_size=1, max_size=9), min_size=1, max_size=3),
        st.just(False),
    ),
    st.tuples(st.just("write"), st.just(""), st.just(b""), st.just(False)),
)


@given(st.lists(_op, max_size=40), st.integers(min_value=0, max_value=3))
def test_every_publish_is_on_the_wire_once_in_order_and_answered_once(
    ops: list[tuple[str, str, object, bool]], refuse_at: int
) -> None:
    """Whatever the mix of coalescing PUBs, other PUBs, MPUBs and writes: the wire carries every
    body once, in publish order; OKs acknowledge every request id once, in order; a refusal
    fails exactly the ids of the refused command (members of a coalesced one with
    CoalescedPublishRefused) and reports the rest unanswered."""
    conn = ready_conn()
    expected: list[tuple[str, list[bytes]]] = []  # (topic, bodies) per request id
    ids: list[int] = []
    wire = b""
    for verb, topic, payload, coalesce in ops:
        if verb == "pub":
            assert isinstance(payload, bytes)
            ids.append(conn.publish(topic, payload, coalesce=coalesce))
            expected.append((topic, [payload]))
        elif verb == "mpub":
            assert isinstance(payload, list)
            ids.append(conn.multi_publish(topic, payload))
            expected.append((topic, payload))
        else:
            wire += conn.data_to_send()
    wire += conn.data_to_send()
    assert ids == sorted(set(ids))
    sent = commands(wire)
    assert [b for _, topic, bodies in sent for b in bodies] == [b for _, bs in expected for b in bs]
    # Each command's topic is its bodies' topic; a command answers a run of consecutive ids.
    runs: list[list[int]] = []
    position = 0
    for verb, topic, bodies in sent:
        taken = 0
        run: list[int] = []
        while taken < len(bodies):
            assert expected[position][0] == topic
            taken += len(expected[position][1])
            run.append(ids[position])
            position += 1
        assert taken == len(bodies)
        assert len(run) == 1 or verb == "MPUB"
        runs.append(run)
    assert conn.pending_requests == tuple(ids)
    refused = min(refuse_at, len(runs))
    events = conn.receive_data(OK * refused) if refused else []  # b"" would be end of stream
    assert events == [PublishAcknowledged(i) for run in runs[:refused] for i in run]
    if refused < len(runs):
        events = conn.receive_data(error(b"E_PUB_FAILED nope"))
        failed = [e for e in events if isinstance(e, PublishFailed)]
        assert [e.request_id for e in failed] == runs[refused]
        coalesced = len(runs[refused]) > 1
        assert all(isinstance(e.error, CoalescedPublishRefused) == coalesced for e in failed)
        closed = events[-1]
        assert isinstance(closed, ConnectionClosed)
        assert closed.pending_requests == tuple(i for run in runs[refused + 1 :] for i in run)


@pytest.mark.parametrize("coalesce", [False, True])
def test_one_pub_at_a_time_is_the_same_bytes_either_way(coalesce: bool) -> None:
    conn = ready_conn()
    conn.publish("t", b"body", coalesce=coalesce)
    assert conn.data_to_send() == b"PUB t\n\x00\x00\x00\x04body"

"""nsqd's side of protocol V2, command by command: answers, error codes and texts, fatality."""

from __future__ import annotations

import json
import struct

import pytest

from nsq_sansio import frames
from nsq_sansio.errors import LocalProtocolError
from nsq_sansio.server import ClientState, CloseConnection, StartTLS

from ._wire import ERROR, MESSAGE, RESPONSE, Client, make_node


def _sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_bad_magic_gets_e_bad_protocol_and_close() -> None:
    node = make_node()
    client = Client(node, magic=False)
    client.send(b"  V1")
    assert client.frames() == [(ERROR, b"E_BAD_PROTOCOL")]
    assert client.closed
    assert node.connection_state(client.id) is ClientState.CLOSED


def test_magic_may_arrive_one_byte_at_a_time() -> None:
    node = make_node()
    client = Client(node, magic=False)
    for byte in b"  V2NOP\n":
        client.send(bytes([byte]))
    assert node.connection_state(client.id) is ClientState.INIT
    assert client.frames() == []


def test_identify_answers_nsqd_json_with_negotiated_values() -> None:
    node = make_node(max_rdy_count=321, max_msg_timeout=120.0)
    client = Client(node)
    answer = client.identify(
        client_id="c1",
        hostname="h",
        user_agent="ua/1",
        heartbeat_interval=5000,
        msg_timeout=30000,
        sample_rate=0,
        output_buffer_size=1024,
        output_buffer_timeout=100,
    )
    assert answer == {
        "max_rdy_count": 321,
        "version": "1.3.0",
        "max_msg_timeout": 120000,
        "msg_timeout": 30000,
        "tls_v1": False,
        "deflate": False,
        "deflate_level": 6,
        "max_deflate_level": 6,
        "snappy": False,
        "sample_rate": 0,
        "auth_required": False,
        "output_buffer_size": 1024,
        "output_buffer_timeout": 100,
    }
    stats = node.stats(0.0)
    assert stats["topics"] == []


def test_identify_without_feature_negotiation_answers_ok() -> None:
    client = Client(make_node())
    assert client.identify(feature_negotiation=False) == b"OK"


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("heartbeat_interval", 999, "IDENTIFY heartbeat interval (999) is invalid"),
        ("heartbeat_interval", 60001, "IDENTIFY heartbeat interval (60001) is invalid"),
        ("msg_timeout", 999, "IDENTIFY msg timeout (999) is invalid"),
        ("msg_timeout", 900001, "IDENTIFY msg timeout (900001) is invalid"),
        ("sample_rate", 100, "IDENTIFY sample rate (100) is invalid"),
        ("output_buffer_size", 63, "IDENTIFY output buffer size (63) is invalid"),
        ("output_buffer_timeout", 40000, "IDENTIFY output buffer timeout (40000) is invalid"),
    ],
)
def test_identify_out_of_range_values_are_fatal_bad_body(field: str, value: int, text: str) -> None:
    client = Client(make_node())
    client.send(frames.encode_identify({field: value}))
    assert client.frames() == [(ERROR, f"E_BAD_BODY {text}".encode())]
    assert client.closed


@pytest.mark.parametrize(
    "body", [b"not json", b"[1,2]", b'{"heartbeat_interval": "x"}', b'{"tls_v1": 1}', b"[" * 5000]
)
def test_identify_bad_json_is_fatal(body: bytes) -> None:
    client = Client(make_node())
    client.send(b"IDENTIFY\n" + _sized(body))
    assert client.frames() == [(ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")]
    assert client.closed


@pytest.mark.parametrize(
    ("size", "text"), [(0, "invalid body size 0"), (-5, "invalid body size -5")]
)
def test_identify_bad_sizes(size: int, text: str) -> None:
    client = Client(make_node())
    client.send(b"IDENTIFY\n" + struct.pack(">i", size))
    assert client.frames() == [(ERROR, f"E_BAD_BODY IDENTIFY {text}".encode())]


def test_identify_body_too_big_is_refused_before_it_arrives() -> None:
    client = Client(make_node(max_body_size=2_000_000))
    client.send(b"IDENTIFY\n" + struct.pack(">i", 2_000_001))
    assert client.frames() == [(ERROR, b"E_BAD_BODY IDENTIFY body too big 2000001 > 2000000")]
    assert client.closed


def test_identify_both_compressions_is_e_identify_failed() -> None:
    client = Client(make_node())
    client.send(
        frames.encode_identify({"feature_negotiation": True, "snappy": True, "deflate": True})
    )
    assert client.frames() == [
        (ERROR, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")
    ]
    assert client.closed


def test_identify_after_sub_is_invalid() -> None:
    client = Client(make_node())
    client.sub("t", "c")
    client.send(frames.encode_identify({}))
    assert client.frames() == [(ERROR, b"E_INVALID cannot IDENTIFY in current state")]
    assert client.closed


def test_unknown_command_is_fatal_invalid() -> None:
    client = Client(make_node())
    client.send(b"BOGUS x\n")
    assert client.frames() == [(ERROR, b"E_INVALID invalid command BOGUS")]
    assert client.closed


def test_crlf_line_endings_are_accepted() -> None:
    client = Client(make_node())
    client.send(b"SUB t c\r\n")
    assert client.responses() == [b"OK"]


def test_command_line_too_long_closes_without_reading_it() -> None:
    node = make_node(max_command_line=100)
    client = Client(node)
    client.send(b"PUB " + b"a" * 200)
    assert client.closed
    assert client.frames() == []


def test_sub_validation() -> None:
    node = make_node()
    c1 = Client(node)
    c1.send(b"SUB bad!topic c\n")
    assert c1.frames() == [(ERROR, b'E_BAD_TOPIC SUB topic name "bad!topic" is not valid')]
    assert c1.closed
    c2 = Client(node)
    c2.send(b"SUB t bad!chan\n")
    assert c2.frames() == [(ERROR, b'E_BAD_CHANNEL SUB channel name "bad!chan" is not valid')]
    c3 = Client(node)
    c3.send(b"SUB t\n")
    assert c3.frames() == [(ERROR, b"E_INVALID SUB insufficient number of parameters")]
    c4 = Client(node)
    c4.identify(heartbeat_interval=-1)
    c4.send(frames.encode_sub("t", "c"))
    assert c4.frames() == [(ERROR, b"E_INVALID cannot SUB with heartbeats disabled")]
    c5 = Client(node)
    c5.sub("t", "c")
    c5.send(frames.encode_sub("t", "c"))
    assert c5.frames() == [(ERROR, b"E_INVALID cannot SUB in current state")]


def test_max_channel_consumers() -> None:
    node = make_node(max_channel_consumers=1)
    Client(node).sub("t", "c")
    second = Client(node)
    second.send(frames.encode_sub("t", "c"))
    assert second.frames() == [
        (ERROR, b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
    ]
    assert second.closed


def test_rdy_rules() -> None:
    node = make_node(max_rdy_count=10)
    early = Client(node)
    early.send(frames.encode_rdy(1))
    assert early.frames() == [(ERROR, b"E_INVALID cannot RDY in current state")]
    assert early.closed
    over = Client(node)
    over.sub("t", "c")
    over.send(b"RDY 11\n")
    assert over.frames() == [(ERROR, b"E_INVALID RDY count 11 out of range 0-10")]
    assert over.closed
    garbage = Client(node)
    garbage.sub("t", "c")
    garbage.send(b"RDY -1\n")
    assert garbage.frames() == [(ERROR, b"E_INVALID RDY could not parse count -1")]
    bare = Client(node)
    bare.sub("t2", "c")
    bare.send(b"RDY\n")  # nsqd: no count means 1
    Client(node).pub("t2", b"x")
    Client(node).pub("t2", b"y")
    assert [m.body for m in bare.messages()] == [b"x"]


def test_fin_unknown_id_is_non_fatal() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=1)
    client.send(b"FIN 0123456789abcdef\n")
    assert client.frames() == [
        (ERROR, b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
    ]
    assert not client.closed
    client.send(b"REQ 0123456789abcdef 0\n")
    client.send(b"TOUCH 0123456789abcdef\n")
    assert [data for _, data in client.frames()] == [
        b"E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight",
        b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight",
    ]
    assert not client.closed
    Client(node).pub("t", b"still served")
    assert [m.body for m in client.messages()] == [b"still served"]


def test_fin_of_message_owned_by_another_client() -> None:
    node = make_node()
    a, b = Client(node), Client(node)
    a.sub("t", "c", rdy=1)
    b.sub("t", "c", rdy=0)
    Client(node).pub("t", b"m")
    (msg,) = a.messages()
    b.send(frames.encode_fin(msg.id))
    assert b.frames() == [
        (ERROR, b"E_FIN_FAILED FIN " + msg.id + b" failed client does not own message")
    ]
    a.send(frames.encode_fin(msg.id))
    assert a.frames() == []


def test_fin_with_malformed_id_is_fatal() -> None:
    client = Client(make_node())
    client.sub("t", "c")
    client.send(b"FIN short\n")
    assert client.frames() == [(ERROR, b"E_INVALID invalid message ID")]
    assert client.closed


def test_fin_before_sub_is_fatal() -> None:
    client = Client(make_node())
    client.send(b"FIN 0123456789abcdef\n")
    assert client.frames() == [(ERROR, b"E_INVALID cannot FIN in current state")]
    assert client.closed


def test_req_timeout_is_clamped_not_refused() -> None:
    node = make_node(max_req_timeout=10.0)
    client = Client(node)
    client.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = client.messages()
    client.send(b"REQ " + msg.id + b" 99999999\n")
    assert client.frames() == []
    assert node.stats(0.0)["topics"][0]["channels"][0]["deferred_count"] == 1
    node.handle_timer(9.9)
    assert client.messages() == []
    node.handle_timer(10.0)
    (again,) = client.messages()
    assert again.id == msg.id and again.attempts == 2


def test_req_unparsable_timeout_is_fatal() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = client.messages()
    client.send(b"REQ " + msg.id + b" soon\n")
    assert client.frames() == [(ERROR, b"E_INVALID REQ could not parse timeout soon")]
    assert client.closed


def test_cls_answers_close_wait_and_stops_delivery() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=5)
    client.send(frames.encode_cls())
    assert client.frames() == [(RESPONSE, b"CLOSE_WAIT")]
    client.send(frames.encode_rdy(5))  # ignored after CLS, as nsqd does
    Client(node).pub("t", b"m")
    assert client.frames() == []
    assert node.connection_state(client.id) is ClientState.CLOSING
    client.send(frames.encode_cls())
    assert client.frames() == [(ERROR, b"E_INVALID cannot CLS in current state")]


def test_fin_still_works_after_cls() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=5)
    Client(node).pub("t", b"m")
    (msg,) = client.messages()
    client.send(frames.encode_cls())
    client.send(frames.encode_fin(msg.id))
    assert client.frames() == [(RESPONSE, b"CLOSE_WAIT")]
    assert node.stats(0.0)["topics"][0]["channels"][0]["in_flight_count"] == 0


def test_pub_rules() -> None:
    node = make_node(max_msg_size=10)
    ok = Client(node)
    assert ok.pub("t", b"0123456789") == b"OK"
    big = Client(node)
    big.send(b"PUB t\n" + struct.pack(">i", 11))
    assert big.frames() == [(ERROR, b"E_BAD_MESSAGE PUB message too big 11 > 10")]
    assert big.closed
    empty = Client(node)
    empty.send(b"PUB t\n" + struct.pack(">i", 0))
    assert empty.frames() == [(ERROR, b"E_BAD_MESSAGE PUB invalid message body size 0")]
    bad = Client(node)
    bad.send(b"PUB t!\n" + _sized(b"x"))
    assert bad.frames() == [(ERROR, b'E_BAD_TOPIC PUB topic name "t!" is not valid')]
    short = Client(node)
    short.send(b"PUB\n")
    assert short.frames() == [(ERROR, b"E_INVALID PUB insufficient number of parameters")]


def test_mpub_rules() -> None:
    node = make_node(max_msg_size=10, max_body_size=100)
    assert Client(node).send(frames.encode_mpub("t", [b"a", b"b"])) == []
    cases = [
        (b"MPUB t\n" + struct.pack(">i", 101), b"E_BAD_BODY MPUB body too big 101 > 100"),
        (b"MPUB t\n" + _sized(struct.pack(">i", 0)), b"E_BAD_BODY MPUB invalid message count 0"),
        (b"MPUB t\n" + _sized(struct.pack(">i", 50)), b"E_BAD_BODY MPUB invalid message count 50"),
        (
            b"MPUB t\n" + _sized(struct.pack(">ii", 2, 1) + b"a"),
            b"E_BAD_MESSAGE MPUB failed to read message(1) body size",
        ),
        (
            b"MPUB t\n" + _sized(struct.pack(">iii", 1, 11, 0) + b"a" * 7),
            b"E_BAD_MESSAGE MPUB message too big 11 > 10",
        ),
        (
            b"MPUB t\n" + _sized(struct.pack(">ii", 1, 0)),
            b"E_BAD_MESSAGE MPUB invalid message(0) body size 0",
        ),
        (
            b"MPUB t\n" + _sized(struct.pack(">ii", 1, 5) + b"ab"),
            b"E_BAD_MESSAGE MPUB failed to read message body",
        ),
        (
            b"MPUB t\n" + _sized(struct.pack(">ii", 1, 1) + b"abc"),
            b"E_BAD_BODY MPUB body size 11 does not match its messages (9 bytes)",
        ),
        (b"MPUB t#\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "t#" is not valid'),
    ]
    for data, expected in cases:
        client = Client(node)
        client.send(data)
        assert client.frames() == [(ERROR, expected)], expected
        assert client.closed
    # a failed MPUB publishes nothing
    assert node.stats(0.0)["topics"][0]["message_count"] == 2


def test_dpub_rules() -> None:
    node = make_node(max_req_timeout=10.0)
    client = Client(node)
    client.send(b"DPUB t 10001\n" + _sized(b"x"))
    assert client.frames() == [(ERROR, b"E_INVALID DPUB timeout 10001 out of range 0-10000")]
    client2 = Client(node)
    client2.send(b"DPUB t x\n")
    assert client2.frames() == [(ERROR, b"E_INVALID DPUB could not parse timeout x")]
    client3 = Client(node)
    client3.send(b"DPUB t\n")
    assert client3.frames() == [(ERROR, b"E_INVALID DPUB insufficient number of parameters")]
    client4 = Client(node)
    client4.send(b"DPUB t 10000\n" + _sized(b"x"))
    assert client4.responses() == [b"OK"]


def test_max_defer_timeout_overrides_max_req_timeout() -> None:
    node = make_node(max_req_timeout=10.0, max_defer_timeout=20.0)
    client = Client(node)
    client.send(b"DPUB t 15000\n" + _sized(b"x"))
    assert client.responses() == [b"OK"]


def test_tls_required_refuses_everything_but_identify() -> None:
    node = make_node(tls_available=True, tls_required=True)
    client = Client(node)
    client.send(b"PUB t\n" + _sized(b"x"))
    assert client.frames() == [(ERROR, b"E_INVALID cannot PUB in current state (TLS required)")]
    assert client.closed


def test_tls_upgrade_hands_trailing_bytes_to_the_transport() -> None:
    node = make_node(tls_available=True)
    client = Client(node)
    client.send(frames.encode_identify({"feature_negotiation": True, "tls_v1": True}) + b"\x16\x03")
    (event,) = client.events
    assert event == StartTLS(client.id, b"\x16\x03")
    _kind, answer = client.frames()[0]
    assert json.loads(answer)["tls_v1"] is True
    with pytest.raises(LocalProtocolError):
        client.send(b"more")
    node.tls_established(client.id, 0.0)
    assert client.frames() == [(RESPONSE, b"OK")]
    client.sub("t", "c")
    assert node.stats(0.0)["topics"][0]["channels"][0]["clients"][0]["tls"] is True


def test_no_tls_offered_without_a_certificate() -> None:
    client = Client(make_node())
    assert client.identify(tls_v1=True)["tls_v1"] is False
    assert client.events == []


def test_eof_mid_frame_closes_and_keeps_serving_others() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=10)
    vanishing = Client(node)
    vanishing.send(b"PUB t\n" + struct.pack(">i", 100) + b"partial")
    vanishing.send(b"")
    assert vanishing.closed
    assert Client(node).pub("t", b"after") == b"OK"
    assert [m.body for m in consumer.messages()] == [b"after"]


def test_closed_connection_ids_are_quietly_ignored_unknown_ones_are_errors() -> None:
    node = make_node()
    client = Client(node)
    client.send(b"BOGUS\n")
    assert client.closed
    assert client.raw().startswith(b"\x00")  # the final error frame, then the record is gone
    assert node.receive_data(client.id, b"NOP\n", 1.0) == []
    assert node.data_to_send(client.id) == b""
    assert node.connection_lost(client.id, 1.0) == []
    with pytest.raises(LocalProtocolError):
        node.receive_data(999, b"NOP\n", 1.0)


def test_messages_carry_nsqd_frame_layout() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=1)
    Client(node).pub("t", b"body", now=2.5)
    ((kind, data),) = client.frames()
    assert kind == MESSAGE
    msg = frames.decode_message(data)
    assert msg.body == b"body" and msg.attempts == 1 and msg.timestamp == 2_500_000_000
    assert len(msg.id) == 16 and int(msg.id, 16) >= 0


def test_connection_events_name_their_connection() -> None:
    node = make_node()
    client = Client(node)
    (event,) = client.send(b"BAD\n")
    assert isinstance(event, CloseConnection)
    assert event.conn_id == client.id
    assert event.reason == "fatal error: E_INVALID invalid command BAD"
    assert event.error is not None and event.error.code == "E_INVALID" and event.error.fatal


def test_deflate_level_is_capped_and_defaults_to_six() -> None:
    node = make_node(max_deflate_level=4)
    assert Client(node).identify(deflate=True, deflate_level=9)["deflate_level"] == 4
    assert Client(make_node()).identify(deflate=True)["deflate_level"] == 6
    assert Client(make_node()).identify(deflate=True, deflate_level=2)["deflate_level"] == 2


def test_compression_not_offered_when_disabled() -> None:
    answer = Client(make_node(snappy=False, deflate=False)).identify(snappy=True)
    assert answer["snappy"] is False and answer["deflate"] is False


def test_output_buffer_minus_one_disables_buffering() -> None:
    answer = Client(make_node()).identify(output_buffer_size=-1, output_buffer_timeout=-1)
    assert answer["output_buffer_size"] == 1 and answer["output_buffer_timeout"] == 0


def test_identify_twice_is_allowed_before_sub_like_nsqd() -> None:
    client = Client(make_node())
    assert client.identify(msg_timeout=5000)["msg_timeout"] == 5000
    assert client.identify(msg_timeout=6000)["msg_timeout"] == 6000


def test_eof_during_tls_handshake_closes() -> None:
    node = make_node(tls_available=True)
    client = Client(node)
    client.send(frames.encode_identify({"feature_negotiation": True, "tls_v1": True}))
    client.send(b"")
    assert client.closed
    with pytest.raises(LocalProtocolError):
        node.tls_established(999, 0.0)


def test_tls_established_out_of_turn_is_a_local_error() -> None:
    node = make_node(tls_available=True)
    client = Client(node)
    with pytest.raises(LocalProtocolError):
        node.tls_established(client.id, 0.0)


def test_shutdown_closes_every_connection_and_refuses_new_ones() -> None:
    node = make_node()
    a, b = Client(node), Client(node)
    events = node.close(1.0)
    assert sorted(e.conn_id for e in events if isinstance(e, CloseConnection)) == [a.id, b.id]
    assert node.close(2.0) == []
    with pytest.raises(LocalProtocolError):
        node.connect(2.0, "x:1")


def test_output_pending_counts_unsent_bytes() -> None:
    node = make_node()
    client = Client(node)
    client.sub("t", "c", rdy=10)
    node.publish("t", b"x" * 100, 0.0)
    assert node.output_pending(client.id) == 8 + 26 + 100
    client.raw()
    assert node.output_pending(client.id) == 0

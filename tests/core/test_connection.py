"""ClientConnection: negotiation, upgrades, AUTH, SUB/RDY/FIN/REQ/TOUCH, heartbeats, errors, CLS."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio import (
    ClientConnection,
    CloseWait,
    ConnectionClosed,
    ConnectionLost,
    ConnectionReady,
    ConnectionState,
    FrameTooLarge,
    Heartbeat,
    LocalProtocolError,
    Message,
    MessageTakenBack,
    ProtocolError,
    ServerError,
    Subscribed,
    TLSUpgradeRequired,
)
from nsq_sansio import errors as E
from nsq_sansio.events import AuthResult, ServerSettings
from nsq_sansio.frames import MAGIC_V2

from ._helpers import (
    CLOSE_WAIT,
    HEARTBEAT,
    MID,
    MID2,
    OK,
    error,
    identify_answer,
    message,
    ready_conn,
    response,
    subscribed_conn,
)
from ._servers import ServerStream

S = ConnectionState

FULL_ANSWER = {
    "max_rdy_count": 500,
    "version": "1.3.0",
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def closed_with(events: Sequence[object]) -> ConnectionClosed:
    closes = [e for e in events if isinstance(e, ConnectionClosed)]
    assert len(closes) == 1, events
    assert events[-1] is closes[0], "ConnectionClosed must be the last event"
    return closes[0]


# --- construction and IDENTIFY --------------------------------------------------------------


def test_construction_queues_magic_then_identify_with_feature_negotiation() -> None:
    conn = ClientConnection({"client_id": "me", "heartbeat_interval": 5000})
    assert conn.state is S.IDENTIFYING
    out = conn.data_to_send()
    assert out.startswith(MAGIC_V2 + b"IDENTIFY\n")
    body = out[len(MAGIC_V2) + len(b"IDENTIFY\n") + 4 :]
    assert int.from_bytes(out[13:17], "big") == len(body)
    assert json.loads(body) == {
        "client_id": "me",
        "heartbeat_interval": 5000,
        "feature_negotiation": True,
    }
    assert conn.data_to_send() == b""
    assert conn.heartbeat_interval == 5.0


def test_construction_refuses_bad_identify_fields() -> None:
    with pytest.raises(LocalProtocolError, match="exclusive"):
        ClientConnection({"snappy": True, "deflate": True})
    with pytest.raises(LocalProtocolError, match="heartbeat_interval"):
        ClientConnection({"heartbeat_interval": "30s"})
    with pytest.raises(LocalProtocolError):
        ClientConnection(max_frame_size=10)


def test_plain_ok_from_old_server_means_no_negotiation() -> None:
    conn = ClientConnection()
    conn.data_to_send()
    events = conn.receive_data(OK)
    assert events == [ConnectionReady(ServerSettings.default(), None)]
    assert conn.state is S.READY
    assert conn.settings is not None and conn.settings.negotiated is False
    assert conn.max_rdy_count == 2500
    assert conn.data_to_send() == b""


def test_json_answer_keeps_every_negotiated_field() -> None:
    conn = ClientConnection()
    answer = dict(FULL_ANSWER, extra_field="kept in raw")
    [ready] = conn.receive_data(identify_answer(**answer))
    assert isinstance(ready, ConnectionReady)
    s = ready.settings
    assert s is conn.settings and s.negotiated
    assert (s.max_rdy_count, s.msg_timeout, s.max_msg_timeout) == (500, 60000, 900000)
    assert (s.tls_v1, s.snappy, s.deflate, s.deflate_level, s.max_deflate_level) == (
        False,
        False,
        False,
        6,
        6,
    )
    assert (s.auth_required, s.sample_rate, s.output_buffer_size, s.output_buffer_timeout) == (
        False,
        0,
        16384,
        250,
    )
    assert s.version == "1.3.0"
    assert s.raw["extra_field"] == "kept in raw"
    assert conn.max_rdy_count == 500


@pytest.mark.parametrize(
    "payload",
    [
        b'{"max_rdy_count": "many"}',
        b'{"max_rdy_count": 0}',
        b'{"tls_v1": "yes"}',
        b'{"version": 13}',
        b'{"msg_timeout": true}',
        b"[1, 2]",
        b"{not json",
        b"\xff\xfe",
        b"[" * 100_000,  # deep nesting must not escape as RecursionError
        b'{"snappy": true}',  # a feature that was not asked for
    ],
)
def test_bad_identify_answer_closes_with_protocol_error(payload: bytes) -> None:
    conn = ClientConnection()
    closed = closed_with(conn.receive_data(response(payload)))
    assert isinstance(closed.error, ProtocolError)
    assert conn.state is S.CLOSED


def test_tls_requested_from_an_old_server_is_refused_for_good() -> None:
    conn = ClientConnection({"tls_v1": True})
    closed = closed_with(conn.receive_data(OK))
    assert isinstance(closed.error, E.TLSUnavailable) and "tls_v1" in str(closed.error)
    assert isinstance(closed.error, E.IncompatibleNSQD)  # reconnecting cannot help


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_compression_requested_from_an_old_server_is_refused_for_good(feature: str) -> None:
    # Asked for is required: the connection does not go on uncompressed without a word.
    conn = ClientConnection({feature: True})
    closed = closed_with(conn.receive_data(OK))
    assert isinstance(closed.error, E.CompressionUnavailable)
    assert closed.error.feature == feature and "too old" in str(closed.error)


def test_tls_requested_but_not_granted_is_refused_for_good() -> None:
    conn = ClientConnection({"tls_v1": True})
    closed = closed_with(conn.receive_data(identify_answer(tls_v1=False)))
    assert isinstance(closed.error, E.TLSUnavailable) and "--tls-cert" in str(closed.error)


def test_server_enabling_both_compressions_is_refused() -> None:
    conn = ClientConnection({"snappy": True})
    closed = closed_with(conn.receive_data(identify_answer(snappy=True, deflate=True)))
    assert isinstance(closed.error, ProtocolError)


# --- TLS upgrade ------------------------------------------------------------------------------


def test_tls_upgrade_at_exactly_the_byte_after_the_identify_answer() -> None:
    conn = ClientConnection({"tls_v1": True})
    conn.data_to_send()
    tls_bytes = b"\x16\x03\x01\x00\x05hello"  # whatever follows belongs to the TLS layer
    events = conn.receive_data(identify_answer(tls_v1=True) + tls_bytes)
    assert events == [TLSUpgradeRequired(tls_bytes)]
    assert conn.state is S.TLS_HANDSHAKE
    assert conn.data_to_send() == b""
    with pytest.raises(LocalProtocolError, match="TLS_HANDSHAKE"):
        conn.receive_data(b"more")
    conn.tls_established()
    assert conn.state is S.AWAITING_TLS_OK
    [ready] = conn.receive_data(OK)  # read through TLS
    assert isinstance(ready, ConnectionReady) and ready.settings.tls_v1
    assert conn.state is S.READY


def test_tls_upgrade_with_the_answer_split_anywhere() -> None:
    stream = identify_answer(tls_v1=True) + b"TLSDATA"
    for cut in range(1, len(stream)):
        conn = ClientConnection({"tls_v1": True})
        events = conn.receive_data(stream[:cut])
        if conn.state is S.TLS_HANDSHAKE:
            assert events == [TLSUpgradeRequired(stream[len(stream) - 7 : cut])]
            continue
        assert events == []
        assert conn.receive_data(stream[cut:]) == [TLSUpgradeRequired(b"TLSDATA")]


def test_tls_established_in_wrong_state_names_the_state() -> None:
    with pytest.raises(LocalProtocolError, match="IDENTIFYING"):
        ClientConnection().tls_established()


def test_eof_during_tls_handshake_closes() -> None:
    conn = ClientConnection({"tls_v1": True})
    conn.receive_data(identify_answer(tls_v1=True))
    closed = closed_with(conn.receive_data(b""))
    assert isinstance(closed.error, ConnectionLost)


def test_non_ok_after_tls_is_fatal() -> None:
    conn = ClientConnection({"tls_v1": True})
    conn.receive_data(identify_answer(tls_v1=True))
    conn.tls_established()
    closed = closed_with(conn.receive_data(response(b"NOPE")))
    assert isinstance(closed.error, ProtocolError)


# --- compression upgrade ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
@pytest.mark.parametrize("split", [False, True])
def test_compression_switches_right_after_the_identify_answer(kind: str, split: bool) -> None:
    conn = ClientConnection({kind: True})
    conn.data_to_send()
    server = ServerStream(kind)
    answer = identify_answer(**{kind: True, "deflate_level": 3})
    compressed = server.compress(OK)
    if split:
        assert conn.receive_data(answer) == []
        assert conn.state is S.AWAITING_COMPRESSION_OK
        events = conn.receive_data(compressed)
    else:
        events = conn.receive_data(answer + compressed)
    assert len(events) == 1 and isinstance(events[0], ConnectionReady)
    assert getattr(events[0].settings, kind)
    assert conn.state is S.READY
    # the client's output is compressed from now on
    conn.subscribe("t", "c")
    assert server.decompress(conn.data_to_send()) == b"SUB t c\n"
    conn.receive_data(server.compress(OK))
    conn.send_ready(3)
    conn.receive_data(server.compress(message(body=b"compressed body") + HEARTBEAT))
    conn.finish(MID)
    assert server.decompress(conn.data_to_send()) == b"RDY 3\nNOP\nFIN " + MID + b"\n"


def test_tls_then_snappy_reads_ok_through_tls_then_compressed_ok() -> None:
    conn = ClientConnection({"tls_v1": True, "snappy": True})
    conn.data_to_send()
    [upgrade] = conn.receive_data(identify_answer(tls_v1=True, snappy=True))
    assert isinstance(upgrade, TLSUpgradeRequired)
    conn.tls_established()
    server = ServerStream("snappy")
    # plain OK (through TLS), then the snappy-compressed OK, in one read
    events = conn.receive_data(OK + server.compress(OK))
    assert [type(e) for e in events] == [ConnectionReady]
    assert conn.state is S.READY
    conn.nop()
    assert server.decompress(conn.data_to_send()) == b"NOP\n"


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_corrupt_compressed_stream_closes_with_compression_error(kind: str) -> None:
    conn = ClientConnection({kind: True})
    closed = closed_with(conn.receive_data(identify_answer(**{kind: True}) + b"\x00garbage" * 4))
    assert isinstance(closed.error, E.CompressionError)


def test_invalid_deflate_level_in_answer_does_not_break_the_connection() -> None:
    conn = ClientConnection({"deflate": True})
    server = ServerStream("deflate")
    events = conn.receive_data(
        identify_answer(deflate=True, deflate_level=12) + server.compress(OK)
    )
    assert [type(e) for e in events] == [ConnectionReady]


# --- AUTH -------------------------------------------------------------------------------------


def test_auth_when_required_and_answer_kept() -> None:
    conn = ClientConnection(auth_secret="token")
    conn.data_to_send()
    assert conn.receive_data(identify_answer(auth_required=True)) == []
    assert conn.state is S.AUTHENTICATING
    assert conn.data_to_send() == b"AUTH\n\x00\x00\x00\x05token"
    with pytest.raises(LocalProtocolError, match="AUTHENTICATING"):
        conn.subscribe("t", "c")
    answer = {"identity": "svc", "identity_url": "http://id/svc", "permission_count": 2, "x": 1}
    [ready] = conn.receive_data(response(json.dumps(answer).encode()))
    assert isinstance(ready, ConnectionReady)
    assert ready.auth == AuthResult("svc", "http://id/svc", 2)
    assert conn.auth is ready.auth and conn.auth.raw["x"] == 1
    assert conn.state is S.READY


def test_auth_is_compressed_when_compression_is_on() -> None:
    conn = ClientConnection({"deflate": True}, auth_secret=b"s")
    conn.data_to_send()
    server = ServerStream("deflate")
    conn.receive_data(identify_answer(deflate=True, auth_required=True) + server.compress(OK))
    assert conn.state is S.AUTHENTICATING
    assert server.decompress(conn.data_to_send()) == b"AUTH\n\x00\x00\x00\x01s"


def test_auth_required_without_secret_closes() -> None:
    conn = ClientConnection()
    closed = closed_with(conn.receive_data(identify_answer(auth_required=True)))
    assert isinstance(closed.error, E.NSQError) and "secret" in str(closed.error)


@pytest.mark.parametrize(
    ("frame", "error_type"),
    [
        (error(b"E_AUTH_FAILED auth server down"), E.AuthFailed),
        (error(b"E_UNAUTHORIZED no permissions"), E.Unauthorized),
        (response(b"not json"), ProtocolError),
        (response(b'{"permission_count": "2"}'), ProtocolError),
        (response(b'"just a string"'), ProtocolError),
    ],
)
def test_auth_failures_close(frame: bytes, error_type: type[Exception]) -> None:
    conn = ClientConnection(auth_secret=b"s")
    conn.receive_data(identify_answer(auth_required=True))
    closed = closed_with(conn.receive_data(frame))
    assert isinstance(closed.error, error_type)


# --- SUB / RDY / messages / FIN / REQ / TOUCH ----------------------------------------------------


def test_subscribe_flow() -> None:
    conn = ready_conn()
    conn.subscribe("events", "archive#ephemeral")
    assert conn.state is S.SUBSCRIBING
    assert conn.data_to_send() == b"SUB events archive#ephemeral\n"
    assert conn.receive_data(OK) == [Subscribed("events", "archive#ephemeral")]
    assert conn.state is S.SUBSCRIBED
    assert (conn.topic, conn.channel) == ("events", "archive#ephemeral")


def test_subscribe_validates_names_without_changing_state() -> None:
    conn = ready_conn()
    with pytest.raises(E.InvalidName):
        conn.subscribe("bad topic", "c")
    assert conn.state is S.READY and conn.data_to_send() == b""


def test_sub_refused_by_server_is_fatal() -> None:
    conn = ready_conn()
    conn.subscribe("t", "c")
    closed = closed_with(conn.receive_data(error(b"E_BAD_CHANNEL SUB channel name is not valid")))
    assert isinstance(closed.error, E.BadChannel) and closed.error.fatal


def test_rdy_bounds_follow_max_rdy_count() -> None:
    conn = ClientConnection()
    conn.receive_data(identify_answer(max_rdy_count=100))
    conn.subscribe("t", "c")
    conn.send_ready(0)  # allowed while SUBSCRIBING: nsqd handles commands in order
    conn.send_ready(100)
    assert conn.data_to_send().endswith(b"RDY 0\nRDY 100\n")
    assert conn.rdy == conn.rdy_remaining == 100
    for bad in (101, -1):
        with pytest.raises(LocalProtocolError, match=r"0\.\.100"):
            conn.send_ready(bad)
    for not_int in (1.0, True, "5"):
        with pytest.raises(LocalProtocolError):
            conn.send_ready(not_int)  # type: ignore[arg-type]
    assert conn.rdy == 100


def test_messages_tracked_in_flight_and_rdy_remaining_counts_down() -> None:
    conn = subscribed_conn(rdy=2)
    events = conn.receive_data(message(MID, b"one", 5, 1) + message(MID2, b"two", 6, 3))
    assert events == [Message(MID, b"one", 5, 1), Message(MID2, b"two", 6, 3)]
    assert conn.in_flight == {MID, MID2} and conn.in_flight_count == 2
    assert conn.rdy_remaining == 0 and conn.rdy == 2
    conn.receive_data(message(b"a" * 16))  # nsqd may overshoot after a lowered RDY: never negative
    assert conn.rdy_remaining == 0


def test_fin_req_touch_bytes_and_in_flight_bookkeeping() -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID) + message(MID2))
    conn.touch(MID)
    assert conn.is_in_flight(MID)
    conn.finish(MID)
    conn.requeue(MID2, delay=2.5)
    assert conn.data_to_send() == (
        b"TOUCH " + MID + b"\nFIN " + MID + b"\nREQ " + MID2 + b" 2500\n"
    )
    assert conn.in_flight_count == 0
    for command in (conn.finish, conn.touch, lambda mid: conn.requeue(mid, 0)):
        with pytest.raises(LocalProtocolError, match="not in flight") as info:
            command(MID)
        assert f"message {MID.decode()} is" in str(info.value)  # hex text, not a bytes repr
    assert conn.data_to_send() == b""


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), 1e300, "1", True])
def test_bad_requeue_delay_leaves_message_in_flight(delay: object) -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID))
    with pytest.raises(LocalProtocolError):
        conn.requeue(MID, delay)  # type: ignore[arg-type]
    assert conn.is_in_flight(MID)
    assert conn.data_to_send() == b""
    conn.requeue(MID, 0)
    assert conn.data_to_send() == b"REQ " + MID + b" 0\n"


def test_message_before_subscribing_is_a_protocol_error() -> None:
    conn = ready_conn()
    closed = closed_with(conn.receive_data(message()))
    assert isinstance(closed.error, ProtocolError)


def test_message_frame_shorter_than_header_is_a_protocol_error() -> None:
    conn = subscribed_conn()
    closed = closed_with(conn.receive_data(b"\x00\x00\x00\x10\x00\x00\x00\x02" + b"\x00" * 12))
    assert isinstance(closed.error, ProtocolError)


@pytest.mark.parametrize("kind", [bytearray, memoryview])
def test_receive_data_accepts_bytearray_and_memoryview(kind: type) -> None:
    conn = subscribed_conn()
    raw = bytearray(message(MID, b"body"))
    events = conn.receive_data(kind(raw))
    assert events == [Message(MID, b"body", 1_700_000_000_000_000_000, 1)]
    msg = events[0]
    assert isinstance(msg, Message)
    assert type(msg.body) is bytes and type(msg.id) is bytes
    raw[-4:] = b"XXXX"  # the transport reuses its buffer
    assert msg.body == b"body"
    conn.finish(MID)


# --- heartbeats -----------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["identifying", "ready", "subscribed", "closing"])
def test_heartbeat_answered_with_nop_by_the_core(state: str) -> None:
    if state == "identifying":
        conn = ClientConnection()
        conn.data_to_send()
    elif state == "ready":
        conn = ready_conn()
    else:
        conn = subscribed_conn()
        if state == "closing":
            conn.close()
            conn.data_to_send()
    before = conn.state
    assert conn.receive_data(HEARTBEAT) == [Heartbeat()]
    assert conn.data_to_send() == b"NOP\n"
    assert conn.state is before


def test_heartbeat_does_not_consume_a_pending_answer() -> None:
    conn = ready_conn()
    conn.subscribe("t", "c")
    events = conn.receive_data(HEARTBEAT + OK)
    assert events == [Heartbeat(), Subscribed("t", "c")]


# --- server errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "command", "error_type"),
    [
        ("E_FIN_FAILED", "FIN", E.FinFailed),
        ("E_REQ_FAILED", "REQ", E.ReqFailed),
        ("E_TOUCH_FAILED", "TOUCH", E.TouchFailed),
    ],
)
def test_late_answer_errors_are_non_fatal_and_tied_to_the_message(
    code: str, command: str, error_type: type[ServerError]
) -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID) + message(MID2))
    if command == "FIN":
        conn.finish(MID)
    elif command == "REQ":
        conn.requeue(MID)
    else:
        conn.touch(MID)
    text = f"{command} {MID.decode()} failed ID not in flight"
    [event] = conn.receive_data(error(f"{code} {text}".encode()))
    assert isinstance(event, MessageTakenBack)
    assert event.message_id == MID and event.command == command
    assert isinstance(event.error, error_type)
    assert (event.error.code, event.error.text, event.error.fatal) == (code, text, False)
    assert conn.state is S.SUBSCRIBED and conn.is_in_flight(MID2)
    conn.finish(MID2)  # still usable


def _finish_each(conn: ClientConnection, ids: list[object]) -> object:
    """finish() on each id until one is refused: (error type and text) or None."""
    for message_id in ids:
        try:
            conn.finish(message_id)  # type: ignore[arg-type]
        except LocalProtocolError as exc:
            return (type(exc), str(exc))
    return None


@settings(max_examples=200, deadline=None)
@given(
    picks=st.lists(st.one_of(st.integers(0, 7), st.sampled_from(["short", "text", "list"]))),
    state=st.sampled_from(["SUBSCRIBED", "CLOSING", "READY"]),
)
def test_finish_many_is_all_or_nothing_finish_on_each(picks: list[object], state: str) -> None:
    """finish_many(ids) writes what finish() on each writes when every id is in flight once;
    otherwise it writes nothing, keeps every id in flight, and raises what finish() raises
    for the first id it refuses."""
    mids = [b"%016d" % i for i in range(8)]
    odd = {"short": b"abc", "text": "0" * 16, "list": [1]}
    ids = [mids[p] if isinstance(p, int) else odd[str(p)] for p in picks]

    def fresh() -> ClientConnection:
        conn = ready_conn() if state == "READY" else subscribed_conn()
        if state != "READY":
            conn.receive_data(b"".join(message(m) for m in mids[:6]))  # 6 and 7: never sent
        if state == "CLOSING":
            conn.close()
        conn.data_to_send()
        return conn

    each = fresh()
    expected = _finish_each(each, ids)
    many = fresh()
    if expected is None:
        many.finish_many(ids)  # type: ignore[arg-type]
        assert many.data_to_send() == each.data_to_send()
        assert many.in_flight == each.in_flight
        return
    before = many.in_flight
    with pytest.raises(LocalProtocolError) as raised:
        many.finish_many(ids)  # type: ignore[arg-type]
    assert (type(raised.value), str(raised.value)) == expected
    assert many.data_to_send() == b"" and many.in_flight == before


def test_late_answer_error_without_an_id_still_reported() -> None:
    conn = subscribed_conn()
    [event] = conn.receive_data(error(b"E_FIN_FAILED"))
    assert isinstance(event, MessageTakenBack) and event.message_id is None


@pytest.mark.parametrize(
    ("code", "error_type"),
    [
        ("E_INVALID", E.InvalidCommand),
        ("E_BAD_BODY", E.BadBody),
        ("E_BAD_TOPIC", E.BadTopic),
        ("E_BAD_CHANNEL", E.BadChannel),
        ("E_BAD_MESSAGE", E.BadMessage),
        ("E_PUB_FAILED", E.PubFailed),
        ("E_MPUB_FAILED", E.MPubFailed),
        ("E_DPUB_FAILED", E.DPubFailed),
        ("E_AUTH_FAILED", E.AuthFailed),
        ("E_UNAUTHORIZED", E.Unauthorized),
        ("E_SOMETHING_NEW", ServerError),
    ],
)
def test_every_other_error_is_fatal_typed_and_keeps_code_and_text(
    code: str, error_type: type[ServerError]
) -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID))
    closed = closed_with(
        conn.receive_data(error(f"{code} some text here".encode()) + message(MID2))
    )
    assert type(closed.error) is error_type
    assert isinstance(closed.error, ServerError)
    assert (closed.error.code, closed.error.text, closed.error.fatal) == (
        code,
        "some text here",
        True,
    )
    assert closed.in_flight == (MID,)
    assert conn.state is S.CLOSED and conn.in_flight_count == 0
    assert conn.receive_data(message(b"x" * 16)) == []


def test_error_frame_followed_by_garbage_gives_one_close_event() -> None:
    conn = subscribed_conn()
    events = conn.receive_data(error(b"E_INVALID bad") + b"\x00\x00\x00\x01")
    assert isinstance(closed_with(events).error, E.InvalidCommand)


@pytest.mark.parametrize(
    "frame",
    [
        b"E_BAD_BODY IDENTIFY output buffer timeout (10) is invalid",
        b"E_BAD_BODY IDENTIFY msg timeout (3600000) is invalid",
        b"E_INVALID cannot IDENTIFY in current state",
    ],
)
def test_refused_identify_is_a_config_error_carrying_nsqds_answer(frame: bytes) -> None:
    conn = ClientConnection({"output_buffer_timeout": 10})
    closed = closed_with(conn.receive_data(error(frame)))
    assert isinstance(closed.error, E.IdentifyRejected)
    assert isinstance(closed.error, E.ConfigError)  # the configuration's fault: do not retry
    server_error = ServerError.from_frame(frame)
    assert type(closed.error.error) is type(server_error)
    assert (closed.error.code, closed.error.text) == (server_error.code, server_error.text)
    assert frame.decode() in str(closed.error)
    assert conn.state is S.CLOSED


def test_server_error_from_frame_edge_cases() -> None:
    assert ServerError.from_frame(b"").code == "E_UNKNOWN"
    err = ServerError.from_frame(b"E_INVALID \xff bad utf8")
    assert isinstance(err, E.InvalidCommand) and "bad utf8" in err.text
    assert str(ServerError.from_frame(b"E_BAD_TOPIC")) == "E_BAD_TOPIC"


# --- framing faults -------------------------------------------------------------------------


def test_unknown_frame_type_is_fatal() -> None:
    conn = ClientConnection()
    closed = closed_with(conn.receive_data(b"\x00\x00\x00\x06\x00\x00\x00\x07OK"))
    assert isinstance(closed.error, ProtocolError)


def test_unexpected_response_is_fatal() -> None:
    conn = subscribed_conn()
    closed = closed_with(conn.receive_data(OK))
    assert isinstance(closed.error, ProtocolError)


@pytest.mark.parametrize("header", [b"\x00\x01\x00\x01", b"\x80\x00\x00\x00", b"\xff\xff\xff\xff"])
def test_oversized_frame_refused_at_its_size_field(header: bytes) -> None:
    conn = ClientConnection(max_frame_size=64 * 1024)
    closed = closed_with(conn.receive_data(header))
    assert isinstance(closed.error, FrameTooLarge)
    assert closed.error.size == int.from_bytes(header, "big")


def test_unfinished_frame_memory_is_bounded_when_fed_in_tiny_chunks() -> None:
    conn = subscribed_conn()
    frame = message(body=b"x" * (1 << 18))
    tracemalloc.start()
    try:
        for start in range(0, len(frame) - 2, 2):
            assert conn.receive_data(frame[start : start + 2]) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 4 * len(frame), f"{held} bytes held for an unfinished {len(frame)}-byte frame"
    [msg] = conn.receive_data(frame[len(frame) - 2 - (len(frame) - 2) % 2 :])
    assert isinstance(msg, Message) and len(msg.body) == 1 << 18


# --- EOF, close, CLS ------------------------------------------------------------------------


def test_eof_before_close_wait_is_connection_lost_with_what_was_unanswered() -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID) + b"\x00\x00")
    closed = closed_with(conn.receive_data(b""))
    assert isinstance(closed.error, ConnectionLost) and "SUBSCRIBED" in str(closed.error)
    assert closed.in_flight == (MID,)
    assert conn.state is S.CLOSED
    assert conn.receive_data(b"") == []


def test_cls_close_wait_then_clean_eof() -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID))
    assert conn.close() is None
    assert conn.state is S.CLOSING
    assert conn.data_to_send() == b"CLS\n"
    assert conn.close() is None and conn.data_to_send() == b""  # idempotent
    assert conn.receive_data(CLOSE_WAIT) == [CloseWait()]
    assert conn.rdy == 0
    with pytest.raises(LocalProtocolError, match="CLOSING"):
        conn.send_ready(1)
    conn.send_ready(0)
    conn.finish(MID)  # in-flight messages may still be answered
    assert conn.data_to_send() == b"RDY 0\nFIN " + MID + b"\n"
    closed = closed_with(conn.receive_data(b""))
    assert closed.error is None and closed.in_flight == ()
    assert conn.state is S.CLOSED


def test_messages_racing_cls_are_still_delivered() -> None:
    conn = subscribed_conn()
    conn.close()
    events = conn.receive_data(message(MID) + CLOSE_WAIT)
    assert [type(e) for e in events] == [Message, CloseWait]
    assert conn.is_in_flight(MID)


def test_wrong_answer_to_cls_is_fatal() -> None:
    conn = subscribed_conn()
    conn.close()
    assert isinstance(closed_with(conn.receive_data(OK)).error, ProtocolError)


def test_close_outside_subscribed_reports_what_it_abandons() -> None:
    conn = ready_conn()
    request_id = conn.publish("t", b"x")
    closed = conn.close()
    assert isinstance(closed, ConnectionClosed)
    assert closed.pending_requests == (request_id,)
    assert conn.state is S.CLOSED and conn.pending_requests == ()
    assert conn.data_to_send() == b""
    idle = ready_conn()
    closed = idle.close()
    assert closed is not None and closed.error is None


# --- commands in the wrong state ------------------------------------------------------------


def _commands(conn: ClientConnection) -> dict[str, object]:
    return {
        "subscribe": lambda: conn.subscribe("t", "c"),
        "send_ready": lambda: conn.send_ready(1),
        "finish": lambda: conn.finish(MID),
        "requeue": lambda: conn.requeue(MID),
        "touch": lambda: conn.touch(MID),
        "publish": lambda: conn.publish("t", b"x"),
        "multi_publish": lambda: conn.multi_publish("t", [b"x"]),
        "deferred_publish": lambda: conn.deferred_publish("t", b"x", 1.0),
        "nop": conn.nop,
    }


ALLOWED = {
    "IDENTIFYING": {"nop"},
    "READY": {"subscribe", "publish", "multi_publish", "deferred_publish", "nop"},
    "SUBSCRIBED": {"send_ready", "publish", "multi_publish", "deferred_publish", "nop"},
    "CLOSED": set(),
}


@pytest.mark.parametrize("state", sorted(ALLOWED))
def test_commands_in_the_wrong_state_name_the_state(state: str) -> None:
    def make() -> ClientConnection:
        if state == "IDENTIFYING":
            return ClientConnection()
        if state == "READY":
            return ready_conn()
        conn = subscribed_conn(rdy=0)
        if state == "CLOSED":
            conn.receive_data(b"")
        return conn

    for name in _commands(make()):
        conn = make()
        command = _commands(conn)[name]
        if name in ALLOWED[state]:
            command()  # type: ignore[operator]
        elif name in ("finish", "requeue", "touch") and state == "SUBSCRIBED":
            with pytest.raises(LocalProtocolError, match="not in flight"):
                command()  # type: ignore[operator]
        else:
            with pytest.raises(LocalProtocolError, match=state):
                command()  # type: ignore[operator]


# --- timers ----------------------------------------------------------------------------------


def test_silence_past_the_heartbeat_deadline_closes() -> None:
    conn = ClientConnection({"heartbeat_interval": 2000})
    assert conn.next_deadline() is None  # nothing received yet, no clock read
    conn.receive_data(OK, now=100.0)
    assert conn.last_received == 100.0
    deadline = conn.next_deadline()
    assert deadline is not None and 104.0 <= deadline <= 106.0
    assert conn.handle_timer(deadline - 0.001) == []
    conn.receive_data(HEARTBEAT, now=103.0)
    assert conn.next_deadline() == deadline + 3.0
    closed = closed_with(conn.handle_timer(deadline + 3.0))
    assert isinstance(closed.error, ConnectionLost)
    assert conn.next_deadline() is None
    assert conn.handle_timer(1e9) == []


def test_heartbeats_disabled_means_no_deadline() -> None:
    conn = ClientConnection({"heartbeat_interval": -1})
    conn.receive_data(OK, now=1.0)
    assert conn.heartbeat_interval is None and conn.next_deadline() is None
    assert conn.handle_timer(1e9) == []


# --- the whole upgrade chain, state by state --------------------------------------------------


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_tls_then_compression_then_auth_then_sub(kind: str) -> None:
    conn = ClientConnection({"tls_v1": True, kind: True}, auth_secret=b"secret")
    conn.data_to_send()
    assert conn.state is S.IDENTIFYING
    [upgrade] = conn.receive_data(identify_answer(tls_v1=True, auth_required=True, **{kind: True}))
    assert isinstance(upgrade, TLSUpgradeRequired)
    assert conn.state is S.TLS_HANDSHAKE
    conn.tls_established()
    assert conn.state is S.AWAITING_TLS_OK
    server = ServerStream(kind)
    assert conn.receive_data(OK) == []
    assert conn.state is S.AWAITING_COMPRESSION_OK
    assert conn.receive_data(server.compress(OK)) == []
    assert conn.state is S.AUTHENTICATING
    assert server.decompress(conn.data_to_send()) == b"AUTH\n\x00\x00\x00\x06secret"
    auth = b'{"identity":"me","identity_url":"","permission_count":1}'
    [ready] = conn.receive_data(server.compress(response(auth)))
    assert isinstance(ready, ConnectionReady) and ready.auth is not None
    assert ready.auth.identity == "me" and ready.settings.tls_v1
    conn.subscribe("t", "c")
    assert server.decompress(conn.data_to_send()) == b"SUB t c\n"
    assert conn.receive_data(server.compress(OK)) == [Subscribed("t", "c")]


@pytest.mark.parametrize("kind", ["snappy", "deflate"])
def test_compressed_oversized_frame_is_refused_not_buffered(kind: str) -> None:
    conn = ClientConnection({kind: True}, max_frame_size=64 * 1024)
    server = ServerStream(kind)
    conn.receive_data(identify_answer(**{kind: True}) + server.compress(OK))
    conn.subscribe("t", "c")
    conn.receive_data(server.compress(OK))
    bomb = server.compress(b"\x01\x00\x00\x00\x00\x00\x00\x02" + b"\x00" * (1 << 20))
    closed = closed_with(conn.receive_data(bomb))
    assert isinstance(closed.error, FrameTooLarge) and closed.error.size == 0x01000000


def test_close_before_subscribed_closes_at_once_without_cls() -> None:
    for conn in (ClientConnection(), ready_conn()):
        closed = conn.close()
        assert isinstance(closed, ConnectionClosed) and closed.error is None
        assert conn.state is S.CLOSED and conn.data_to_send() == b""
    conn = ready_conn()
    conn.subscribe("t", "c")
    assert conn.close() is not None  # SUBSCRIBING: nothing to CLS yet
    assert conn.data_to_send() == b"" and conn.receive_data(OK) == []


def test_auth_secret_not_sent_when_server_does_not_require_it() -> None:
    conn = ClientConnection(auth_secret=b"s")
    conn.data_to_send()
    [ready] = conn.receive_data(identify_answer(auth_required=False))
    assert isinstance(ready, ConnectionReady) and ready.auth is None
    assert conn.data_to_send() == b""  # "a client must not authorize"


def test_heartbeat_interval_zero_means_server_default() -> None:
    conn = ClientConnection({"heartbeat_interval": 0})  # nsqd: 0 keeps its default (30 s)
    conn.receive_data(OK, now=10.0)
    assert conn.handle_timer(11.0) == []
    deadline = conn.next_deadline()
    assert deadline is not None and deadline > 40.0


@pytest.mark.parametrize("interval", [500, 999, -2, 1500.5, float("nan"), float("inf")])
def test_identify_values_nsqd_would_reject_are_refused_locally(interval: float) -> None:
    # nsqd: -1 disables, 0 = default, 1000..max accepted, anything else is a fatal E_BAD_BODY
    with pytest.raises(LocalProtocolError, match="heartbeat_interval"):
        ClientConnection({"heartbeat_interval": interval})


@pytest.mark.parametrize("command", ["finish", "requeue", "touch"])
def test_message_commands_with_a_wrongly_typed_id_raise_local_errors(command: str) -> None:
    conn = subscribed_conn()
    conn.receive_data(message(MID))
    with pytest.raises(LocalProtocolError):
        getattr(conn, command)(bytearray(MID))
    assert conn.is_in_flight(MID) and conn.data_to_send() == b""


def test_highly_compressible_legit_traffic_is_not_a_bomb() -> None:
    # 1 MiB bodies are within nsqd's default --max-msg-size; zeros compress ~1000:1 with deflate
    conn = ClientConnection({"deflate": True})
    server = ServerStream("deflate")
    conn.receive_data(identify_answer(deflate=True) + server.compress(OK))
    conn.subscribe("t", "c")
    conn.receive_data(server.compress(OK))
    conn.send_ready(80)
    frames_ = b"".join(message(b"%016x" % i, b"\0" * (1 << 20)) for i in range(80))
    wire = server.compress(frames_)
    events = []
    for start in range(0, len(wire), 256 * 1024):  # an ordinary read size
        events.extend(conn.receive_data(wire[start : start + 256 * 1024]))
    assert [type(e) for e in events] == [Message] * 80

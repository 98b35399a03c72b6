"""The server role against the library's own client role: compression, TLS, AUTH, end to end."""

from __future__ import annotations

import random
from typing import Any

import pytest

from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import LocalProtocolError
from nsq_sansio.events import (
    Message,
    PublishAcknowledged,
    TLSUpgradeRequired,
)
from nsq_sansio.server import (
    NSQD,
    Authorization,
    AuthRequest,
    AuthState,
    CloseConnection,
    NSQDOptions,
    ServerEvent,
    StartTLS,
)


class Pair:
    """A client role and a server connection wired by a loop that moves bytes both ways."""

    def __init__(self, node: NSQD, client: ClientConnection) -> None:
        self.node = node
        self.client = client
        self.conn_id = node.connect(0.0, "192.0.2.1:5000")
        self.client_events: list[Any] = []
        self.server_events: list[ServerEvent] = []

    def pump(self, now: float = 0.0) -> None:
        for _ in range(50):
            moved = False
            data = self.client.data_to_send()
            if data:
                moved = True
                self.server_events += self.node.receive_data(self.conn_id, data, now)
            back = self.node.data_to_send(self.conn_id)
            if back:
                moved = True
                self.client_events += self.client.receive_data(back, now)
            if not moved:
                return
        raise AssertionError("the pair did not settle")

    def of_type(self, kind: type) -> list[Any]:
        return [e for e in self.client_events if isinstance(e, kind)]


@pytest.mark.parametrize(
    "compression", [{}, {"snappy": True}, {"deflate": True, "deflate_level": 3}]
)
def test_publish_and_consume_with_each_compression(compression: dict[str, Any]) -> None:
    node = NSQD(NSQDOptions(), random.Random(3))
    producer = Pair(node, ClientConnection(dict(compression)))
    consumer = Pair(node, ClientConnection(dict(compression)))
    producer.pump()
    consumer.pump()
    consumer.client.subscribe("t", "c")
    consumer.pump()
    consumer.client.send_ready(100)
    consumer.pump()
    bodies = [b"body-%d" % i * (i + 1) for i in range(50)]
    producer.client.multi_publish("t", bodies[:25])
    for body in bodies[25:]:
        producer.client.publish("t", body)
    producer.pump()
    consumer.pump()
    assert len(producer.of_type(PublishAcknowledged)) == 26
    got = consumer.of_type(Message)
    assert [m.body for m in got] == bodies
    for msg in got:
        consumer.client.finish(msg.id)
    consumer.pump()
    stats = node.stats(0.0)["topics"][0]["channels"][0]
    assert stats["in_flight_count"] == 0 and stats["message_count"] == 50
    (client_stats,) = stats["clients"]
    assert client_stats["snappy"] == bool(compression.get("snappy"))
    assert client_stats["deflate"] == bool(compression.get("deflate"))


def test_tls_then_snappy_with_the_client_role() -> None:
    node = NSQD(NSQDOptions(tls_available=True), random.Random(3))
    pair = Pair(node, ClientConnection({"tls_v1": True, "snappy": True}))
    pair.pump()
    (start,) = [e for e in pair.server_events if isinstance(e, StartTLS)]
    assert pair.of_type(TLSUpgradeRequired)
    # The transport would run TLS here; both sides pass plaintext through it.
    pair.client.tls_established()
    pair.server_events += node.tls_established(pair.conn_id, 0.0)
    assert start.trailing_data == b""
    pair.pump()
    pair.client.publish("t", b"over tls and snappy")
    pair.pump()
    assert pair.of_type(PublishAcknowledged)
    assert node.stats(0.0)["topics"][0]["message_count"] == 1


def _auth(request: AuthRequest) -> AuthState | None:
    if request.secret == "down":
        return None
    if request.secret == "nobody":
        return AuthState(identity="nobody")
    return AuthState(
        identity="alice",
        identity_url="https://example.invalid/alice",
        authorizations=(
            Authorization(topic="^allowed$", channels=(".*",), permissions=("publish",)),
        ),
        ttl=10.0,
    )


def _raw(node: NSQD, payload: bytes, now: float = 0.0) -> tuple[int, bytes]:
    from nsq_sansio import frames

    conn = node.connect(now, "192.0.2.7:1234")
    node.receive_data(conn, b"  V2" + payload, now)
    return conn, b"".join(data for _, data in frames.FrameDecoder().feed(node.data_to_send(conn)))


def test_auth_required_flow() -> None:
    from nsq_sansio import frames

    node = NSQD(NSQDOptions(auth_check=_auth), random.Random(3))
    ident = frames.encode_identify({"feature_negotiation": True})
    _, answer = _raw(node, ident)
    assert b'"auth_required":true' in answer
    _, answer = _raw(node, frames.encode_pub("allowed", b"x"))
    assert answer == b"E_AUTH_FIRST AUTH required before PUB"
    _, answer = _raw(node, frames.encode_auth("down"))
    assert answer == b"E_AUTH_FAILED AUTH failed"
    _, answer = _raw(node, frames.encode_auth("nobody"))
    assert answer == b"E_UNAUTHORIZED AUTH no authorizations found"
    _, answer = _raw(node, frames.encode_auth("alice") + frames.encode_pub("allowed", b"x"))
    assert answer == (
        b'{"identity":"alice","identity_url":"https://example.invalid/alice","permission_count":1}'
        b"OK"
    )
    _, answer = _raw(node, frames.encode_auth("alice") + frames.encode_pub("other", b"x"))
    assert answer.endswith(b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')
    _, answer = _raw(node, frames.encode_auth("alice") + frames.encode_sub("allowed", "c"))
    assert answer.endswith(b'E_UNAUTHORIZED AUTH failed for SUB on "allowed" "c"')
    _, answer = _raw(node, frames.encode_auth("alice") + frames.encode_auth("alice"))
    assert answer.endswith(b"E_INVALID AUTH already set")


def test_auth_is_checked_again_after_its_ttl() -> None:
    from nsq_sansio import frames

    calls: list[str] = []

    def check(request: AuthRequest) -> AuthState | None:
        calls.append(request.secret)
        return _auth(request) if len(calls) == 1 else None

    node = NSQD(NSQDOptions(auth_check=check), random.Random(3))
    conn = node.connect(0.0, "192.0.2.7:1234")
    node.receive_data(conn, b"  V2" + frames.encode_auth("alice"), 0.0)
    node.receive_data(conn, frames.encode_pub("allowed", b"x"), 5.0)
    node.receive_data(conn, frames.encode_pub("allowed", b"x"), 10.0)
    answers = [data for _, data in frames.FrameDecoder().feed(node.data_to_send(conn))]
    assert answers[1:] == [b"OK", b"E_AUTH_FAILED AUTH failed"]
    assert calls == ["alice", "alice"]


def test_auth_disabled() -> None:
    from nsq_sansio import frames

    _, answer = _raw(NSQD(), frames.encode_auth("x"))
    assert answer == b"E_AUTH_DISABLED AUTH disabled"


def _frames(node: NSQD, conn: int) -> list[bytes]:
    from nsq_sansio import frames

    return [data for _, data in frames.FrameDecoder().feed(node.data_to_send(conn))]


def test_auth_answered_by_the_transport_holds_input_until_the_answer() -> None:
    from nsq_sansio import frames
    from nsq_sansio.server import AuthRequested, ClientState

    node = NSQD(NSQDOptions(auth_by_transport=True), random.Random(3))
    conn = node.connect(0.0, "192.0.2.9:4000")
    events = node.receive_data(
        conn, b"  V2" + frames.encode_auth("s3cret") + frames.encode_pub("allowed", b"x"), 0.0
    )
    assert events == [AuthRequested(conn, AuthRequest("192.0.2.9", False, "s3cret"))]
    assert node.connection_state(conn) is ClientState.AUTHENTICATING
    assert node.topic_names() == []  # the PUB waits for the answer
    node.receive_data(conn, frames.encode_nop(), 0.1)
    node.auth_result(conn, _auth(AuthRequest("192.0.2.9", False, "alice")), 0.2)
    answer, ok = _frames(node, conn)
    assert answer.startswith(b'{"identity":"alice"') and ok == b"OK"
    assert node.topic_names() == ["allowed"]
    with pytest.raises(LocalProtocolError):
        node.auth_result(conn, None, 0.3)


def test_auth_by_transport_failure_and_refresh_after_ttl() -> None:
    from nsq_sansio import frames
    from nsq_sansio.server import AuthRequested

    node = NSQD(NSQDOptions(auth_by_transport=True), random.Random(3))
    failed = node.connect(0.0, "192.0.2.9:4000")
    node.receive_data(failed, b"  V2" + frames.encode_auth("x"), 0.0)
    (close,) = node.auth_result(failed, None, 0.0)
    assert isinstance(close, CloseConnection) and close.conn_id == failed
    assert _frames(node, failed) == [b"E_AUTH_FAILED AUTH failed"]

    conn = node.connect(0.0, "192.0.2.9:4001")
    node.receive_data(conn, b"  V2" + frames.encode_auth("alice"), 0.0)
    node.auth_result(conn, _auth(AuthRequest("", False, "alice")), 0.0)  # ttl 10s
    _frames(node, conn)
    node.receive_data(conn, frames.encode_nop(), 9.0)
    events = node.handle_timer(10.0)
    assert [e for e in events if isinstance(e, AuthRequested)] == [
        AuthRequested(conn, AuthRequest("192.0.2.9", False, "alice"), refresh=True)
    ]
    node.receive_data(conn, frames.encode_pub("allowed", b"still"), 10.5)
    assert _frames(node, conn) == [b"OK"]  # works while the re-check is out
    node.auth_result(conn, None, 11.0)
    assert _frames(node, conn) == [b"E_AUTH_FAILED AUTH failed"]


def test_auth_by_transport_bounds_waiting_input() -> None:
    from nsq_sansio import frames
    from nsq_sansio.server import ClientState

    node = NSQD(NSQDOptions(auth_by_transport=True, max_body_size=2000, max_msg_size=1000))
    conn = node.connect(0.0, "192.0.2.9:4000")
    node.receive_data(conn, b"  V2" + frames.encode_auth("x"), 0.0)
    node.receive_data(conn, b"x" * 100_000, 0.0)
    assert node.connection_state(conn) is ClientState.CLOSED


def test_auth_options_are_exclusive() -> None:
    from nsq_sansio.errors import ConfigError

    with pytest.raises(ConfigError):
        NSQDOptions(auth_by_transport=True, auth_check=_auth)

"""Misconfiguration is one clear error, raised for good (an IncompatibleNSQD) or at the call:
the wrong port, a feature nsqd does not enable, AUTH that cannot be done, a delay in the wrong
unit; and answers to the handshake are read only up to a size nsqd's never reach."""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

import pytest

from nsq_sansio import ClientConnection, ConnectionClosed, ConnectionState, Event, Heartbeat
from nsq_sansio import PublishAcknowledged as Acked
from nsq_sansio import errors as E
from nsq_sansio.config import Config
from nsq_sansio.connection import DEFAULT_MAX_REQ_TIMEOUT, MAX_ANSWER_SIZE
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

from ._helpers import MID, OK, identify_answer, message, response, subscribed_conn

#: What nsqd v1.3.0's HTTP port (4151 by default) answers to protocol V2's magic and IDENTIFY,
#: byte for byte: captured once by sending ``"  V2IDENTIFY\n" + size + JSON`` to it over a
#: plain socket and reading until it closed.
NSQD_HTTP_PORT_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\n400 Bad Request"
)
#: What nsqlookupd v1.3.0's TCP port (4160) answers to the same, captured the same way: a
#: size and its error, not framed as protocol V2 frames are.
LOOKUPD_TCP_PORT_ANSWER = b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


def closed_with(events: list[Event]) -> ConnectionClosed:
    closed = events[-1]
    assert isinstance(closed, ConnectionClosed), events
    return closed


# --- the wrong port ----------------------------------------------------------------------------


def test_nsqds_http_port_is_recognised() -> None:
    conn = ClientConnection()
    error = closed_with(conn.receive_data(NSQD_HTTP_PORT_ANSWER)).error
    assert isinstance(error, E.WrongPort) and isinstance(error, E.IncompatibleNSQD)
    assert error.looks_like == "HTTP"
    assert "answered like an HTTP server ('HTTP/1.1 400 Bad Request')" in str(error)
    assert "is it nsqd's HTTP port? nsqd's TCP port is usually 4150" in str(error)
    assert "1213486160" not in str(error)  # was: "frame of 1213486160 bytes announced"


@pytest.mark.parametrize("size", [4, 5, 7, 8, 30])
def test_the_http_answer_is_recognised_however_it_is_cut(size: int) -> None:
    conn = ClientConnection(peer="127.0.0.1:4151")
    events: list[Event] = []
    for start in range(0, len(NSQD_HTTP_PORT_ANSWER), size):
        events += conn.receive_data(NSQD_HTTP_PORT_ANSWER[start : start + size])
        if conn.state is ConnectionState.CLOSED:
            break
    error = closed_with(events).error
    assert isinstance(error, E.WrongPort)
    assert str(error).startswith("127.0.0.1:4151 answered like an HTTP server")


def test_nsqlookupds_tcp_port_is_recognised() -> None:
    conn = ClientConnection()
    error = closed_with(conn.receive_data(LOOKUPD_TCP_PORT_ANSWER)).error
    assert isinstance(error, E.WrongPort) and error.looks_like == "nsqlookupd"
    assert "4160" in str(error) and "4150" in str(error)


def test_an_oversized_frame_later_is_still_frame_too_large() -> None:
    conn = subscribed_conn(rdy=1)
    error = closed_with(conn.receive_data(b"HTTP/1.1 400 Bad Request\r\n")).error
    assert type(error) is E.FrameTooLarge  # only the first answer can be another server's


# --- features nsqd does not enable ---------------------------------------------------------------


@pytest.mark.parametrize("feature", ["snappy", "deflate"])
def test_compression_not_enabled_is_refused_for_good(feature: str) -> None:
    conn = ClientConnection({feature: True})
    error = closed_with(conn.receive_data(identify_answer(**{feature: False}))).error
    assert isinstance(error, E.CompressionUnavailable) and error.feature == feature
    assert f"--{feature}=false" in str(error) and isinstance(error, E.IncompatibleNSQD)


def test_compression_not_asked_for_is_not_required() -> None:
    conn = ClientConnection()
    events = conn.receive_data(identify_answer(snappy=False, deflate=False))
    assert conn.state is ConnectionState.READY, events


def test_auth_required_without_a_secret_is_refused_for_good() -> None:
    conn = ClientConnection()
    error = closed_with(conn.receive_data(identify_answer(auth_required=True))).error
    assert isinstance(error, E.AuthSecretMissing) and isinstance(error, E.IncompatibleNSQD)
    assert "auth_secret" in str(error)


def test_auth_over_plaintext_can_be_refused() -> None:
    conn = ClientConnection(auth_secret=b"s3cret", auth_requires_tls=True)
    conn.data_to_send()
    error = closed_with(conn.receive_data(identify_answer(auth_required=True))).error
    assert isinstance(error, E.InsecureAuthRefused) and "tls_v1" in str(error)
    assert conn.data_to_send() == b""  # the secret was not queued


def test_auth_over_tls_is_sent_with_auth_requires_tls() -> None:
    conn = ClientConnection({"tls_v1": True}, auth_secret=b"s3cret", auth_requires_tls=True)
    conn.data_to_send()
    conn.receive_data(identify_answer(tls_v1=True, auth_required=True))
    conn.tls_established()
    conn.receive_data(OK)
    assert conn.state is ConnectionState.AUTHENTICATING
    assert conn.data_to_send() == b"AUTH\n" + struct.pack(">I", 6) + b"s3cret"


def test_auth_over_plaintext_is_sent_by_default() -> None:
    conn = ClientConnection(auth_secret=b"s3cret")
    conn.data_to_send()
    conn.receive_data(identify_answer(auth_required=True))
    assert conn.data_to_send().startswith(b"AUTH\n")


def test_from_config_carries_the_secret_and_the_tls_rule() -> None:
    config = Config(auth_secret=b"s3cret", auth_requires_tls=True, max_req_timeout=60.0)
    conn = ClientConnection.from_config(config, peer="10.0.0.1:4150")
    assert conn.max_req_timeout == 60.0
    error = closed_with(conn.receive_data(identify_answer(auth_required=True))).error
    assert isinstance(error, E.InsecureAuthRefused)
    assert str(error).startswith("10.0.0.1:4150 requires AUTH")


# --- answers to the handshake, capped ----------------------------------------------------------


def test_a_huge_identify_answer_is_refused_from_its_header() -> None:
    # A 16 MiB JSON array took 0.54 s and 159 MiB to refuse: its header alone says enough now.
    conn = ClientConnection()
    header = struct.pack(">II", 1024 * 1024 + 4, 0)  # within the frame limit, not this one
    error = closed_with(conn.receive_data(header + b"[[[[")).error
    assert isinstance(error, E.RemoteProtocolError)
    assert f"read up to {MAX_ANSWER_SIZE} bytes" in str(error)


def test_an_identify_answer_at_the_cap_is_read() -> None:
    answer = json.dumps({"max_rdy_count": 2500, "pad": "x" * (MAX_ANSWER_SIZE - 40)}).encode()
    assert MAX_ANSWER_SIZE - 100 < len(answer) <= MAX_ANSWER_SIZE
    conn = ClientConnection()
    conn.receive_data(response(answer))
    assert conn.state is ConnectionState.READY


def test_a_huge_auth_answer_is_refused() -> None:
    conn = ClientConnection(auth_secret=b"s3cret")
    conn.receive_data(identify_answer(auth_required=True))
    big = response(b"[" * (MAX_ANSWER_SIZE + 1))
    started = time.perf_counter()
    error = closed_with(conn.receive_data(big)).error
    assert time.perf_counter() - started < 0.1
    assert isinstance(error, E.RemoteProtocolError) and "AUTHENTICATING" in str(error)


def test_frames_after_the_handshake_may_be_large_again() -> None:
    conn = subscribed_conn(rdy=1)
    body = b"x" * (MAX_ANSWER_SIZE * 2)
    (event,) = conn.receive_data(message(MID, body))
    assert event.body == body  # type: ignore[union-attr]


# --- delays, in seconds ---------------------------------------------------------------------------


def ready(**kwargs: object) -> ClientConnection:
    conn = ClientConnection(**kwargs)  # type: ignore[arg-type]
    conn.receive_data(identify_answer())
    conn.data_to_send()
    return conn


def test_a_dpub_delay_in_milliseconds_is_refused_before_it_is_sent() -> None:
    conn = ready()
    with pytest.raises(E.DelayOutOfRange) as caught:
        conn.deferred_publish("t", b"x", 5000)  # meant 5 s
    message_ = str(caught.value)
    assert "5000 seconds" in message_ and "3600 seconds" in message_ and "milliseconds" in message_
    assert caught.value.delay == 5000 and caught.value.limit == DEFAULT_MAX_REQ_TIMEOUT
    assert isinstance(caught.value, E.LocalProtocolError)
    assert conn.data_to_send() == b"" and conn.pending_requests == ()
    conn.deferred_publish("t", b"x", 3600)  # nsqd's limit itself is allowed
    assert conn.data_to_send() == b"DPUB t 3600000\n\x00\x00\x00\x01x"


def test_a_known_max_req_timeout_moves_the_limit() -> None:
    conn = ready(max_req_timeout=7200.0)
    conn.deferred_publish("t", b"x", 5000)
    with pytest.raises(E.DelayOutOfRange, match="7200 seconds of nsqd's --max-req-timeout"):
        conn.deferred_publish("t", b"x", 7201)


def test_a_max_req_timeout_announced_by_the_server_is_used() -> None:
    conn = ClientConnection()
    conn.receive_data(identify_answer(max_req_timeout=60_000))
    assert conn.max_req_timeout == 60.0
    with pytest.raises(E.DelayOutOfRange):
        conn.deferred_publish("t", b"x", 61)


def test_req_is_checked_once_the_limit_is_known() -> None:
    conn = subscribed_conn(rdy=1)
    conn.receive_data(message(MID))
    conn.requeue(MID, 5000)  # unknown: nsqd shortens it to its own limit, as it always did
    assert conn.data_to_send() == b"REQ " + MID + b" 5000000\n"
    known = ready(max_req_timeout=3600.0)
    known.subscribe("t", "c")
    known.receive_data(OK)
    known.send_ready(1)
    known.receive_data(message(MID))
    known.data_to_send()
    with pytest.raises(E.DelayOutOfRange, match="requeue"):
        known.requeue(MID, 5000)
    assert known.is_in_flight(MID) and known.data_to_send() == b""  # still answerable
    known.requeue(MID, 5)


def test_max_req_timeout_must_be_seconds_in_range() -> None:
    with pytest.raises(E.LocalProtocolError):
        ClientConnection(max_req_timeout=-1.0)
    with pytest.raises(E.ConfigError, match="max_req_timeout"):
        Config(max_req_timeout=-1.0)


def handshake(port: int, conn: ClientConnection) -> list[Event]:
    """Drive ``conn`` over a plain socket until it is READY or CLOSED."""
    events: list[Event] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        while conn.state not in (ConnectionState.READY, ConnectionState.CLOSED):
            events += conn.receive_data(sock.recv(65536), now=time.monotonic())
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
    return events


# --- against the embedded broker -----------------------------------------------------------------


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_embedded_nsqds_http_port(nsqd: Any) -> None:
    error = closed_with(handshake(port_of(nsqd.http_address), ClientConnection())).error
    assert isinstance(error, E.WrongPort) and error.looks_like == "HTTP"


def test_the_embedded_nsqlookupds_tcp_port(nsqlookupd: Any) -> None:
    error = closed_with(handshake(port_of(nsqlookupd.tcp_address), ClientConnection())).error
    assert isinstance(error, E.WrongPort) and error.looks_like == "nsqlookupd"


# --- against the real nsqd -----------------------------------------------------------------------

needs_real_nsqd = pytest.mark.skipif(find_binaries() is None, reason=MISSING_BINARIES)


@needs_real_nsqd
def test_the_real_nsqds_http_port() -> None:
    with RealNSQD() as nsqd:
        error = closed_with(handshake(nsqd.http_port, ClientConnection())).error
    assert isinstance(error, E.WrongPort) and error.looks_like == "HTTP"


@needs_real_nsqd
def test_the_real_nsqd_without_tls_compression_or_with_auth() -> None:
    with RealNSQD(["--snappy=false", "--deflate=false"]) as nsqd:
        for fields, error_type in [
            ({"tls_v1": True}, E.TLSUnavailable),
            ({"snappy": True}, E.CompressionUnavailable),
            ({"deflate": True}, E.CompressionUnavailable),
        ]:
            error = closed_with(handshake(nsqd.tcp_port, ClientConnection(fields))).error
            assert type(error) is error_type, (fields, error)
    with RealNSQD(["--auth-http-address=127.0.0.1:1"]) as nsqd:  # never asked before AUTH
        error = closed_with(handshake(nsqd.tcp_port, ClientConnection())).error
        assert type(error) is E.AuthSecretMissing
        conn = ClientConnection(auth_secret=b"s3cret", auth_requires_tls=True)
        error = closed_with(handshake(nsqd.tcp_port, conn)).error
        assert type(error) is E.InsecureAuthRefused


def publish_answer(port: int, conn: ClientConnection, delay: float) -> Event:
    """DPUB over a plain socket, the answer event."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        while conn.state is not ConnectionState.READY:
            conn.receive_data(sock.recv(65536), now=time.monotonic())
        conn.deferred_publish("delays", b"x", delay)
        sock.sendall(conn.data_to_send())
        while True:
            for event in conn.receive_data(sock.recv(65536), now=time.monotonic()):
                if not isinstance(event, Heartbeat):
                    return event


@needs_real_nsqd
def test_the_real_nsqds_dpub_limit_is_the_one_checked() -> None:
    with RealNSQD() as nsqd:  # nsqd's default --max-req-timeout: an hour, inclusive
        assert isinstance(publish_answer(nsqd.tcp_port, ClientConnection(), 3600), Acked)
        with pytest.raises(E.DelayOutOfRange):
            publish_answer(nsqd.tcp_port, ClientConnection(), 3600.001)
    with RealNSQD(["--max-req-timeout=2h"]) as nsqd:
        conn = ClientConnection(max_req_timeout=7200)
        assert isinstance(publish_answer(nsqd.tcp_port, conn, 5000), Acked)

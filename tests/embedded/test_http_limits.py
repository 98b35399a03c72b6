"""The embedded HTTP API's limits: a whole-request deadline, a connection cap and a budget for
request bodies held at once, so slow or stalled clients cannot hold it or its memory.

nsqd's own HTTP server has none of these (Go copes with many goroutines); the embedded one
serves from one event loop and used to keep a connection sending a byte every 20 s open past
80 s (its only timeout was per read), and 40 stalled 5 MiB bodies held 220 MiB.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conformance.wire import http_request, split_address, wait_for

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.embedded.http import HTTPLimits


@contextmanager
def nsqd_with(**limits: float) -> Iterator[str]:
    with ServerThread(EmbeddedNSQD(http_limits=limits)) as nsqd:
        yield nsqd.http_address


def _open(address: str) -> socket.socket:
    return socket.create_connection(split_address(address), timeout=10)


def _closed_within(sock: socket.socket, seconds: float) -> tuple[bool, bytes]:
    """True (and what was received) when the server closes ``sock`` within ``seconds``."""
    sock.settimeout(0.1)
    received = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, received
        if not chunk:
            return True, received
        received += chunk
    return False, received


def test_a_request_trickled_a_byte_at_a_time_is_cut_off_at_the_deadline() -> None:
    with nsqd_with(request_timeout=1.0) as http:
        sock = _open(http)
        try:
            sock.sendall(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            started = time.monotonic()
            closed = False
            while not closed and time.monotonic() - started < 5:
                with contextlib.suppress(OSError):
                    sock.sendall(b"x")  # well within the 60 s idle timeout of each read
                closed, _ = _closed_within(sock, 0.3)
            assert closed
            assert time.monotonic() - started < 3.0
        finally:
            sock.close()
        assert http_request(http, "GET", "/ping")[:2] == (200, b"OK")


def test_connections_over_the_cap_are_answered_503_and_closed() -> None:
    with ServerThread(EmbeddedNSQD(http_limits={"max_connections": 3})) as nsqd:
        http = nsqd.http_address
        held = [_open(http) for _ in range(3)]
        try:
            for sock in held:
                sock.sendall(b"GET /ping HTTP/1.1\r\n")  # a request head that never ends
            # the server accepts on its own thread: each of the three counted before the next
            wait_for(lambda: nsqd._http_limits.connections == 3)
            extra = _open(http)
            extra.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            closed, answer = _closed_within(extra, 5)
            extra.close()
            assert closed and answer.startswith(b"HTTP/1.1 503"), answer
        finally:
            for sock in held:
                sock.close()
        # served again once the server noticed the closes (a cap never freed fails here)
        wait_for(lambda: http_request(http, "GET", "/ping")[:2] == (200, b"OK"))


def test_bodies_held_at_once_are_bounded_across_connections() -> None:
    with ServerThread(EmbeddedNSQD(http_limits={"max_body_bytes": 1 << 20})) as nsqd:
        http = nsqd.http_address
        head = b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 900000\r\n\r\n"
        first, second = _open(http), _open(http)
        try:
            first.sendall(head + b"x" * 700_000)  # stalls with 700 KB held
            # once the server has read all of it (on its own thread)
            wait_for(lambda: nsqd._http_limits.body_bytes == 700_000)
            second.sendall(head + b"x" * 700_000)  # would take the bodies past 1 MiB
            closed, answer = _closed_within(second, 5)
            assert closed and answer.startswith(b"HTTP/1.1 503"), answer[:100]
            first.sendall(b"x" * 200_000)  # the first one completes and is stored
            first.settimeout(10)
            assert first.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            first.close()
            second.close()
        assert http_request(http, "POST", "/pub?topic=t", b"y")[:2] == (200, b"OK")


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="every limit must be positive"):
        HTTPLimits(max_connections=0)
    with pytest.raises(ValueError, match="every limit must be positive"):
        EmbeddedNSQD(http_limits={"request_timeout": -1})


def test_a_request_framed_two_ways_is_answered_and_the_connection_closed() -> None:
    """Transfer-Encoding and Content-Length together: read as chunked, then closed, so bytes a
    proxy in front counted differently cannot be taken as a second request."""
    with nsqd_with() as http:
        sock = _open(http)
        try:
            smuggled = b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n"
            sock.sendall(
                b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n" + smuggled
            )
            closed, answer = _closed_within(sock, 5)
            assert closed
            assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1
        finally:
            sock.close()

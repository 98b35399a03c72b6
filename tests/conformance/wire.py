"""A deliberately independent raw-bytes NSQ client for the conformance suite.

It does not use nsq_sansio's codecs: the suite checks the broker against the protocol as
written, so the test client encodes and decodes by hand with ``struct`` over a blocking
socket. Every read has a timeout, so a broker that stops answering fails a test instead of
hanging it.
"""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"
READ_TIMEOUT = 10.0


def unique(prefix: str = "t") -> str:
    """A fresh topic/channel name, so runs against a shared nsqd never collide."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclass(frozen=True)
class Message:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class Closed(Exception):
    """The broker closed the connection."""


class RawConn:
    """One protocol V2 connection, spoken byte by byte."""

    def __init__(self, address: str, *, magic: bytes = b"  V2", timeout: float = READ_TIMEOUT):
        self.sock = socket.create_connection(split_address(address), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        if magic:
            self.send(magic)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, line: str, body: bytes | None = None) -> None:
        data = line.encode() + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.send(data)

    def identify(self, **fields: Any) -> dict[str, Any] | bytes:
        fields.setdefault("feature_negotiation", True)
        self.command("IDENTIFY", json.dumps(fields).encode())
        kind, data = self.read_frame()
        assert kind == FRAME_RESPONSE, (kind, data)
        return json.loads(data) if data.startswith(b"{") else data

    def pub(self, topic: str, body: bytes) -> None:
        self.command(f"PUB {topic}", body)

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        payload = struct.pack(">i", len(bodies)) + b"".join(
            struct.pack(">i", len(b)) + b for b in bodies
        )
        self.command(f"MPUB {topic}", payload)

    def fin(self, message: Message) -> None:
        self.command(f"FIN {message.id.decode()}")

    def sub(self, topic: str, channel: str) -> None:
        self.command(f"SUB {topic} {channel}")
        self.expect_ok()

    # -- reading --------------------------------------------------------------------------------

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed(f"connection closed with {len(self.buf)} bytes pending")
            self.buf += chunk

    def read_frame(
        self, *, skip_heartbeats: bool = True, within: float | None = None
    ) -> tuple[int, bytes]:
        """The next frame (heartbeats answered and skipped). Each socket read has the
        connection's timeout; ``within`` also bounds the whole wait, which heartbeats would
        otherwise extend for ever."""
        deadline = None if within is None else time.monotonic() + within
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no frame but heartbeats within {within} s")
            self._fill(4)
            (size,) = struct.unpack(">i", self.buf[:4])
            assert 4 <= size <= 64 * 1024 * 1024, f"bad frame size {size}"
            self._fill(4 + size)
            kind = struct.unpack(">i", self.buf[4:8])[0]
            data = self.buf[8 : 4 + size]
            self.buf = self.buf[4 + size :]
            if skip_heartbeats and kind == FRAME_RESPONSE and data == HEARTBEAT:
                self.command("NOP")
                continue
            return kind, data

    def expect_ok(self) -> None:
        assert self.read_frame() == (FRAME_RESPONSE, b"OK")

    def expect_error(self, code: str) -> bytes:
        kind, data = self.read_frame()
        assert kind == FRAME_ERROR, (kind, data)
        assert data.split(b" ", 1)[0] == code.encode(), data
        return data

    def read_message(self, *, within: float | None = None) -> Message:
        kind, data = self.read_frame(within=within)
        assert kind == FRAME_MESSAGE, (kind, data)
        ts, attempts = struct.unpack(">qH", data[:10])
        return Message(ts, attempts, data[10:26], data[26:])

    def expect_closed(self, timeout: float = READ_TIMEOUT) -> None:
        """The broker closes the connection (after any frames already sent)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return
            if not chunk:
                return
            self.buf += chunk
        raise AssertionError("connection was not closed")

    def nothing_within(self, seconds: float) -> bool:
        """True when no frame (other than heartbeats) arrives within ``seconds``."""
        self.sock.settimeout(seconds)
        try:
            try:
                self.read_frame()
            except TimeoutError:
                return True
            return False
        finally:
            self.sock.settimeout(READ_TIMEOUT)


def http_request(
    address: str, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes, dict[str, str]]:
    host, port = split_address(address)
    conn = http.client.HTTPConnection(host, port, timeout=READ_TIMEOUT)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def http_json(address: str, method: str, path: str, body: bytes | None = None) -> Any:
    status, data, _ = http_request(address, method, path, body)
    assert status == 200, (status, data)
    return json.loads(data)


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy; fails (never hangs) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def wait_until_equal(
    read: Any, expected: Any, timeout: float = 5.0, interval: float = 0.02
) -> None:
    """Poll ``read()`` until it returns ``expected``; after ``timeout`` fails showing the last
    value read against the expected one (a plain ``wait_for`` can only say it timed out)."""
    deadline = time.monotonic() + timeout
    while (value := read()) != expected:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not reached within {timeout}s: read {value!r}, expected {expected!r}"
            )
        time.sleep(interval)

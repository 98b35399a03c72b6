"""The embedded nsqlookupd over real loopback sockets: TCP V1 and the HTTP API."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time

import anyio
import pytest

from nsq_sansio.server.lookupd_client import NodeIdentity, encode_identify
from transports.embedded.lookupd import EmbeddedLookupd
from transports.embedded.thread import ServerThread


def http_get(address: str, path: str, method: str = "GET") -> tuple[int, bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def read_response(sock: socket.socket) -> bytes:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            raise EOFError
        head += chunk
    (size,) = struct.unpack(">i", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise EOFError
        body += chunk
    return body


@pytest.fixture
def lookupd() -> object:
    with ServerThread(EmbeddedLookupd(tombstone_lifetime=45.0)) as server:
        yield server


def test_register_over_tcp_then_lookup_over_http(lookupd: EmbeddedLookupd) -> None:
    assert http_get(lookupd.http_address, "/ping") == (200, b"OK")
    identity = NodeIdentity("127.0.0.1", 4150, 4151, "h", "1.3.0")
    with socket.create_connection(("127.0.0.1", lookupd.tcp_port), timeout=5) as sock:
        sock.sendall(b"  V1" + encode_identify(identity))
        info = json.loads(read_response(sock))
        assert info["tcp_port"] == lookupd.tcp_port and info["http_port"] == lookupd.http_port
        sock.sendall(b"REGISTER orders archive\nPING\n")
        assert read_response(sock) == b"OK"
        assert read_response(sock) == b"OK"
        status, body = http_get(lookupd.http_address, "/lookup?topic=orders")
        assert status == 200
        doc = json.loads(body)
        assert doc["channels"] == ["archive"]
        (producer,) = doc["producers"]
        assert producer["broadcast_address"] == "127.0.0.1" and producer["tcp_port"] == 4150
        assert set(producer) == {
            "remote_address",
            "hostname",
            "broadcast_address",
            "tcp_port",
            "http_port",
            "version",
        }
        status, body = http_get(lookupd.http_address, "/nodes")
        assert json.loads(body)["producers"][0]["topics"] == ["orders"]
        status, _ = http_get(
            lookupd.http_address, "/topic/tombstone?topic=orders&node=127.0.0.1:4151", "POST"
        )
        assert status == 200
        assert (
            json.loads(http_get(lookupd.http_address, "/lookup?topic=orders")[1])["producers"] == []
        )
    # connection closed: registrations of that nsqd are dropped (polled for up to 10 s, not
    # 100 tries: under load the server notices the close later)
    deadline = time.monotonic() + 10.0
    while True:
        doc = json.loads(http_get(lookupd.http_address, "/nodes")[1])
        if not doc["producers"] or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert doc == {"producers": []}


def test_http_errors(lookupd: EmbeddedLookupd) -> None:
    assert http_get(lookupd.http_address, "/lookup?topic=nope") == (
        404,
        b'{"message":"TOPIC_NOT_FOUND"}',
    )
    assert http_get(lookupd.http_address, "/lookup")[0] == 400
    assert http_get(lookupd.http_address, "/nowhere")[0] == 404
    assert http_get(lookupd.http_address, "/topic/create?topic=x")[0] == 405
    assert http_get(lookupd.http_address, "/topic/create?topic=x", "POST") == (200, b"")
    assert json.loads(http_get(lookupd.http_address, "/topics")[1]) == {"topics": ["x"]}
    assert http_get(lookupd.http_address, "/channel/create?topic=x&channel=y", "POST")[0] == 200
    assert json.loads(http_get(lookupd.http_address, "/channels?topic=x")[1]) == {"channels": ["y"]}


def test_bad_magic_gets_error_and_close(lookupd: EmbeddedLookupd) -> None:
    with socket.create_connection(("127.0.0.1", lookupd.tcp_port), timeout=5) as sock:
        sock.sendall(b"  V9")
        assert read_response(sock).startswith(b"E_BAD_PROTOCOL")
        assert sock.recv(10) == b""
    # and the server keeps serving
    assert http_get(lookupd.http_address, "/ping") == (200, b"OK")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_async_context_manager_on_both_backends(backend: str) -> None:
    async def main() -> None:
        async with EmbeddedLookupd() as lk:
            stream = await anyio.connect_tcp("127.0.0.1", lk.tcp_port)
            async with stream:
                await stream.send(b"  V1PING\n")
                data = b""
                while len(data) < 6:
                    data += await stream.receive()
                assert data == b"\x00\x00\x00\x02OK"

    anyio.run(main, backend=backend)


def test_head_request_gets_headers_only(lookupd: EmbeddedLookupd) -> None:
    # nsqlookupd routes GET only: HEAD is refused (405 with Allow), as the real one does,
    # and the answer has headers only
    host, port = lookupd.http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        for _ in range(2):  # and the connection stays usable
            conn.request("HEAD", "/ping")
            resp = conn.getresponse()
            assert resp.status == 405 and resp.read() == b""
            assert resp.getheader("Allow") == "GET, OPTIONS"
            assert int(resp.getheader("Content-Length") or 0) > 0
        conn.request("GET", "/ping")
        assert conn.getresponse().read() == b"OK"
    finally:
        conn.close()


def test_expect_100_continue_is_answered(lookupd: EmbeddedLookupd) -> None:
    host, port = lookupd.http_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            b"POST /topic/create?topic=cont HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert s.recv(4096).startswith(b"HTTP/1.1 100")
        s.sendall(b"abc")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")

"""Secrets stay out of every repr, str, log line, exception and stats of the embedded nsqd.

A client's AUTH secret and a token in the auth server's address are planted, an AUTH exchange
is run against a failing auth server that echoes what it was sent, and every text the broker
produced on the way is searched for them.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conformance.wire import RawConn, http_request

from nsq_sansio.server.events import AuthRequested
from nsq_sansio.server.options import AuthRequest
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.embedded.auth import parse_auth_address

SECRET = "planted-Secret-7f3a"
TOKEN = "planted-Token-91c2"


class EchoingAuthServer:
    """Answers 500 with the whole request (secret included) in its body."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = f"cannot check {self.path}".encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)


@pytest.fixture
def echoing_auth_server() -> Iterator[EchoingAuthServer]:
    server = EchoingAuthServer()
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def _texts(value: object) -> list[str]:
    return [repr(value), str(value)]


def test_no_secret_in_reprs_logs_exceptions_or_stats(
    echoing_auth_server: EchoingAuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    address = f"http://user:{TOKEN}@127.0.0.1:{echoing_auth_server.port}/auth?token={TOKEN}"
    server = EmbeddedNSQD(auth_http_addresses=[address, "127.0.0.1:9"])
    seen: list[str] = []
    with ServerThread(server) as nsqd:
        for _ in range(3):  # each server of the two is asked first at least once, likely
            with RawConn(nsqd.tcp_address) as c:
                c.identify()
                c.command("AUTH", SECRET.encode())
                kind, data = c.read_frame()
                assert (kind, data.split(b" ")[0]) == (1, b"E_AUTH_FAILED")
        seen.append(http_request(nsqd.http_address, "GET", "/stats?format=json")[1].decode())
        seen += _texts(nsqd)
        seen += _texts(nsqd.core.options)
    request = AuthRequest("10.0.0.1", False, SECRET)
    seen += _texts(request) + _texts(AuthRequested(1, request))
    url = parse_auth_address(address)
    seen += _texts(url)
    port = str(echoing_auth_server.port)
    for bad in (address.replace(port, "99999"), address.replace("http", "ftp", 1)):
        with pytest.raises(ValueError) as refused:
            parse_auth_address(bad)
        seen.append(str(refused.value))
    seen += [record.getMessage() for record in caplog.records]
    seen += [caplog.text]
    assert any("auth server" in text for text in seen)  # the failures were logged
    for text in seen:
        assert SECRET not in text, text
        assert TOKEN not in text, text
    json.loads(seen[0])  # /stats was read (and held no secret)

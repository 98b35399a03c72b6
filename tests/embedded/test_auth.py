"""AUTH on the embedded nsqd against an HTTP auth server (nsqd's ``--auth-http-address``),
over real loopback sockets: a tiny auth server on a thread, raw protocol V2 and the blocking
client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from conformance.wire import FRAME_RESPONSE, RawConn, http_request, unique, wait_for
from support.ports import refused_address

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.embedded.auth import AuthServerError, parse_auth_address, parse_auth_state


class AuthServer:
    """nsqd's auth protocol: ``GET /auth?remote_ip=&tls=&secret=`` -> JSON, 403 if unknown."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[str, Any]] = {}
        self.raw: dict[str, bytes] = {}  # answers sent as they are (not JSON documents)
        self.queries: list[dict[str, str]] = []
        self.paths: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
                outer.paths.append(url.path)
                outer.queries.append(query)
                answer = outer.answers.get(query.get("secret", ""))
                body = json.dumps(answer).encode() if answer is not None else b"forbidden"
                raw = outer.raw.get(query.get("secret", ""))
                if raw is not None:
                    answer, body = {}, raw
                self.send_response(200 if answer is not None else 403)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def secrets_asked(self) -> list[str]:
        return [q.get("secret", "") for q in self.queries]


@pytest.fixture
def auth_server() -> Iterator[AuthServer]:
    server = AuthServer()
    server.answers["good"] = {
        "ttl": 3600,
        "identity": "alice",
        "identity_url": "https://example.test/alice",
        "authorizations": [
            {"permissions": ["subscribe", "publish"], "topic": "^allowed", "channels": [".*"]}
        ],
    }
    server.answers["reader"] = {
        "ttl": 3600,
        "identity": "bob",
        "authorizations": [{"permissions": ["subscribe"], "topic": ".*", "channels": ["^c$"]}],
    }
    server.answers["nothing"] = {"ttl": 3600, "identity": "eve", "authorizations": []}
    server.thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def _auth(c: RawConn, secret: str) -> tuple[int, bytes]:
    c.command("AUTH", secret.encode())
    return c.read_frame()


def test_auth_through_an_http_auth_server(auth_server: AuthServer) -> None:
    with ServerThread(EmbeddedNSQD(auth_http_addresses=[auth_server.address])) as nsqd:
        topic = "allowed_" + unique()
        with RawConn(nsqd.tcp_address) as c:
            answer = c.identify()
            assert isinstance(answer, dict) and answer["auth_required"] is True
            c.pub(topic, b"x")
            c.expect_error("E_AUTH_FIRST")
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            kind, data = _auth(c, "good")
            assert kind == FRAME_RESPONSE
            assert json.loads(data) == {
                "identity": "alice",
                "identity_url": "https://example.test/alice",
                "permission_count": 1,
            }
            assert auth_server.paths[-1] == "/auth"
            assert auth_server.queries[-1] == {
                "remote_ip": "127.0.0.1",
                "tls": "false",
                "secret": "good",
            }
            c.pub(topic, b"published with AUTH")
            c.expect_ok()
            c.pub("other_" + unique(), b"x")
            c.expect_error("E_UNAUTHORIZED")
        with RawConn(nsqd.tcp_address) as c:  # subscribe-only grant, channel-limited
            c.identify()
            assert _auth(c, "reader")[0] == FRAME_RESPONSE
            c.sub(topic, "c")
            c.command("RDY 1")
            assert c.read_message().body == b"published with AUTH"
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            c.pub(topic, b"x")  # AUTH first, still
            c.expect_error("E_AUTH_FIRST")
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            assert _auth(c, "reader")[0] == FRAME_RESPONSE
            c.pub(topic, b"x")
            c.expect_error("E_UNAUTHORIZED")  # no "publish" permission
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            c.command("AUTH", b"nothing")
            c.expect_error("E_UNAUTHORIZED")  # 200 without authorizations
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            c.command("AUTH", b"wrong")
            c.expect_error("E_AUTH_FAILED")  # the auth server said 403
        assert auth_server.secrets_asked()[-2:] == ["nothing", "wrong"]


def test_the_auth_answer_is_asked_again_when_its_ttl_runs_out(auth_server: AuthServer) -> None:
    auth_server.answers["short"] = {
        "ttl": 1,
        "identity": "carol",
        "authorizations": [{"permissions": ["publish"], "topic": ".*", "channels": [".*"]}],
    }
    runner = ServerThread(EmbeddedNSQD(auth_http_addresses=[auth_server.address]))
    with runner as nsqd, RawConn(nsqd.tcp_address) as c:
        c.identify(heartbeat_interval=60_000)
        assert _auth(c, "short")[0] == FRAME_RESPONSE
        c.pub("t_" + unique(), b"x")
        c.expect_ok()
        wait_for(lambda: auth_server.secrets_asked().count("short") >= 2, timeout=10.0)
        del auth_server.answers["short"]  # revoked: the next re-check fails the client
        c.expect_error("E_AUTH_FAILED")


def test_an_unreachable_auth_server_fails_auth_and_the_next_one_is_tried(
    auth_server: AuthServer,
) -> None:
    dead = refused_address()  # nothing listens there
    runner = ServerThread(EmbeddedNSQD(auth_http_addresses=[dead]))
    with runner as nsqd, RawConn(nsqd.tcp_address) as c:
        c.identify()
        c.command("AUTH", b"good")
        c.expect_error("E_AUTH_FAILED")
    # a full URL with its own path, after a dead one: whichever is first, AUTH succeeds
    full_url = f"http://{auth_server.address}/custom/auth?realm=test"
    with ServerThread(EmbeddedNSQD(auth_http_addresses=[dead, full_url])) as nsqd:
        for _ in range(4):
            with RawConn(nsqd.tcp_address) as c:
                c.identify()
                assert _auth(c, "good")[0] == FRAME_RESPONSE
    assert auth_server.paths[-1] == "/custom/auth"
    assert auth_server.queries[-1]["realm"] == "test"


def test_blocking_clients_authenticate(auth_server: AuthServer) -> None:
    from transports.sync import Consumer, Producer

    with ServerThread(EmbeddedNSQD(auth_http_addresses=[auth_server.address])) as nsqd:
        topic = "allowed_" + unique()
        with Producer(nsqd.tcp_address, auth_secret="good", timeout=10.0) as producer:
            producer.publish(topic, b"hello")
        with Consumer(topic, "c", nsqd=[nsqd.tcp_address], auth_secret="reader") as consumer:
            msg = consumer.get(timeout=10.0)
            assert msg is not None and msg.body == b"hello"
            msg.finish()
    assert {"good", "reader"} <= set(auth_server.secrets_asked())


def test_auth_options_are_checked() -> None:
    with pytest.raises(ValueError, match=r"'127\.0\.0\.1' needs a port"):
        EmbeddedNSQD(auth_http_addresses=["127.0.0.1"])
    with pytest.raises(ValueError, match=r"expected http\(s\)://host\[:port\]/path"):
        EmbeddedNSQD(auth_http_addresses=["ftp://127.0.0.1:21/auth"])
    with pytest.raises(TypeError, match="auth_by_transport is set from"):
        EmbeddedNSQD(auth_by_transport=True)  # set from auth_http_addresses
    assert parse_auth_address("127.0.0.1:4181").target == "/auth"
    state = parse_auth_state(
        {"ttl": 0, "authorizations": [{"permissions": ["publish"], "topic": "t", "channels": []}]}
    )
    assert state.ttl >= 1.0 and state.allows("t", "") is False  # no channel pattern matches ""
    with pytest.raises(AuthServerError):
        parse_auth_state({"authorizations": [{"permissions": ["admin"], "topic": ".*"}]})


HOSTILE_ANSWERS = {
    "secret-deep": b"[" * 200_000 + b"]" * 200_000,  # json.loads: RecursionError
    "secret-garbage": b"\x00\xff not json at all",
    "secret-huge": b'{"identity": "' + b"x" * (3 << 20) + b'"}',
    "secret-shape": b'{"authorizations": [{"topic": 1}]}',
    "echo-secret-42": b'{"authorizations": [{"topic": ".*", "permissions": ["echo-secret-42"]}]}',
}


def test_any_failure_of_the_auth_exchange_is_e_auth_failed_and_the_broker_lives_on(
    auth_server: AuthServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An auth server answering deeply nested JSON used to kill the embedded nsqd (the
    RecursionError ended its task group); garbage, huge or ill-shaped answers are refused the
    same way. The log says what went wrong, never with the secret (the last answer echoes it)."""
    auth_server.raw.update(HOSTILE_ANSWERS)
    caplog.set_level("DEBUG", logger="nsq_sansio")
    with ServerThread(EmbeddedNSQD(auth_http_addresses=[auth_server.address])) as nsqd:
        for secret in HOSTILE_ANSWERS:
            with RawConn(nsqd.tcp_address) as c:
                c.identify()
                kind, data = _auth(c, secret)
                assert (kind, data.split(b" ")[0]) == (1, b"E_AUTH_FAILED"), (secret, data)
        # still serving: a good secret is accepted, /ping answers
        with RawConn(nsqd.tcp_address) as c:
            c.identify()
            assert _auth(c, "good")[0] == FRAME_RESPONSE
            c.pub(unique("allowed"), b"x")
            c.expect_ok()
        assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "nested too deeply" in logged
    assert "echo-secret-42" not in logged


def test_a_backtracking_grant_pattern_does_not_hold_the_broker(auth_server: AuthServer) -> None:
    """nsqd matches grant patterns with RE2, in linear time; Python's re takes ^(a+)+$
    against 'aaa...b' exponentially long. The embedded broker matches with RE2 when the
    google-re2 package is there, and otherwise does not use such a pattern."""
    auth_server.answers["redos"] = {
        "ttl": 3600,
        "authorizations": [{"permissions": ["publish"], "topic": "^(a+)+$", "channels": []}],
    }
    with ServerThread(EmbeddedNSQD(auth_http_addresses=[auth_server.address])) as nsqd:
        with RawConn(nsqd.tcp_address, timeout=5) as c:
            c.identify()
            assert _auth(c, "redos")[0] == FRAME_RESPONSE
            c.pub("a" * 63 + "b", b"x")
            c.expect_error("E_UNAUTHORIZED")
        assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")

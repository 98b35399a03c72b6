"""The admin clients' connections on every runtime, against servers that misbehave on
purpose: keep-alive inside ``with`` (one connection) and a connection per call outside it, a
kept-alive connection the server closed (sent again once, on a fresh one), answers cut
short, refused connections, servers that never answer or drip bytes forever (the whole call
times out), oversized answers (refused without reading them) and garbage."""

from __future__ import annotations

import socket
import time
from typing import Any

import anyio
import pytest

from nsq_sansio.admin import AdminResponseError
from nsq_sansio.errors import ConfigError, ConnectionLost, RemoteProtocolError

from ._fake import answer, fake_server, read_request
from .conftest import AdminRuntime

pytestmark = pytest.mark.anyio


def serve_pings(conn: socket.socket) -> None:
    """Keep-alive: answer every request on the connection."""
    while read_request(conn):
        conn.sendall(answer(b"OK"))


def one_answer_then_close(conn: socket.socket) -> None:
    """Says keep-alive, then closes after the first answer (an idle timeout, a restart)."""
    if read_request(conn):
        conn.sendall(answer(b"OK"))


async def test_one_connection_inside_with(runtime: AdminRuntime) -> None:
    with fake_server(serve_pings) as server:
        async with runtime.nsqd(server.url) as nsqd:
            for _ in range(3):
                await nsqd.ping()
        assert server.connections == 1


async def test_a_connection_per_call_outside_with(runtime: AdminRuntime) -> None:
    with fake_server(serve_pings) as server:
        nsqd = runtime.make("NSQDAdmin", server.url)
        for _ in range(3):
            await nsqd.ping()
        await nsqd.close()
        assert server.connections == 3


async def test_a_kept_alive_connection_the_server_closed_is_replaced(
    runtime: AdminRuntime,
) -> None:
    with fake_server(one_answer_then_close) as server:
        async with runtime.nsqd(server.url) as nsqd:
            for _ in range(3):
                await nsqd.ping()
        assert server.connections == 3


async def test_an_answer_cut_short_is_connection_lost_and_not_sent_again(
    runtime: AdminRuntime,
) -> None:
    def cut(conn: socket.socket) -> None:
        if read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")

    with fake_server(cut) as server:
        async with runtime.nsqd(server.url) as nsqd:
            with pytest.raises(ConnectionLost):
                await nsqd.info()
        assert server.connections == 1


async def test_refused_connection(runtime: AdminRuntime) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    async with runtime.lookupd(f"127.0.0.1:{port}") as lookupd:
        with pytest.raises(ConnectionLost, match="cannot connect"):
            await lookupd.ping()


@pytest.mark.parametrize("drip", [False, True], ids=["silent", "drip"])
async def test_the_whole_call_times_out(runtime: AdminRuntime, drip: bool) -> None:
    """A server that never answers, or sends a byte now and then forever: ``timeout`` bounds
    the call, not each read."""

    def stall(conn: socket.socket) -> None:
        read_request(conn)
        if drip:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                conn.sendall(b"1\r\nx\r\n")
                time.sleep(0.05)
        conn.recv(1)  # until the client gives up

    with fake_server(stall) as server:
        async with runtime.nsqd(server.url, timeout=0.5) as nsqd:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await nsqd.stats()
            assert time.monotonic() - started < 5
            # the connection is gone with its half-read answer: the next call starts afresh
            with pytest.raises(TimeoutError):
                await nsqd.stats()
        assert server.connections == 2


async def test_oversized_answers_are_refused_without_reading_them(runtime: AdminRuntime) -> None:
    sent: list[int] = []

    def huge(conn: socket.socket) -> None:
        request = read_request(conn)
        if b"/info" in request:  # announced: refused before any of it
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n")
            conn.recv(1)
            return
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
        total = 0
        try:
            while total < 1 << 30:
                conn.sendall(block)
                total += len(block)
        finally:
            sent.append(total)

    with fake_server(huge) as server:
        async with runtime.nsqd(server.url, max_response_size=1 << 20) as nsqd:
            with pytest.raises(RemoteProtocolError, match="over"):
                await nsqd.info()
            with pytest.raises(RemoteProtocolError, match="over 1048576 bytes"):
                await nsqd.stats()
        with anyio.fail_after(5):
            while not sent:
                await anyio.sleep(0.01)
    # the client stopped reading and closed: the server could not push its gigabyte
    assert sent[0] < 64 << 20


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", RemoteProtocolError),
        (answer(b"<html>not nsqd</html>"), AdminResponseError),
        (answer(b'{"topics": "many"}'), AdminResponseError),
    ],
)
async def test_garbage_is_a_typed_error(
    runtime: AdminRuntime, reply: bytes, error: type[Exception]
) -> None:
    def garbage(conn: socket.socket) -> None:
        while read_request(conn):
            conn.sendall(reply)

    with fake_server(garbage) as server:
        async with runtime.nsqd(server.url) as nsqd:
            with pytest.raises(error):
                await nsqd.stats()


async def test_path_prefix_user_agent_and_host(runtime: AdminRuntime) -> None:
    seen: list[bytes] = []

    def record(conn: socket.socket) -> None:
        while request := read_request(conn):
            seen.append(request)
            conn.sendall(answer(b'{"topics":["b","a"]}'))

    with fake_server(record) as server:
        async with runtime.lookupd(f"{server.url}/nsq/", user_agent="ops-tool/2") as lookupd:
            assert await lookupd.topics() == ("a", "b")
    head = seen[0].decode().lower()
    assert head.startswith("get /nsq/topics http/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}\r\n" in head and "user-agent: ops-tool/2" in head


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("http://127.0.0.1:4151", {"tls": object()}),
        ("ftp://127.0.0.1", {}),
        ("127.0.0.1:4151", {"timeout": 0}),
        ("127.0.0.1:4151", {"connect_timeout": -1}),
        ("127.0.0.1:4151", {"max_response_size": 0}),
    ],
)
def test_bad_options_are_config_errors(url: str, options: dict[str, Any]) -> None:
    from transports.anyio import admin as async_admin
    from transports.sync import admin as sync_admin

    for module in (async_admin, sync_admin):
        for cls in (module.NSQDAdmin, module.LookupdAdmin):
            with pytest.raises(ConfigError):
                cls(url, **options)

"""nsqd creating a topic asks its nsqlookupds for the topic's channels (``GET /channels``)
before it answers, and creates them, so a topic's first messages reach the channels its
consumers will subscribe to. Each test runs the same probe against the embedded nsqd and the
real one (when its binaries are there): the real nsqd is the referee.

A stand-in nsqlookupd (:class:`StandInLookupd`) speaks just enough of the lookup protocol for
an nsqd to register, and answers IDENTIFY with the HTTP port of our choosing: one that never
answers (a slow nsqlookupd) or one where nothing listens (an nsqlookupd that is down).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from conformance.wire import RawConn, http_json, http_request, unique, wait_for
from support.ports import refused_address

from transports.embedded import EmbeddedLookupd, EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

KINDS = ["embedded", "real"]
TIMEOUT = 1.0  # --http-client-request-timeout: how long a topic may wait for nsqlookupd


class _TCPServer:
    """A loopback TCP server: one thread accepts, one thread serves each connection
    (:meth:`serve`); :meth:`close` closes the port and every connection."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._server.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._server.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.close()


class StandInLookupd(_TCPServer):
    """The TCP side of an nsqlookupd: IDENTIFY answered with ``http_port``, every other
    command with ``OK``; records the topics nsqd registers."""

    def __init__(self, http_port: int) -> None:
        self.http_port = http_port
        self.registered: list[str] = []
        super().__init__()
        self.tcp_address = f"127.0.0.1:{self.port}"

    def serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        with contextlib.suppress(OSError, ValueError):
            if reader.read(4) != b"  V1":
                return
            while line := reader.readline():
                words = line.strip().split(b" ")
                if words[0] == b"IDENTIFY":
                    (size,) = struct.unpack(">i", reader.read(4))
                    reader.read(size)
                    info = {
                        "tcp_port": 1,
                        "http_port": self.http_port,
                        "version": "1.3.0",
                        "broadcast_address": "127.0.0.1",
                        "hostname": "stand-in",
                    }
                    answer = json.dumps(info).encode()
                else:
                    if words[0] == b"REGISTER" and len(words) == 2:
                        self.registered.append(words[1].decode())
                    answer = b"OK"
                conn.sendall(struct.pack(">i", len(answer)) + answer)


class SilentHTTP(_TCPServer):
    """An HTTP port that reads what it is asked and never answers; records the requests, so
    a test can see when nsqd has asked (and is waiting)."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []  # what each connection sent, in order
        super().__init__()

    def serve(self, conn: socket.socket) -> None:
        received = bytearray()
        self.received.append(received)
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                received += data

    def asked_for(self, topic: str) -> bool:
        """nsqd has sent its request for ``topic``'s channels."""
        request = f"/channels?topic={topic} ".encode()
        return any(request in bytes(data) for data in self.received)


@contextlib.contextmanager
def silent_http() -> Iterator[SilentHTTP]:
    silent = SilentHTTP()
    try:
        yield silent
    finally:
        silent.close()


@contextlib.contextmanager
def nsqd(kind: str, lookupd_tcp: str) -> Iterator[tuple[str, str]]:
    """An nsqd registered with ``lookupd_tcp`` that asks nsqlookupd for at most TIMEOUT."""
    if kind == "embedded":
        server = EmbeddedNSQD(
            lookupd_tcp_addresses=[lookupd_tcp], http_client_request_timeout=TIMEOUT
        )
        with ServerThread(server) as embedded:
            yield embedded.tcp_address, embedded.http_address
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flags = [f"--http-client-request-timeout={int(TIMEOUT * 1000)}ms"]
    with RealNSQD(flags, lookupd=[lookupd_tcp]) as real:
        yield real.tcp_address, real.http_address


def wait_until_asking(stand_in: StandInLookupd, nsqd_tcp: str) -> None:
    """Until nsqd has nsqlookupd's answer to IDENTIFY (it asks only then): nsqd registers
    what it creates after that answer, so a topic seen registered means it has it."""
    probe = unique("probe")
    with RawConn(nsqd_tcp) as conn:
        conn.pub(probe, b"x")
        conn.expect_ok()
    wait_for(lambda: probe in stand_in.registered, timeout=10.0)


def timed_pub(conn: RawConn, topic: str, body: bytes) -> float:
    started = time.monotonic()
    conn.pub(topic, body)
    conn.expect_ok()
    return time.monotonic() - started


def bodies_on(nsqd_tcp: str, topic: str, channel: str, count: int) -> list[bytes]:
    with RawConn(nsqd_tcp) as consumer:
        consumer.sub(topic, channel)
        consumer.command(f"RDY {count}")
        got = []
        for _ in range(count):
            message = consumer.read_message()
            consumer.fin(message)
            got.append(message.body)
        return got


@pytest.mark.parametrize("kind", KINDS)
def test_the_first_messages_reach_the_channels_nsqlookupd_knows(kind: str) -> None:
    """Over TCP and over HTTP: the channels nsqlookupd lists for a new topic exist before
    nsqd answers the publish that created it, and hold its first message; an #ephemeral
    one is not made (no consumer is there to take it)."""
    with (
        ServerThread(EmbeddedLookupd()) as lookupd,
        nsqd(kind, lookupd.tcp_address) as (tcp, http),
    ):
        wait_until_asking_lookupd(lookupd, tcp)
        for how in ("tcp", "http"):
            topic = unique(how)
            for channel in ("archive", "audit", "live#ephemeral"):
                path = f"/channel/create?topic={topic}&channel={quote(channel)}"
                assert http_request(lookupd.http_address, "POST", path)[0] == 200
            if how == "tcp":
                with RawConn(tcp) as producer:
                    producer.pub(topic, b"first")
                    producer.expect_ok()
            else:
                path = f"/pub?topic={topic}"
                assert http_request(http, "POST", path, b"first")[:2] == (200, b"OK")
            (stats,) = http_json(http, "GET", f"/stats?format=json&topic={topic}")["topics"]
            assert sorted(c["channel_name"] for c in stats["channels"]) == [
                "archive",
                "audit",
            ]
            for channel in ("archive", "audit"):
                assert bodies_on(tcp, topic, channel, 1) == [b"first"]


def wait_until_asking_lookupd(lookupd: Any, nsqd_tcp: str) -> None:
    """As :func:`wait_until_asking`, with an embedded nsqlookupd's registry."""
    probe = unique("probe")
    with RawConn(nsqd_tcp) as conn:
        conn.pub(probe, b"x")
        conn.expect_ok()

    def registered() -> bool:
        found = http_json(lookupd.http_address, "GET", "/topics")["topics"] or []
        return probe in found

    wait_for(registered, timeout=10.0)


@pytest.mark.parametrize("kind", KINDS)
def test_a_silent_nsqlookupd_delays_the_creator_for_the_timeout_and_no_one_else(
    kind: str,
) -> None:
    """nsqd waits for nsqlookupd at most --http-client-request-timeout, then creates the
    topic without its channels. Only the publish that created the topic waits: another
    producer's publish to it meanwhile is answered at once, and nothing published while
    nsqd waited is lost or out of its producer's order."""
    with silent_http() as silent:
        stand_in = StandInLookupd(silent.port)
        try:
            with nsqd(kind, stand_in.tcp_address) as (tcp, _http):
                wait_until_asking(stand_in, tcp)
                topic = unique("slow")
                with RawConn(tcp) as creator, RawConn(tcp) as other:
                    started = time.monotonic()
                    creator.pub(topic, b"a1")
                    # nsqd has made the topic and waits for nsqlookupd's answer once it asked
                    wait_for(lambda: silent.asked_for(topic))
                    assert timed_pub(other, topic, b"b1") < TIMEOUT / 2
                    creator.expect_ok()
                    waited = time.monotonic() - started
                    assert TIMEOUT * 0.8 < waited < TIMEOUT + 2.0, waited
                    assert timed_pub(creator, topic, b"a2") < TIMEOUT / 2
                got = bodies_on(tcp, topic, "c", 3)
                assert sorted(got) == [b"a1", b"a2", b"b1"]
                assert got.index(b"a1") < got.index(b"a2")
        finally:
            stand_in.close()


@pytest.mark.parametrize("kind", KINDS)
def test_an_nsqlookupd_that_is_down_does_not_delay_the_topic(kind: str) -> None:
    """nsqlookupd's HTTP port refuses the connection: nsqd goes on at once."""
    stand_in = StandInLookupd(int(refused_address().rsplit(":", 1)[1]))  # nothing listens there
    try:
        with nsqd(kind, stand_in.tcp_address) as (tcp, http):
            wait_until_asking(stand_in, tcp)
            topic = unique("down")
            with RawConn(tcp) as producer:
                assert timed_pub(producer, topic, b"kept") < TIMEOUT / 2
            started = time.monotonic()
            assert http_request(http, "POST", f"/pub?topic={unique('down')}", b"x")[0] == 200
            assert time.monotonic() - started < TIMEOUT / 2
            assert bodies_on(tcp, topic, "c", 1) == [b"kept"]
    finally:
        stand_in.close()

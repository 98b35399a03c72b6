"""When no nsqd can take a publish, every runtime says so within the dial timeout
(``connect_timeout``), not the publish timeout, with each address's cause in the message and
chained: a closed port ("connection refused"), a listener that accepts and never answers (a hung
nsqd: "the handshake (IDENTIFY) got no answer"). ``connect()`` fails the same way at start-up.
A publish already written to a connection that stops answering keeps its own deadline.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
from support.brokers import unique
from support.ports import refused_address
from support.runtimes import Runtime

from nsq_sansio.errors import ConnectionLost, NoNSQDAvailable
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio

#: The publish's own timeout: far longer than the dial timeout, so a wait for it shows.
PUBLISH_TIMEOUT = 20.0
CONNECT_TIMEOUT = 1.0
#: How long failing may take at most: the dial timeout and some slack for a loaded machine.
FAIL_WITHIN = CONNECT_TIMEOUT + 3.0


class _Silent:
    """A listener that accepts connections and never sends a byte (a hung nsqd); with
    ``answer_identify`` it answers IDENTIFY with OK and then stays silent (an nsqd that stops
    answering once connected)."""

    def __init__(self, *, answer_identify: bool = False) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.answer_identify = answer_identify
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)
            if self.answer_identify:
                threading.Thread(target=self._identify, args=(conn,), daemon=True).start()

    @staticmethod
    def _identify(conn: socket.socket) -> None:
        data = b""
        try:
            while b"IDENTIFY\n" not in data or len(data) < data.index(b"IDENTIFY\n") + 13:
                data += conn.recv(4096)
            at = data.index(b"IDENTIFY\n") + 9
            while len(data) < at + 4 + int.from_bytes(data[at : at + 4], "big"):
                data += conn.recv(4096)
            conn.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[_Silent]:
    server = _Silent()
    yield server
    server.close()


async def _call(runtime: Runtime, method: Any, *args: Any) -> Any:
    """A client method, awaited (async) or run on a worker thread (blocking)."""
    if runtime.blocking:
        return await anyio.to_thread.run_sync(functools.partial(method, *args))
    return await method(*args)


def _assert_cause(error: NoNSQDAvailable, address: str, text: str) -> None:
    assert f"{address}: " in str(error) and text in str(error), str(error)
    assert "None" not in str(error) and "no nsqd configured" not in str(error)
    (cause,) = error.errors
    assert isinstance(cause, ConnectionLost) and str(cause).startswith(f"{address}: ")
    assert error.__cause__ is cause


async def test_a_closed_port_fails_the_publish_at_once(runtime: Runtime) -> None:
    address = refused_address()
    async with runtime.producer(
        address, timeout=PUBLISH_TIMEOUT, connect_timeout=CONNECT_TIMEOUT
    ) as p:
        for _ in range(2):  # and again: the next publish tries to connect again
            started = time.monotonic()
            with pytest.raises(NoNSQDAvailable) as raised:
                await p.publish(unique(), b"x")
            assert time.monotonic() - started < FAIL_WITHIN
            _assert_cause(raised.value, address, "connection refused")
            assert isinstance(raised.value.errors[0].__cause__, ConnectionRefusedError)


async def test_a_hung_nsqd_fails_the_publish_within_the_dial_timeout(
    runtime: Runtime, silent: _Silent
) -> None:
    async with runtime.producer(
        silent.address, timeout=PUBLISH_TIMEOUT, connect_timeout=CONNECT_TIMEOUT
    ) as p:
        started = time.monotonic()
        with pytest.raises(NoNSQDAvailable) as raised:
            await p.publish(unique(), b"x")
        elapsed = time.monotonic() - started
    assert CONNECT_TIMEOUT * 0.9 <= elapsed < FAIL_WITHIN
    _assert_cause(raised.value, silent.address, "handshake (IDENTIFY) got no answer within 1 s")


async def test_connect_fails_at_start_up_and_succeeds_when_nsqd_is_up(
    runtime: Runtime, nsqd: EmbeddedNSQD, silent: _Silent
) -> None:
    closed = refused_address()
    for address, text in ((closed, "connection refused"), (silent.address, "handshake")):
        async with runtime.producer(
            address, timeout=PUBLISH_TIMEOUT, connect_timeout=CONNECT_TIMEOUT
        ) as p:
            started = time.monotonic()
            with pytest.raises(NoNSQDAvailable, match="no nsqd could take a connection") as e:
                await _call(runtime, p.client.connect)
            assert time.monotonic() - started < FAIL_WITHIN
            _assert_cause(e.value, address, text)
    async with runtime.producer([closed, nsqd.tcp_address], connect_timeout=CONNECT_TIMEOUT) as p:
        await _call(runtime, p.client.connect)  # one nsqd up is enough
        states = {c.address: c.state for c in p.stats().connections}
        assert states[nsqd.tcp_address] == "ready"
        await p.publish(unique(), b"x")


async def test_a_written_publish_keeps_its_own_deadline(runtime: Runtime) -> None:
    """Connected (IDENTIFY answered), then nsqd says nothing: the publish was written, so it
    waits for its answer until its own timeout, and says it timed out (it may be stored)."""
    server = _Silent(answer_identify=True)
    try:
        async with runtime.producer(server.address, timeout=2.0, connect_timeout=0.5) as p:
            await _call(runtime, p.client.connect)
            started = time.monotonic()
            with pytest.raises(TimeoutError, match=r"PUB to '.*': no answer from .* within 2 s"):
                await p.publish(unique(), b"x")
            assert time.monotonic() - started >= 1.8
    finally:
        server.close()


async def test_the_http_producer_names_each_cause(runtime: Runtime, silent: _Silent) -> None:
    closed = refused_address()
    http = runtime.module.HTTPProducer(f"http://{closed}", timeout=PUBLISH_TIMEOUT)
    with pytest.raises(NoNSQDAvailable) as raised:
        await _call(runtime, http.publish, unique(), b"x")
    _assert_cause(raised.value, closed, "connection refused")
    await _call(runtime, http.close)
    hung = runtime.module.HTTPProducer(f"http://{silent.address}", timeout=1.0)
    with pytest.raises(TimeoutError, match=r"PUB to '.*': no answer from .* within 1 s"):
        await _call(runtime, hung.publish, unique(), b"x")
    await _call(runtime, hung.close)

"""The HTTP producer against an nsqd that hangs or fails mid-request, on every runtime: a
request is sent again only when it provably reached no nsqd, so nsqd stores each failed call
once or not at all (never twice), one call takes no longer than its timeout (a free
connection slot, connecting and the answer together), and an answer is read only up to its
bound.

A hung nsqd is the real one stopped with SIGSTOP (the kernel still accepts connections and
buffers requests; nothing is answered until SIGCONT) or the embedded one with its event loop
held; the faults only a server can choose (closing the connection after reading a request,
an endless answer) come from a small scripted HTTP server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import anyio
import pytest
from support.brokers import (
    BROKER_KINDS,
    embedded_topic_count,
    paused,
    running_nsqd,
    topic_count,
    unique,
    wait_for,
)
from support.runtimes import HTTPDriver, Runtime
from support.scripted_http import scripted

from nsq_sansio.errors import ConnectionLost, NoNSQDAvailable, RemoteProtocolError
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.testing.real_nsq import RealNSQD, free_port

pytestmark = pytest.mark.anyio

#: One publish's timeout in these tests.
TIMEOUT = 2.0
#: How much later than its timeout a call may end on a loaded machine.
MARGIN = 1.0


# --- a hung nsqd: the real one (SIGSTOP) or the embedded one (its loop held) ------------------


class _Broker:
    """One nsqd (embedded or real) to hang, resume and count messages on."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._real: RealNSQD | None = None
        self._runner: ServerThread[EmbeddedNSQD] | None = None
        self._embedded: AbstractContextManager[tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]]
        self.http_url = ""

    def __enter__(self) -> _Broker:
        if self.kind == "real":
            self._real = RealNSQD().__enter__()
            self.http_url = self._real.http_url
        else:
            self._embedded = running_nsqd()
            server, self._runner = self._embedded.__enter__()
            self.http_url = server.http_url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._real is not None:
            self._real.close()
        else:
            self._embedded.__exit__(None, None, None)

    def hung(self) -> AbstractContextManager[None]:
        """Nothing is read or answered inside the block; connections are still accepted."""
        if self._real is not None:
            return paused(self._real)
        assert self._runner is not None
        return _held(self._runner)

    def count(self, topic: str) -> int:
        """Messages stored for ``topic``."""
        if self._real is not None:
            return topic_count(self._real, topic)
        assert self._runner is not None
        return embedded_topic_count(self._runner, topic)

    def settled_count(self, topic: str, at_least: int) -> int:
        """The count once ``at_least`` messages are stored and a publish made after them is
        stored too (what was buffered while hung has been handled by then)."""
        wait_for(lambda: self.count(topic) >= at_least, what=f"{at_least} on {topic}")
        marker = unique("marker")
        _post(self.http_url, marker)
        wait_for(lambda: self.count(marker) == 1, what="the marker")
        return self.count(topic)


@contextmanager
def _held(runner: ServerThread[EmbeddedNSQD]) -> Iterator[None]:
    """Hold the embedded nsqd's event loop: what SIGSTOP does to the real one."""
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:  # runs on the server's loop and blocks it
        holding.set()
        release.wait(60)

    thread = threading.Thread(target=runner.call, args=(hold,), daemon=True)
    thread.start()
    assert holding.wait(5)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


def _post(http_url: str, topic: str) -> None:
    import urllib.request

    request = urllib.request.Request(f"{http_url}/pub?topic={topic}", data=b"m", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.read() == b"OK"


@pytest.fixture(params=BROKER_KINDS)
def broker(request: pytest.FixtureRequest) -> Iterator[_Broker]:
    with _Broker(str(request.param)) as made:
        yield made


async def _timed_out(http: HTTPDriver, topic: str, body: bytes) -> float:
    """Publish to a hung nsqd: TimeoutError (naming the call) after the timeout, not later."""
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"PUB to '{topic}': no answer from .* within 2 s"):
        await http.publish(topic, body)
    elapsed = time.monotonic() - started
    assert TIMEOUT * 0.9 <= elapsed <= TIMEOUT + MARGIN, elapsed
    return elapsed


@pytest.mark.parametrize("pooled", [False, True], ids=["new-connection", "pooled"])
async def test_a_hung_nsqd_stores_a_timed_out_publish_once(
    runtime: Runtime, broker: _Broker, pooled: bool
) -> None:
    """The request was written whole: it is not sent again, on this connection or another,
    and the call ends at its timeout; nsqd stores it once it runs again."""
    topic = unique()
    async with runtime.http_producer(broker.http_url, timeout=TIMEOUT) as http:
        if pooled:
            await http.publish(topic, b"warm")
        with broker.hung():
            await _timed_out(http, topic, b"hung")
        await http.publish(topic, b"after")  # the producer goes on once nsqd does
    assert broker.settled_count(topic, 2 + pooled) == 2 + pooled


async def test_a_call_waiting_for_a_connection_slot_keeps_its_timeout(
    runtime: Runtime, broker: _Broker
) -> None:
    """With every connection slot held by a call nsqd does not answer, a later call's
    timeout covers its wait for a slot too: each call ends within its own timeout, and nsqd
    stores exactly the calls that were written (those that say "no answer")."""
    topic = unique()
    async with runtime.http_producer(broker.http_url, timeout=TIMEOUT, max_connections=1) as http:
        ended: dict[str, float] = {}
        errors: dict[str, BaseException] = {}

        async def one(name: str, delay: float) -> None:
            await anyio.sleep(delay)
            started = time.monotonic()
            try:
                await http.publish(topic, name.encode())
            except Exception as exc:
                errors[name] = exc
            ended[name] = time.monotonic() - started

        with broker.hung():
            async with anyio.create_task_group() as tg:
                for i in range(3):  # the later ones start while the first holds the slot
                    tg.start_soon(one, f"call{i}", 0.3 * i)
    assert all(isinstance(error, TimeoutError) for error in errors.values()), errors
    assert len(errors) == 3
    assert all(elapsed <= TIMEOUT + MARGIN for elapsed in ended.values()), ended
    written = [name for name, error in errors.items() if "no answer from" in str(error)]
    assert "call0" in written
    assert all(
        "no HTTP connection free within 2 s" in str(error)
        for name, error in errors.items()
        if name not in written
    ), errors
    assert broker.settled_count(topic, len(written)) == len(written)


# --- faults a scripted server chooses ---------------------------------------------------------


async def test_a_request_lost_after_it_was_written_is_not_sent_again(runtime: Runtime) -> None:
    """nsqd read the request and the connection then failed without an answer (nsqd may have
    stored it): the call raises ConnectionLost at once, and the request went out once, not
    again on a fresh connection nor to the next nsqd."""
    with scripted(lambda n: "ok" if n == 1 else "drop") as first, scripted(lambda n: "ok") as other:
        async with runtime.http_producer([first.url, other.url], timeout=TIMEOUT) as http:
            await http.publish("t", b"warm")  # to the first (round robin starts there)
            await http.publish("t", b"warm")  # to the other: both have a pooled connection
            for pooled in (True, False):  # a pooled connection, then a new one
                before = first.requests + other.requests
                started = time.monotonic()
                with pytest.raises(ConnectionLost, match="may have been stored") as raised:
                    await http.publish("t", b"lost")
                assert time.monotonic() - started < TIMEOUT
                assert first.requests + other.requests == before + 1, pooled
                assert first.url.removeprefix("http://") in str(raised.value)
                await http.publish("t", b"next")  # to the other, in turn
    assert other.requests == 3


async def test_a_server_that_never_answers_gets_the_request_once(runtime: Runtime) -> None:
    """An nsqd that reads the request and never answers: TimeoutError at the timeout, and the
    request was read once, not sent again to it nor to the next URL."""
    with scripted(lambda n: "hang") as hung, scripted(lambda n: "ok") as other:
        async with runtime.http_producer([hung.url, other.url], timeout=TIMEOUT) as http:
            started = time.monotonic()
            with pytest.raises(TimeoutError, match=r"PUB to 't': no answer from .* within 2 s"):
                await http.publish("t", b"x")
            assert TIMEOUT * 0.9 <= time.monotonic() - started <= TIMEOUT + MARGIN
        assert (hung.requests, other.requests) == (1, 0)


async def test_a_pooled_connection_nsqd_closed_is_not_used(runtime: Runtime) -> None:
    """nsqd closed a kept-alive connection while it sat in the pool (an idle timeout, a
    restart): nothing was sent on it, so the next publish goes on a fresh connection and is
    stored once."""
    with scripted(lambda n: "ok-then-close" if n == 1 else "ok") as server:
        async with runtime.http_producer(server.url, timeout=TIMEOUT) as http:
            await http.publish("t", b"first")
            assert server.closed.wait(5)
            await http.publish("t", b"second")
        assert server.requests == 2


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_a_restarted_nsqd_gets_the_next_publish_once(runtime: Runtime, kind: str) -> None:
    """The same with a real restart: the pooled connection is dead, the publish is stored
    once on the nsqd that came back."""
    topic = unique()
    if kind == "real":
        with RealNSQD() as real:
            async with runtime.http_producer(real.http_url, timeout=TIMEOUT) as http:
                await http.publish(topic, b"before")
                real.stop()
                real.start()
                await http.publish(topic + "_after", b"after")
            assert topic_count(real, topic + "_after") == 1
        return
    address = f"127.0.0.1:{free_port()}"
    async with runtime.http_producer(f"http://{address}", timeout=TIMEOUT) as http:
        with running_nsqd(http_address=address) as (_, runner):
            await http.publish(topic, b"before")
        with running_nsqd(http_address=address) as (_, runner):
            await http.publish(topic, b"after")
            assert embedded_topic_count(runner, topic) == 1


async def test_an_endless_answer_is_refused_not_buffered(runtime: Runtime) -> None:
    """An answer larger than any nsqd sends is a broken answer: the call raises
    RemoteProtocolError after reading a bounded amount, not when the body ends."""
    with scripted(lambda n: "endless") as server:
        async with runtime.http_producer(server.url, timeout=30.0) as http:
            started = time.monotonic()
            with pytest.raises(RemoteProtocolError, match="over 65536 bytes"):
                await http.publish("t", b"x")
            assert time.monotonic() - started < 10
        assert server.closed.wait(10)
    assert server.requests == 1
    # what the server got out before the client hung up: the bound and the socket buffers
    assert server.sent_bytes < 32 * 1024 * 1024, server.sent_bytes


async def test_no_nsqd_reachable_within_the_timeout(runtime: Runtime) -> None:
    """Connecting takes the whole timeout (a TLS handshake the server never answers): the
    call ends at its timeout with NoNSQDAvailable (nothing was sent), naming the URL."""
    with scripted(lambda n: "ok", silent=True) as server:
        url = server.url.replace("http://", "https://")
        async with runtime.http_producer(
            url, timeout=TIMEOUT, connect_timeout=30.0, tls_verify=False
        ) as http:
            started = time.monotonic()
            with pytest.raises(NoNSQDAvailable, match=url.removeprefix("https://")):
                await http.publish("t", b"x")
            assert time.monotonic() - started <= TIMEOUT + MARGIN
    assert server.requests == 0


@pytest.mark.parametrize("kind", BROKER_KINDS)
async def test_https_publishes_on_kept_alive_connections(
    runtime: Runtime, kind: str, tmp_path: Path
) -> None:
    """Over TLS (a private CA) too: each publish is stored once, on the pooled connection
    when nsqd keeps it."""
    pytest.importorskip("cryptography")
    from support.tls import make_test_ca

    ca = make_test_ca(tmp_path)
    topic = unique()
    with ExitStack() as stack:
        if kind == "real":
            port = free_port()
            real = stack.enter_context(
                RealNSQD(
                    [
                        f"--https-address=127.0.0.1:{port}",
                        f"--tls-cert={ca.cert_file}",
                        f"--tls-key={ca.key_file}",
                    ]
                )
            )
            url = f"https://127.0.0.1:{port}"

            def stored() -> int:
                return topic_count(real, topic)
        else:
            server = EmbeddedNSQD(
                tls_cert=ca.cert_file, tls_key=ca.key_file, https_address="127.0.0.1:0"
            )
            runner = stack.enter_context(_running(server))
            url = f"https://{server.https_address}"

            def stored() -> int:
                return embedded_topic_count(runner, topic)

        async with runtime.http_producer(url, timeout=TIMEOUT, tls_ca_file=ca.ca_file) as http:
            for i in range(3):
                await http.publish(topic, b"%d" % i)
            await http.multi_publish(topic, [b"a\n", b"b"])
        assert await anyio.to_thread.run_sync(stored) == 5


@contextmanager
def _running(server: EmbeddedNSQD) -> Iterator[ServerThread[EmbeddedNSQD]]:
    runner = ServerThread(server)
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()

"""The Producer's per-call guarantees on every runtime, against the real nsqd and the embedded
broker (real-nsqd tests skip without the binaries).

Each publish gets its own answer or its own error: a refused publish fails only itself and the
next one reconnects; a refused IDENTIFY is raised by every publish, also one started among
others, not retried; the publish observer sees every request once.
What only one API has (cancelling a task, a future's own deadline, memory under 100k
``publish_async``) is tested in tests/aio and tests/sync.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import anyio.to_thread
import pytest
from support.brokers import (
    embedded_topic_count,
    needs_real,
    paused,
    running_nsqd,
    topic_count,
    unique,
)
from support.ports import refused_address
from support.runtimes import Runtime, recorder, wait_until

import transports.anyio
import transports.sync
import transports.trio
from nsq_sansio.errors import BadMessage, IdentifyRejected, InvalidName, NoNSQDAvailable
from transports._common import TOPICS_REMEMBERED
from transports.embedded import EmbeddedNSQD
from transports.testing.real_nsq import RealNSQD

pytestmark = pytest.mark.anyio

# --- after a refused publish, the next one works ---------------------------------------------


async def _refused_then_next(runtime: Runtime, address: str) -> None:
    topic = unique()
    async with runtime.producer(address) as p:
        await p.publish(topic, b"first")
        with pytest.raises(BadMessage):
            await p.publish(topic, b"B" * 2000)
        # nsqd closed the connection after E_BAD_MESSAGE: the next publishes reconnect at once.
        started = time.monotonic()
        for i in range(3):
            await p.publish(topic, b"small %d" % i, timeout=5)
        assert time.monotonic() - started < 1.0
        stats = p.stats()
    assert (stats.published, stats.failed) == (4, 1)


@needs_real
async def test_next_publish_after_a_refused_one_succeeds_real(runtime: Runtime) -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        await _refused_then_next(runtime, nsqd.tcp_address)
        topics = [t["topic_name"] for t in nsqd.stats()["topics"]]
        assert len(topics) == 1 and topic_count(nsqd, topics[0]) == 4


async def test_next_publish_after_a_refused_one_succeeds_embedded(runtime: Runtime) -> None:
    with running_nsqd(max_msg_size=1024) as (server, _):
        await _refused_then_next(runtime, server.tcp_address)


async def test_refused_publishes_in_a_pipeline_fail_only_themselves_embedded(
    runtime: Runtime,
) -> None:
    topic = unique()
    with running_nsqd(max_msg_size=1024) as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            await p.publish(topic, b"warm")
            outcomes = await p.concurrently(
                [
                    ("multi_publish", (topic, [b"ok", b"B" * 2000]))
                    if i % 10 == 5
                    else ("publish", (topic, b"%d" % i))
                    for i in range(100)
                ],
                timeout=15,
            )
    failed = {i for i, error in enumerate(outcomes) if error is not None}
    assert failed == set(range(5, 100, 10))
    assert all(isinstance(outcomes[i], BadMessage) for i in failed)


# --- a refused IDENTIFY is raised, once per publish, never retried ---------------------------


async def _identify_refused(runtime: Runtime, addresses: list[str]) -> None:
    seen, observe = recorder()
    async with runtime.producer(
        addresses, output_buffer_timeout=0.01, publish_observer=observe, timeout=30
    ) as p:
        for _ in range(2):  # a later publish tries again, and fails the same way, quickly
            started = time.monotonic()
            with pytest.raises(IdentifyRejected) as info:
                await p.publish("t", b"x", timeout=10)
            assert time.monotonic() - started < 5.0
            assert info.value.code == "E_BAD_BODY"
            assert "output buffer timeout" in info.value.text
        # one started among others (a task, a future) fails the same way
        [outcome] = await p.concurrently([("publish", ("t", b"x"))], timeout=10)
        assert isinstance(outcome, IdentifyRejected)
        assert p.stats().published == 0
    assert [type(e) for _, _, _, e in seen] == [IdentifyRejected] * 3


@needs_real
async def test_refused_identify_is_raised_not_retried_real(runtime: Runtime) -> None:
    with RealNSQD() as first, RealNSQD() as second:
        await _identify_refused(runtime, [first.tcp_address])
        # Several nsqd: no failover with a configuration error (and no NoNSQDAvailable).
        await _identify_refused(runtime, [first.tcp_address, second.tcp_address])
        assert first.stats()["topics"] == [] and second.stats()["topics"] == []


async def test_refused_identify_is_raised_not_retried_embedded(runtime: Runtime) -> None:
    with running_nsqd() as (server, _):
        await _identify_refused(runtime, [server.tcp_address])


@needs_real
async def test_msg_timeout_above_nsqd_limit_is_refused_identify_real(runtime: Runtime) -> None:
    with RealNSQD(["--max-msg-timeout=5s"]) as nsqd:
        async with runtime.producer(nsqd.tcp_address, msg_timeout=10.0) as p:
            with pytest.raises(IdentifyRejected):
                await p.publish("t", b"x", timeout=10)


# --- failover ---------------------------------------------------------------------------------


@needs_real
async def test_failover_when_an_nsqd_dies_with_publishes_pending_real(runtime: Runtime) -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = unique()
        async with runtime.producer([first.tcp_address, second.tcp_address], timeout=10) as p:
            for _ in range(4):  # both connections up
                await p.publish(topic, b"warm")
            first.kill()
            outcomes = await p.concurrently(
                [("publish", (topic, b"%d" % i)) for i in range(200)], timeout=15
            )
            assert outcomes == [None] * 200
            assert p.stats().published == 204
        assert topic_count(second, topic) >= 200  # every one stored (maybe some twice)


async def test_failover_when_an_nsqd_stops_embedded(runtime: Runtime) -> None:
    """One by one, 20 publishes, then the first nsqd stops: the next 20 all go to the second
    one, none fails, and the producer's stats say which connection is down."""
    topic = unique()
    with running_nsqd() as (first, first_runner), running_nsqd() as (second, _):
        async with runtime.producer([first.tcp_address, second.tcp_address], timeout=5) as p:
            for i in range(20):
                await p.publish(topic, b"before %d" % i)
            await anyio.to_thread.run_sync(first_runner.stop)
            for i in range(20):
                await p.publish(topic, b"after %d" % i)
            stats = p.stats()
        assert (stats.published, stats.failed) == (40, 0)
        assert [c.connected for c in stats.connections] == [False, True]
        async with runtime.consumer(topic, "c", nsqd=[second.tcp_address], max_in_flight=50) as c:
            bodies: set[bytes] = set()
            while (msg := await c.get(timeout=0.5)) is not None:
                bodies.add(msg.body)
                await c.finish(msg)
    assert {b"after %d" % i for i in range(20)} <= bodies


# --- back-pressure -----------------------------------------------------------------------------


async def test_an_unreachable_nsqd_is_skipped_and_pending_stays_bounded(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """200 publishes at once with max_pending=2, the first nsqd unreachable: never more than 2
    await an answer, and all 200 reach the reachable nsqd, each once (200: enough to be seen
    pending from the test's loop while a blocking producer's threads work)."""
    topic = unique()
    dead = refused_address()
    peak = 0
    async with runtime.producer(
        [dead, nsqd.tcp_address], max_pending=2, connect_timeout=1, timeout=10
    ) as p:

        async def watch() -> None:
            nonlocal peak
            while True:  # sampled at every turn of the test's loop
                peak = max(peak, p.stats().pending)
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            calls = [("publish", (topic, b"%d" % i)) for i in range(200)]
            outcomes = await p.concurrently(calls, timeout=15)
            tg.cancel_scope.cancel()
        stats = p.stats()
    assert outcomes == [None] * 200
    assert 1 <= peak <= 2  # back-pressure: never more than max_pending awaiting an answer
    assert (stats.published, stats.pending) == (200, 0)
    async with runtime.consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=50) as c:
        got = await c.bodies(200, timeout=10)
        assert await c.get(timeout=0.2) is None  # each once
    assert sorted(got) == sorted(b"%d" % i for i in range(200))


@contextmanager
def _silent_broker() -> Iterator[str]:
    """A loopback address that accepts TCP connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in accepted:
            conn.close()


async def test_back_pressure_waits_instead_of_buffering_when_nsqd_never_answers(
    runtime: Runtime,
) -> None:
    """A broker that accepts TCP but never answers: a publish beyond max_pending waits for a
    slot and times out; nothing is buffered without bound. The pending ones fail once the
    handshake is given up (connect_timeout), not at their own later deadline; the next
    publish tries the handshake again."""
    with _silent_broker() as address:
        async with runtime.producer(address, max_pending=3, timeout=5.0, connect_timeout=1.0) as p:
            outcomes: list[BaseException | None] = []

            async def pending() -> None:
                calls = [("publish", ("t", b"x"))] * 3
                outcomes.extend(await p.concurrently(calls, timeout=10))

            async with anyio.create_task_group() as tg:
                started = time.monotonic()
                tg.start_soon(pending)
                await wait_until(lambda: p.stats().pending == 3, what="3 publishes pending")
                with pytest.raises(TimeoutError) as waited:
                    await p.publish("t", b"one too many", timeout=0.5)
                assert time.monotonic() - started >= 0.45
                if runtime.blocking:  # the call's deadline is the library's own there
                    assert "max_pending" in str(waited.value)
                assert p.stats().pending == 3  # the one too many was never queued
            assert len(outcomes) == 3
            for outcome in outcomes:
                assert isinstance(outcome, NoNSQDAvailable), outcome
                assert "handshake" in str(outcome)
            assert time.monotonic() - started < 3.0  # connect_timeout, not the 5 s timeout
            assert p.stats().pending == 0
            # a handshake that never completed made no connection: nothing was made again
            assert p.stats().reconnects == 0
            # the next publish tries the handshake again, and fails as fast
            started = time.monotonic()
            with pytest.raises(NoNSQDAvailable, match="handshake"):
                await p.publish("t", b"again")
            assert time.monotonic() - started < 3.0


# --- the publish observer ---------------------------------------------------------------------


async def test_publish_observer_sees_every_request_once(runtime: Runtime) -> None:
    topic = unique()
    seen, observe = recorder()
    with running_nsqd(max_msg_size=1024) as (server, _):
        async with runtime.producer(server.tcp_address, publish_observer=observe) as p:
            await p.publish(topic, b"one")
            await p.multi_publish(topic, [b"a", b"b", b"c"])
            await p.deferred_publish(topic, b"later", 0.5)
            with pytest.raises(BadMessage):
                await p.publish(topic, b"B" * 2000)
            outcomes = await p.concurrently([("publish", (topic, b"x"))] * 50, timeout=10)
            assert outcomes == [None] * 50
    assert [(t, n) for t, n, _, _ in seen[:4]] == [(topic, 1), (topic, 3), (topic, 1), (topic, 1)]
    assert [e for _, _, _, e in seen[:3]] == [None, None, None]
    assert isinstance(seen[3][3], BadMessage)
    assert len(seen) == 54 and all(e is None for _, _, _, e in seen[4:])
    assert all(0 <= s < 10 for _, _, s, _ in seen)
    # Settable later as an attribute; None switches it off.
    p.client.publish_observer = None


# --- one error class for "no nsqd took it", bounded topic memory --------------------------


@pytest.mark.parametrize("unreachable", [1, 2])
async def test_no_nsqd_available_is_one_class_on_every_runtime(
    runtime: Runtime, unreachable: int
) -> None:
    """No nsqd reachable (one or several): the publish raises NoNSQDAvailable, the same class
    on every runtime, naming each address it tried."""
    assert transports.sync.NoNSQDAvailable is transports.anyio.NoNSQDAvailable
    assert transports.trio.NoNSQDAvailable is NoNSQDAvailable
    addresses = [refused_address() for _ in range(unreachable)]
    async with runtime.producer(addresses, connect_timeout=0.5, timeout=3) as p:
        with pytest.raises(NoNSQDAvailable) as caught:
            await p.publish(unique(), b"x")
    for address in addresses:
        assert address in str(caught.value)


async def test_topic_names_remembered_stay_bounded(runtime: Runtime) -> None:
    with running_nsqd() as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            for i in range(TOPICS_REMEMBERED + 10):
                await p.publish(f"many_{i}", b"x")
            assert 0 < len(p.client._valid_topics) <= TOPICS_REMEMBERED
            # a name forgotten is checked again, and a bad one is still refused
            with pytest.raises(InvalidName):
                await p.publish("bad name", b"x")
            await p.publish("many_0", b"again")
            assert p.stats().published == TOPICS_REMEMBERED + 11


# --- PUBs coalesced into MPUBs: still one answer each ----------------------------------------


async def _coalesced_with_bad_bodies(
    runtime: Runtime, address: str, caplog: pytest.LogCaptureFixture, coalesce: bool
) -> str:
    """100 concurrent PUBs, every tenth too big for nsqd: only those fail, each stored once."""
    topic = unique()
    async with runtime.producer(address, coalesce=coalesce, timeout=20) as p:
        await p.publish(topic, b"warm")
        with caplog.at_level(logging.WARNING):
            outcomes = await p.concurrently(
                [
                    ("publish", (topic, b"B" * 2000 if i % 10 == 5 else b"%d" % i))
                    for i in range(100)
                ],
                timeout=20,
            )
        stats = p.stats()
    failed = {i for i, error in enumerate(outcomes) if error is not None}
    assert failed == set(range(5, 100, 10))
    assert all(isinstance(outcomes[i], BadMessage) for i in failed)
    assert (stats.published, stats.failed) == (91, 10)
    coalesced = [r for r in caplog.records if "coalesced MPUB" in r.getMessage()]
    assert bool(coalesced) == coalesce  # the MPUB path was taken (or not, when turned off)
    return topic


@pytest.mark.parametrize("coalesce", [True, False])
async def test_pubs_coalesced_with_a_bad_one_fail_only_it_embedded(
    runtime: Runtime, caplog: pytest.LogCaptureFixture, coalesce: bool
) -> None:
    with running_nsqd(max_msg_size=1024) as (server, runner):
        topic = await _coalesced_with_bad_bodies(runtime, server.tcp_address, caplog, coalesce)
        assert embedded_topic_count(runner, topic) == 91  # the refused MPUBs stored nothing


@needs_real
async def test_pubs_coalesced_with_a_bad_one_fail_only_it_real(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        topic = await _coalesced_with_bad_bodies(runtime, nsqd.tcp_address, caplog, True)
        # At least once: the real nsqd closes a connection it refused a publish on with our
        # later commands unread, so the kernel resets it; now and then (seen on trio, about
        # one run in three) the reset comes before nsqd's last answers and its error frame,
        # and the publishes they answered, stored, are sent again.
        assert topic_count(nsqd, topic) >= 91


async def test_concurrent_coalesced_pubs_are_each_stored_once(runtime: Runtime) -> None:
    """Many callers at once (their PUBs coalesced): every body is stored exactly once."""
    topic = unique()
    with running_nsqd() as (server, runner):
        async with runtime.producer(server.tcp_address) as p:
            await p.publish(topic, b"warm")
            calls = [("publish", (topic, b"%d:%d" % (i % 20, i // 20))) for i in range(2000)]
            outcomes = await p.concurrently(calls, timeout=30)
            assert outcomes == [None] * 2000
            assert p.stats().published == 2001
        assert embedded_topic_count(runner, topic) == 2001
        async with runtime.consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=500) as c:
            got = await c.bodies(2001, timeout=20)
    assert sorted(got) == sorted([b"warm"] + [body for _, (_, body) in calls])
    assert len(set(got)) == 2001


@pytest.fixture(scope="module")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pytest.importorskip("cryptography")
    from support.tls import make_test_ca

    return make_test_ca(tmp_path_factory.mktemp("ca")).as_dict()


@pytest.mark.parametrize("transport", ["snappy", "deflate", "tls"])
async def test_coalesced_pubs_over_compression_and_tls(
    runtime: Runtime, transport: str, tls_ca: dict[str, str]
) -> None:
    """The coalesced MPUB is written through the compressor or the TLS stream like any
    command; a refused one (a body too big) still fails only its own publish."""
    topic = unique()
    server_options: dict[str, object] = {"max_msg_size": 4096}
    client_options: dict[str, object] = {}
    if transport == "tls":
        server_options |= {"tls_cert": tls_ca["cert"], "tls_key": tls_ca["key"]}
        client_options["tls_ca_file"] = tls_ca["ca"]
    else:
        client_options[transport] = True
    with running_nsqd(**server_options) as (server, runner):
        async with runtime.producer(server.tcp_address, timeout=20, **client_options) as p:
            await p.publish(topic, b"warm")
            bodies = [b"B" * 5000 if i == 150 else b"%d" % i * 20 for i in range(300)]
            outcomes = await p.concurrently([("publish", (topic, b)) for b in bodies], timeout=20)
        assert [i for i, error in enumerate(outcomes) if error is not None] == [150]
        assert isinstance(outcomes[150], BadMessage)
        assert embedded_topic_count(runner, topic) == 300


# --- a connection reset by nsqd ---------------------------------------------------------------


def _received(conn: socket.socket) -> bytes:
    """What ``conn`` had to read; ConnectionResetError once the peer closed (a recv that
    returned b"" again and again kept the fake nsqd's thread spinning after the test)."""
    data = conn.recv(4096)
    if not data:
        raise ConnectionResetError("the client closed the connection")
    return data


class _ResettingNSQD:
    """A fake nsqd on loopback: answers IDENTIFY with OK, then resets the connection (RST,
    not FIN) as soon as the first command after it arrives, as a real nsqd does when it
    closes with pipelined commands unread."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.1)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.resets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    data = b""
                    while b"IDENTIFY\n" not in data or len(data) < data.index(b"IDENTIFY\n") + 13:
                        data += _received(conn)
                    at = data.index(b"IDENTIFY\n") + 9
                    size = int.from_bytes(data[at : at + 4], "big")
                    while len(data) < at + 4 + size:
                        data += _received(conn)
                    conn.sendall(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
                    rest = data[at + 4 + size :]
                    while not rest:
                        rest = _received(conn)
                except OSError:  # the client left (or a timeout): the next connection
                    continue
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.resets += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


async def test_a_connection_reset_fails_the_publish_not_the_producer(runtime: Runtime) -> None:
    server = _ResettingNSQD()
    try:
        async with runtime.producer(server.address, timeout=5, connect_timeout=2) as p:
            for _ in range(2):  # and the producer is still there for the next publish
                with pytest.raises(NoNSQDAvailable, match=r"reset|closed|lost"):
                    await p.publish(unique(), b"x")
            outcomes = await p.concurrently(
                [("publish", (unique(), b"%d" % i)) for i in range(20)], timeout=20
            )
            assert all(isinstance(o, NoNSQDAvailable) for o in outcomes)
        assert server.resets >= 2
    finally:
        server.close()


# --- deadlines: each publish its own, waiting for a slot counts against it -------------------


@needs_real
async def test_each_publish_has_its_own_deadline_real(runtime: Runtime) -> None:
    """Two publishes to a stopped nsqd, started 0.45 s apart: each times out at its own
    deadline, frees its slot, and the late answers (after SIGCONT) are matched to them and
    dropped, so the next publish gets its own."""
    with RealNSQD() as nsqd:
        topic = unique()
        async with runtime.producer(nsqd.tcp_address, timeout=0.6) as p:
            await p.publish(topic, b"warm")
            raised: dict[str, float] = {}

            async def publish(name: str, delay: float) -> None:
                await anyio.sleep(delay)
                with pytest.raises(TimeoutError):
                    await runtime.call(p.client.publish, topic, name.encode())
                raised[name] = time.monotonic()

            with paused(nsqd):
                started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(publish, "early", 0.0)
                    tg.start_soon(publish, "late", 0.45)
                    await wait_until(lambda: "early" in raised, what="the early timeout")
                    assert "late" not in raised  # its own, later deadline
                assert raised["early"] - started < 1.0
                assert raised["late"] - raised["early"] > 0.2
                assert p.stats().pending == 0  # a timed-out publish frees its slot
            await p.publish(topic, b"after", timeout=5)
        assert topic_count(nsqd, topic) == 4


@needs_real
async def test_waiting_for_a_slot_counts_against_the_deadline_real(runtime: Runtime) -> None:
    seen, observe = recorder()
    with RealNSQD() as nsqd:
        async with runtime.producer(
            nsqd.tcp_address, max_pending=1, timeout=0.5, publish_observer=observe
        ) as p:
            await p.publish("t", b"warm")
            with paused(nsqd):
                started = time.monotonic()
                # the first takes the only slot, never answered; the second waits for the
                # slot within the same deadline
                outcomes = await p.concurrently(
                    [("publish", ("t", b"x")), ("publish", ("t", b"y"))], timeout=5
                )
                assert time.monotonic() - started < 2.0
    assert [type(e) for e in outcomes] == [TimeoutError, TimeoutError]
    assert sorted(type(e).__name__ for _, _, _, e in seen) == [
        "NoneType",
        "TimeoutError",
        "TimeoutError",
    ]

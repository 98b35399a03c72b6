"""The blocking Producer's callers doing their own IO (leader/followers), against the real nsqd
and the embedded broker.

On plain TCP a thread waiting for an answer reads the socket itself while no other thread does
and hands the read role to the next waiting caller; the IO thread reads only when no caller
does. What must still hold: heartbeats are answered on an idle producer (the IO thread takes
the socket back), every answer reaches its own caller under many threads (refusals included),
each caller's deadline holds whoever reads, a leader's expiry hands the role over, answers
nobody waits for still complete their futures, failover works with a caller reading, and
snappy/deflate connections (the core's codec) work with callers reading. Real-nsqd tests skip
without the binaries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from support.brokers import needs_real, paused, topic_count

from nsq_sansio.errors import BadMessage
from transports.sync import Consumer, Producer
from transports.sync import producer as producer_module
from transports.testing.real_nsq import RealNSQD

from ._helpers import running_nsqd, unique, wait_for


def wire_of(p: Producer, index: int = 0) -> Any:
    """The callers' direct access to node ``index``'s connection (None: IO thread only)."""
    return p._nodes[index].wire


def callers_read(p: Producer, index: int = 0) -> bool:
    """True while callers, not the IO thread, read node ``index``'s connection."""
    wire = wire_of(p, index)
    return wire is not None and bool(wire.direct)


def leader_of(p: Producer, index: int = 0) -> Any:
    wire = wire_of(p, index)
    return None if wire is None else wire.leader


def enter_direct(p: Producer, topic: str) -> int:
    """Publish one by one until callers read the socket: the first answer is read by the IO
    thread, which then hands the socket over to the callers. On a loaded machine the IO thread
    may take an idle socket back (after ``_DIRECT_IDLE``) before the check sees the hand-over,
    so this publishes again, up to 50 times. Returns how many it published."""
    for count in range(1, 51):
        p.publish(topic, b"warm")
        if count >= 3 and callers_read(p):
            return count
    raise AssertionError("callers never read the socket after 50 publishes one by one")


@pytest.fixture
def callers_keep_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The IO thread takes an idle socket back after 5 s instead of 20 ms, so a test can
    start its threads while callers still read it, however loaded the machine."""
    monkeypatch.setattr(producer_module, "_DIRECT_IDLE", 5.0)


class LeadCounter:
    """Counts how often a caller took the read role (wraps Producer._lead)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = producer_module.Producer._lead
        lock = threading.Lock()

        def counting(self_: Producer, *args: Any) -> None:
            with lock:
                self.count += 1
            original(self_, *args)

        monkeypatch.setattr(producer_module.Producer, "_lead", counting)


# --- heartbeats on an idle producer ---------------------------------------------------------


def _heartbeats_while_idle(address: str) -> None:
    topic = unique()
    with Producer(address, heartbeat_interval=1.0) as p:
        enter_direct(p, topic)
        received = p.stats().connections[0].bytes_received
        # Idle for more than 2.5 heartbeat intervals: unanswered, nsqd (and the core's own
        # check) would close the connection. The IO thread must take the socket back.
        time.sleep(3.2)
        assert not callers_read(p)
        stats = p.stats()
        assert stats.reconnects == 0
        assert stats.connections[0].connected
        assert stats.connections[0].bytes_received > received  # heartbeats were read
        p.publish(topic, b"after", timeout=5)
        assert p.stats().reconnects == 0


@needs_real
def test_heartbeats_are_answered_when_callers_stop_reading_real() -> None:
    with RealNSQD() as nsqd:
        _heartbeats_while_idle(nsqd.tcp_address)


def test_heartbeats_are_answered_when_callers_stop_reading_embedded() -> None:
    with running_nsqd() as (server, _):
        _heartbeats_while_idle(server.tcp_address)


# --- many threads: every answer to its own caller -------------------------------------------


def _many_threads(address: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, str]:
    """24 threads publish 150 each; 48 of those calls (two per thread, at places spread over
    the run) are bodies over nsqd's 1 KiB limit, each of its own size. Each refusal must reach
    its own caller, and only it: nsqd's text names the refused size, so each caller checks the
    BadMessage it got is the one for its body. Every refusal closes the connection (nsqd's
    E_BAD_MESSAGE is fatal), so what was pipelined behind it is sent again, many times over."""
    topic = unique()
    leads = LeadCounter(monkeypatch)
    threads_count, per_thread = 24, 150
    # two per thread, at i = 7t mod 75 and 75 later: first, middle and late calls alike
    bad_sizes = {
        (t, i): 1025 + k
        for k, (t, i) in enumerate(
            (t, i) for t in range(threads_count) for i in range(per_thread) if (i - 7 * t) % 75 == 0
        )
    }
    assert len(bad_sizes) == 2 * threads_count
    assert len({i for _, i in bad_sizes}) > 20  # spread over the run, not all first calls
    outcomes: dict[tuple[int, int], BaseException | None] = {}
    lock = threading.Lock()
    with Producer(address, timeout=20) as p:
        enter_direct(p, topic)
        go = threading.Event()

        def caller(t: int) -> None:
            go.wait()
            for i in range(per_thread):
                size = bad_sizes.get((t, i))
                body = b"B" * size if size is not None else b"%d:%d" % (t, i)
                try:
                    p.publish(topic, body)
                    outcome: BaseException | None = None
                except Exception as exc:
                    outcome = exc
                with lock:
                    outcomes[(t, i)] = outcome

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(threads_count)]
        for thread in threads:
            thread.start()
        go.set()
        for thread in threads:
            thread.join(60)
        stats = p.stats()
    assert len(outcomes) == threads_count * per_thread
    failed = {key: outcome for key, outcome in outcomes.items() if outcome is not None}
    # each refusal went to its own caller, and nothing else failed
    assert set(failed) == set(bad_sizes), sorted(set(failed) ^ set(bad_sizes))[:10]
    for key, size in bad_sizes.items():
        error = failed[key]
        assert type(error) is BadMessage, (key, error)
        assert str(error) == f"E_BAD_MESSAGE PUB message too big {size} > 1024", (key, error)
    good = threads_count * per_thread - len(bad_sizes)
    assert stats.published == good + 3
    assert leads.count > 50  # callers, not the IO thread, read most answers
    return good + 3, p.retried, topic


@needs_real
def test_answers_reach_their_callers_under_many_threads_real(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with RealNSQD(["--max-msg-size=1024"]) as nsqd:
        good, retried, topic = _many_threads(nsqd.tcp_address, monkeypatch)
        # None lost. Stored twice only if sent twice: nsqd closes with our pipelined bytes
        # unread (RST), and its kernel may then drop its last answers (OKs and the error),
        # so publishes it stored are retried (at-least-once, as documented).
        assert good <= topic_count(nsqd, topic) <= good + retried


def test_answers_reach_their_callers_under_many_threads_embedded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with running_nsqd(max_msg_size=1024) as (server, _):
        _many_threads(server.tcp_address, monkeypatch)


# --- deadlines, whoever reads ---------------------------------------------------------------


def recording_publisher(
    p: Producer, topic: str, results: dict[str, BaseException | None]
) -> Callable[[str, float], None]:
    """publish(name, timeout): PUB ``name`` and record None or the error under ``name``."""

    def publish(name: str, timeout: float) -> None:
        try:
            p.publish(topic, name.encode(), timeout=timeout)
            results[name] = None
        except Exception as exc:
            results[name] = exc

    return publish


@needs_real
@pytest.mark.usefixtures("callers_keep_reading")
def test_a_waiting_callers_deadline_while_another_thread_reads_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        with Producer(nsqd.tcp_address, timeout=30) as p:
            warm = enter_direct(p, topic)
            results: dict[str, BaseException | None] = {}
            publish = recording_publisher(p, topic, results)

            with paused(nsqd):
                reader = threading.Thread(target=publish, args=("reader", 10.0))
                reader.start()
                wait_for(lambda: leader_of(p) is not None, what="a caller reading")
                started = time.monotonic()
                publish("waiter", 0.5)  # parks: the other thread holds the read role
                took = time.monotonic() - started
                assert isinstance(results["waiter"], TimeoutError)
                assert 0.4 < took < 1.5  # its own deadline, not the reader's
                assert reader.is_alive() and "reader" not in results
            reader.join(10)
            assert results["reader"] is None
            assert p.stats().pending == 0
            p.publish(topic, b"after", timeout=5)  # the late answer went to "waiter", not here
        assert topic_count(nsqd, topic) == warm + 3


@needs_real
@pytest.mark.usefixtures("callers_keep_reading")
def test_a_reading_callers_deadline_hands_the_read_role_over_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        with Producer(nsqd.tcp_address, timeout=30) as p:
            warm = enter_direct(p, topic)
            results: dict[str, BaseException | None] = {}
            publish = recording_publisher(p, topic, results)

            with paused(nsqd):
                reader = threading.Thread(target=publish, args=("reader", 0.5))
                reader.start()
                wait_for(lambda: leader_of(p) is not None, what="a caller reading")
                first = leader_of(p)
                waiter = threading.Thread(target=publish, args=("waiter", 10.0))
                waiter.start()
                reader.join(5)
                assert isinstance(results["reader"], TimeoutError)
                # The thread that gave up handed the read role to the one still waiting.
                wait_for(
                    lambda: leader_of(p) not in (None, first),
                    timeout=1.0,  # at once, not at the IO thread's next look (5 s here)
                    what="the role handed over",
                )
                assert "waiter" not in results
            waiter.join(10)
            assert results["waiter"] is None
        assert topic_count(nsqd, topic) == warm + 2


# --- answers nobody waits for ---------------------------------------------------------------


def _unwaited(address: str) -> None:
    topic = unique()
    with Producer(address) as p:
        warm = enter_direct(p, topic)
        called: list[int] = []
        futures = [p.publish_async(topic, b"%d" % i) for i in range(200)]
        futures[-1].add_done_callback(lambda f: called.append(1))
        # Nobody calls result(): the answers must still be read and the futures completed.
        wait_for(lambda: all(f.done() for f in futures), timeout=5, what="every future done")
        assert all(f.exception() is None for f in futures)
        wait_for(lambda: called == [1], timeout=5, what="the callback")
        more = [p.publish_async(topic, b"x") for _ in range(50)]
        p.flush(5)
        assert all(f.done() for f in more)
        assert p.stats().published == warm + 250


@needs_real
def test_answers_nobody_waits_for_complete_their_futures_real() -> None:
    with RealNSQD() as nsqd:
        _unwaited(nsqd.tcp_address)


def test_answers_nobody_waits_for_complete_their_futures_embedded() -> None:
    with running_nsqd() as (server, _):
        _unwaited(server.tcp_address)


# --- failover with a caller reading ---------------------------------------------------------


@needs_real
@pytest.mark.usefixtures("callers_keep_reading")
def test_failover_while_a_caller_reads_the_dead_connection_real() -> None:
    with RealNSQD() as first, RealNSQD() as second:
        topic = unique()
        with Producer([first.tcp_address, second.tcp_address], timeout=15) as p:
            for _ in range(20):  # round robin, until callers read both connections
                p.publish(topic, b"warm")
                if callers_read(p, 0) and callers_read(p, 1):
                    break
            assert callers_read(p, 0) and callers_read(p, 1)
            before = topic_count(second, topic)
            results: list[BaseException | None] = []
            lock = threading.Lock()

            def publish() -> None:
                try:
                    p.publish(topic, b"x")
                    outcome: BaseException | None = None
                except Exception as exc:
                    outcome = exc
                with lock:
                    results.append(outcome)

            with paused(first):
                threads = [threading.Thread(target=publish) for _ in range(8)]
                for thread in threads:
                    thread.start()
                wait_for(lambda: leader_of(p, 0) is not None, what="a caller reading nsqd 1")
                started = time.monotonic()
                first.kill()  # its sockets reset while a caller polls one of them
            for thread in threads:
                thread.join(20)
            assert results == [None] * 8
            assert time.monotonic() - started < 10
        assert topic_count(second, topic) == before + 8  # the stuck ones went there too


# --- compression: the core's codec runs on whichever thread reads or writes ------------------


def _compressed(address: str, compression: str, monkeypatch: pytest.MonkeyPatch) -> None:
    topic = unique()
    leads = LeadCounter(monkeypatch)
    body = b"compressible " * 50
    expected = [body + b"one %d" % i for i in range(50)]
    expected += [body + b"t%d %d" % (t, i) for t in range(8) for i in range(50)]
    with Producer(address, **{compression: True}) as p:
        expected += [b"warm"] * enter_direct(p, topic)
        for i in range(50):
            p.publish(topic, body + b"one %d" % i)

        def caller(t: int) -> None:
            for i in range(50):
                p.publish(topic, body + b"t%d %d" % (t, i))

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert p.stats().published == len(expected)
        assert leads.count >= 50  # the callers read (and decompressed) the answers
    got: list[bytes] = []
    with Consumer(topic, "c", nsqd=[address], max_in_flight=100, **{compression: True}) as c:
        for msg in c:
            got.append(msg.body)
            msg.finish()
            if len(got) == len(expected):
                break
    assert sorted(got) == sorted(expected)


@needs_real
@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compressed_connections_read_by_callers_real(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with RealNSQD() as nsqd:
        _compressed(nsqd.tcp_address, compression, monkeypatch)


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
def test_compressed_connections_read_by_callers_embedded(
    compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_nsqd() as (server, _):
        _compressed(server.tcp_address, compression, monkeypatch)

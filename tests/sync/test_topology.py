"""Discovery through lookupd, brokers that die and come back, producer failover, back-pressure,
drain on signals."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, NoNSQDAvailable, Producer, drain_on_signals

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def test_producer_fails_over_to_another_nsqd() -> None:
    topic = unique()
    with running_nsqd() as (first, first_runner), running_nsqd() as (second, _):
        with Producer([first.tcp_address, second.tcp_address], timeout=5.0) as producer:
            for i in range(20):
                producer.publish(topic, b"before %d" % i)
            first_runner.stop()
            for i in range(20):
                producer.publish(topic, b"after %d" % i)  # all go to the second nsqd
            stats = producer.stats()
        assert stats.published == 40 and stats.failed == 0
        assert [c.connected for c in stats.connections] == [False, True]
        with Consumer(topic, "c", nsqd=[second.tcp_address], max_in_flight=50) as consumer:
            bodies = set()
            while True:
                msg = consumer.get(timeout=0.5)
                if msg is None:
                    break
                bodies.add(msg.body)
                msg.finish()
    assert {b"after %d" % i for i in range(20)} <= bodies


def test_producer_back_pressure_blocks_instead_of_buffering() -> None:
    """A broker that accepts TCP but never answers: publishes beyond max_pending block and
    time out; nothing is buffered without bound. The pending ones fail once the handshake is
    given up (connect_timeout), not at their own later deadline."""
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
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        with Producer(address, max_pending=3, timeout=0.5, connect_timeout=1.0) as producer:
            futures = [producer.publish_async("t", b"x", timeout=5.0) for _ in range(3)]
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="max_pending"):
                producer.publish_async("t", b"one too many", timeout=0.5)
            assert time.monotonic() - started >= 0.45
            assert producer.stats().pending == 3
            for future in futures:
                with pytest.raises(NoNSQDAvailable, match="handshake"):
                    future.result(5)
            assert time.monotonic() - started < 3.0  # connect_timeout, not the 5 s timeout
            assert producer.stats().pending == 0
            # the silent handshake is abandoned after connect_timeout and retried
            wait_for(lambda: producer.stats().reconnects >= 1, what="handshake retried")
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in accepted:
            conn.close()


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="needs POSIX signals")
def test_sigterm_drains_the_consumer() -> None:
    topic = unique()
    with running_nsqd() as (server, _):
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(topic, [b"%d" % i for i in range(10)])
        previous = signal.getsignal(signal.SIGTERM)
        seen = 0
        with (
            Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=10) as consumer,
            drain_on_signals(consumer),
        ):
            for msg in consumer:  # ends when the drain is over
                seen += 1
                if seen == 3:
                    os.kill(os.getpid(), signal.SIGTERM)
                    # the IO thread takes back what we have not seen yet (may take a while
                    # on a loaded machine: wait for it rather than sleep a fixed time)
                    wait_for(lambda: consumer.stats().requeued >= 7, what="7 requeued")
                msg.finish()
            assert consumer.draining
            stats = consumer.stats()
        assert signal.getsignal(signal.SIGTERM) is previous
    assert seen == 3
    assert stats.finished == 3 and stats.requeued == 7


def test_an_exception_in_the_block_requeues_and_cleans_up(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.multi_publish(topic, [b"%d" % i for i in range(5)])
    with pytest.raises(ZeroDivisionError):  # noqa: SIM117
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
            for _msg in consumer:
                1 / 0  # noqa: B018
    wait_for(
        lambda: (channel_stats(runner, topic, "c") or {}).get("in_flight_count") == 0,
        what="requeued",
    )
    stats = channel_stats(runner, topic, "c")
    assert stats is not None and stats["depth"] == 5

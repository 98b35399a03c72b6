"""Discovery through lookupd, brokers that die and come back, producer failover, back-pressure,
drain on signals."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

import pytest

from nsq_sansio.consumer import ConnectionUp
from transports.embedded import EmbeddedLookupd, EmbeddedNSQD, ServerThread
from transports.sync import Consumer, NoNSQDAvailable, Producer, drain_on_signals

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def test_broker_killed_and_restarted_consumer_reconnects_and_continues() -> None:
    topic = unique()
    with running_nsqd() as (server, _):
        address = server.tcp_address
    consumer = Consumer(
        topic, "c", nsqd=[address], max_in_flight=5, reconnect_delay=0.05, max_reconnect_delay=0.2
    )
    with consumer:
        for round_ in range(2):
            runner = ServerThread(EmbeddedNSQD(tcp_address=address))
            runner.start()
            try:
                with Producer(address) as producer:
                    producer.multi_publish(topic, [b"%d-%d" % (round_, i) for i in range(10)])
                got: list[bytes] = []
                while len(got) < 10:
                    msg = consumer.get(timeout=10)
                    assert msg is not None, f"round {round_}: got {got}"
                    got.append(msg.body)
                    msg.finish()
                assert sorted(got) == sorted(b"%d-%d" % (round_, i) for i in range(10))
                done = 10 * (round_ + 1)
                wait_for(
                    lambda done=done: consumer.stats().finished == done,  # type: ignore[misc]
                    what="FINs handled",
                )
                time.sleep(0.05)  # let the last FINs reach the broker before killing it
            finally:
                runner.stop()  # kill the broker under the consumer
            wait_for(lambda: consumer.stats().connected == 0, what="disconnect noticed")
        stats = consumer.stats()
    assert stats.finished == 20
    assert stats.reconnects >= 1


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


def test_lookupd_mode_reconnects_only_to_a_rediscovered_nsqd() -> None:
    topic = unique()
    with ServerThread(EmbeddedLookupd()) as lookupd:
        options: dict[str, Any] = {
            "lookupd_tcp_addresses": [lookupd.tcp_address],
            "lookupd_ping_interval": 0.2,
        }
        first = ServerThread(EmbeddedNSQD(**options))
        address = first.start().tcp_address
        events: list[object] = []
        with Consumer(
            topic,
            "c",
            lookupd=[lookupd.http_url],
            lookupd_poll_interval=0.3,
            lookupd_poll_jitter=0.0,
            on_event=events.append,
        ) as consumer:
            with Producer(address) as producer:
                producer.publish(topic, b"one")
            msg = consumer.get(timeout=10)
            assert msg is not None and msg.body == b"one"
            msg.finish()
            first.stop()
            wait_for(lambda: consumer.stats().connected == 0, what="disconnect noticed")
            time.sleep(1.0)  # several polls: the dead nsqd is not retried on its own
            connects = sum(1 for e in events if isinstance(e, ConnectionUp))
            assert connects == 1
            second = ServerThread(EmbeddedNSQD(tcp_address=address, **options))
            second.start()
            try:
                with Producer(address) as producer:
                    producer.publish(topic, b"two")  # creates the topic: registered again
                msg = consumer.get(timeout=10)
                assert msg is not None and msg.body == b"two"
                msg.finish()
            finally:
                second.stop()
        assert sum(1 for e in events if isinstance(e, ConnectionUp)) == 2


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

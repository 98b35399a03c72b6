"""drain_on_signals and Ctrl-C on the blocking runtime: the first signal drains, one more
during the drain stops at once. A thread cannot be cancelled, so the message of a handler
still running is requeued at once and the handler is reported; the main thread is interrupted
where it is and the code after the block runs. Ctrl-C in run() without drain_on_signals drains
within the drain's timeout, then raises KeyboardInterrupt (on the previous tree run() waited
for every handler, and a second signal was ignored)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable

import pytest
from support.brokers import wait_for

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, Message, Producer, drain_on_signals

from ._helpers import channel_stats, unique

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def one_message(server: EmbeddedNSQD) -> str:
    topic = unique()
    with Producer(server.tcp_address) as producer:
        producer.publish(topic, b"job")
    return topic


def to_main_thread(signum: int) -> None:
    """Send ``signum`` to the main thread, where Python runs signal handlers: a signal sent to
    the process may be taken by another thread, and the main thread, blocked in a sleep or a
    wait, would see it only when that ends."""
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signum)


def requeued_at_once(runner: ServerThread[EmbeddedNSQD], topic: str) -> None:
    ch = wait_for(
        lambda: (
            (found := channel_stats(runner, topic, "c")) is not None
            and found["depth"] == 1
            and found["in_flight_count"] == 0
            and found
        ),
        what="the message back on nsqd",
    )
    assert ch["deferred_count"] == 0 and ch["timeout_count"] == 0


def kick_twice(consumer: Consumer, started: threading.Event, signum: int) -> list[float]:
    """From another thread, once ``started``: a signal, and one more once the drain began;
    returns a list that gets the time of the second."""
    sent: list[float] = []

    def kick() -> None:
        started.wait(10)
        to_main_thread(signum)
        wait_for(lambda: consumer.draining, what="the drain")
        sent.append(time.monotonic())
        to_main_thread(signum)

    threading.Thread(target=kick, name="test-kicker", daemon=True).start()
    return sent


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_ends_run_and_the_block_at_once(
    nsqd: Pair, signum: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    server, runner = nsqd
    topic = one_message(server)
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    held: list[Message] = []

    def handler(message: Message) -> None:
        held.append(message)
        started.set()
        release.wait(30)  # a long job (a thread cannot be cancelled)
        ended.set()

    with Consumer(topic, "c", nsqd=[server.tcp_address]) as consumer:
        with drain_on_signals(consumer):
            sent = kick_twice(consumer, started, signum)
            consumer.run(handler)
            raise AssertionError("run() returned before the second signal")
        stopped = time.monotonic() - sent[0]
        requeued_at_once(runner, topic)
        assert not ended.is_set()  # still running in its thread...
        release.set()
        assert ended.wait(10)
    assert stopped < 2.0
    (message,) = held
    assert message.answered and message.taken_back  # the drain answered it, not the handler
    assert consumer.stats().finished == 0 and consumer.stats().requeued == 1
    name = signal.Signals(signum).name
    texts = [r.getMessage() for r in caplog.records]
    assert f"{name} received again: stopping at once (unanswered messages are requeued)" in texts
    (line,) = [t for t in texts if t.startswith("drain: 1 message unanswered")]
    assert f"{message.id.decode()} (its run() handler still running on nsq-sync-worker-0)" in line
    assert "a thread cannot be cancelled" in line
    assert not [t for t in texts if "came too late" in t]


def test_one_signal_drains_within_drain_timeout(
    nsqd: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    """One SIGTERM, drain_timeout=0.5 and a 30 s job: run() and the block end at the drain's
    deadline (the handler's thread runs on, reported), the message is requeued at once and the
    handler's late return answers nothing (on the previous tree run() waited for the job)."""
    caplog.set_level(logging.INFO, logger="nsq_sansio")
    server, runner = nsqd
    topic = one_message(server)
    started, release, ended = threading.Event(), threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        started.set()
        release.wait(30)
        ended.set()

    def kick() -> None:
        started.wait(10)
        sent.append(time.monotonic())
        to_main_thread(signal.SIGTERM)

    sent: list[float] = []
    with Consumer(topic, "c", nsqd=[server.tcp_address], drain_timeout=0.5) as consumer:
        with drain_on_signals(consumer):
            threading.Thread(target=kick, name="test-kicker", daemon=True).start()
            consumer.run(handler)
        returned = time.monotonic() - sent[0]
        requeued_at_once(runner, topic)
        assert not ended.is_set()
        release.set()
        assert ended.wait(10)
    assert 0.4 < returned < 3.0  # the drain's 0.5 s, not the job's 30 s
    assert consumer.stats().finished == 0 and consumer.stats().requeued == 1
    texts = [r.getMessage() for r in caplog.records]
    assert (
        "SIGTERM received: draining the consumer (up to 0.5 s; SIGTERM again stops at once)"
        in texts
    ), texts
    assert [t for t in texts if "its run() handler still running on nsq-sync-worker-0" in t]
    assert not [t for t in texts if "came too late" in t]


def test_a_second_signal_interrupts_a_long_job_in_the_loop(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = one_message(server)
    started = threading.Event()
    with Consumer(topic, "c", nsqd=[server.tcp_address]) as consumer:
        with drain_on_signals(consumer):
            sent = kick_twice(consumer, started, signal.SIGTERM)
            for message in consumer:
                assert message.body == b"job"
                started.set()
                # The job, in the main thread: interrupted. Made of short steps, as real work
                # is: a signal landing just before a sleep starts is only seen when it ends.
                for _ in range(300):
                    time.sleep(0.1)
                raise AssertionError("the job was not interrupted")
        stopped = time.monotonic() - sent[0]
        requeued_at_once(runner, topic)
        assert not message.answered
        wait_for(lambda: message.taken_back, what="the message taken back")
    assert stopped < 2.0


def test_the_previous_handlers_come_back(nsqd: Pair) -> None:
    server, _ = nsqd
    calls: list[int] = []

    def previous(signum: int, frame: object) -> None:
        calls.append(signum)

    old = signal.signal(signal.SIGUSR1, previous)
    try:
        with Consumer(unique(), "c", nsqd=[server.tcp_address]) as consumer:
            with drain_on_signals(consumer, signal.SIGUSR1):
                to_main_thread(signal.SIGUSR1)  # drains
                wait_for(lambda: consumer.draining, what="the drain")
                to_main_thread(signal.SIGUSR1)  # stops: the block ends here
                time.sleep(30)
                raise AssertionError("not interrupted")
            assert signal.getsignal(signal.SIGUSR1) is previous
            to_main_thread(signal.SIGUSR1)  # the third: the previous handler's
            wait_for(lambda: calls == [signal.SIGUSR1], what="the previous handler")
    finally:
        signal.signal(signal.SIGUSR1, old)


def run_with_ctrl_c(
    server: EmbeddedNSQD, topic: str, drain_timeout: float, kick: Callable[[Consumer], None]
) -> tuple[float, threading.Event]:
    """run() with a long handler; ``kick`` sends the Ctrl-Cs from a thread. Returns when run()
    raised KeyboardInterrupt, and the handler's release (set it once the test has checked what
    happened to the message: released sooner, the handler would race the drain's requeue)."""
    started, release = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        started.set()
        release.wait(30)

    with Consumer(topic, "c", nsqd=[server.tcp_address], drain_timeout=drain_timeout) as c:

        def kicker() -> None:
            started.wait(10)
            kick(c)

        threading.Thread(target=kicker, name="test-kicker", daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            try:
                c.run(handler)
            finally:
                first = time.monotonic()
    return first, release


def test_ctrl_c_in_run_drains_within_its_timeout_then_raises(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = one_message(server)
    sent: list[float] = []

    def once(consumer: Consumer) -> None:
        sent.append(time.monotonic())
        to_main_thread(signal.SIGINT)

    raised, release = run_with_ctrl_c(server, topic, 0.5, once)
    assert 0.4 < raised - sent[0] < 3.0  # the drain's 0.5 s, not the job's 30 s
    requeued_at_once(runner, topic)
    release.set()


def test_ctrl_c_twice_in_run_stops_at_once(nsqd: Pair) -> None:
    server, runner = nsqd
    topic = one_message(server)
    sent: list[float] = []

    def twice(consumer: Consumer) -> None:
        to_main_thread(signal.SIGINT)
        wait_for(lambda: consumer.draining, what="the drain")
        sent.append(time.monotonic())
        to_main_thread(signal.SIGINT)

    raised, release = run_with_ctrl_c(server, topic, 30.0, twice)
    assert raised - sent[0] < 2.0  # not the drain's 30 s
    requeued_at_once(runner, topic)
    release.set()

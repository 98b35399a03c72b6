"""The blocking consumer's drain on SIGTERM, and an exception raised in its block (producer
failover and back-pressure are in tests/clients/test_producer_guarantees.py)."""

from __future__ import annotations

import os
import signal

import pytest

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, Producer, drain_on_signals

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


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

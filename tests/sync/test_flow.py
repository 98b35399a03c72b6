"""Flow control, message policy and long jobs, checked on the broker's side where it matters."""

from __future__ import annotations

import contextlib
import time

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Consumer, Producer

from ._helpers import channel_stats, running_nsqd, unique, wait_for

Pair = tuple[EmbeddedNSQD, ServerThread[EmbeddedNSQD]]


def test_without_keepalive_nothing_is_touched_and_the_message_times_out() -> None:
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, _):
        with Producer(server.tcp_address) as producer:
            producer.publish(topic, b"long job")
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as consumer:
            msg = consumer.get(timeout=5)
            assert msg is not None
            again = consumer.get(timeout=5)  # nsqd took it back after 1 s and sent it again
            assert again is not None and again.id == msg.id and again.attempts == 2
            again.finish()
            msg.finish()  # late: reported, not raised
            wait_for(lambda: consumer.stats().taken_back >= 1, what="taken back")
            assert msg.taken_back


def test_pull_batch_held_under_keepalive_then_finished_after_commit() -> None:
    """The Spark source's pattern: fetch a batch, keep it alive while committing (longer than
    msg_timeout), FIN after the commit: nothing times out, nothing is delivered twice."""
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, runner):
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(topic, [b"%d" % i for i in range(30)])
        with Consumer(
            topic, "spark", nsqd=[server.tcp_address], pull=True, max_in_flight=100
        ) as consumer:
            batch = consumer.fetch(20, timeout=5.0)
            assert len(batch) == 20
            with contextlib.ExitStack() as stack:
                for m in batch:
                    stack.enter_context(m.keepalive())
                time.sleep(2.5)  # "commit"
            for m in batch:
                assert not m.taken_back
                m.finish()
            rest = consumer.fetch(10, timeout=5.0)  # filled at once: no wait past msg_timeout
            assert len(rest) == 10 and all(m.attempts == 1 for m in rest)
            for m in rest:
                m.finish()
        # the last FINs are applied by the broker a little after close() returns
        wait_for(
            lambda: (channel_stats(runner, topic, "spark") or {}).get("in_flight_count") == 0,
            what="every FIN applied",
        )
        channel = channel_stats(runner, topic, "spark")
    assert channel is not None and channel["timeout_count"] == 0
    assert channel["depth"] == 0 and channel["in_flight_count"] == 0

"""``Consumer.finish_many`` on the blocking runtime's IO thread: a connection failure the IO
thread handles marks the batch taken back. What every runtime does is in
tests/clients/test_finish_many.py."""

from __future__ import annotations

from transports.sync import Consumer, Message, Producer

from ._helpers import running_nsqd, unique, wait_for


def _fetch(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        batch = consumer.fetch(count - len(got), timeout=5.0)
        assert batch, f"fetched {len(got)} of {count}"
        got += batch
    return got


def test_finish_many_after_the_connection_closed_marks_them_taken_back() -> None:
    """Messages whose connection is gone: taken back (nsqd delivers them again), not sent."""
    with running_nsqd() as (server, runner):
        topic = unique()
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(topic, [b"x", b"y"])
        with Consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=2, pull=True
        ) as consumer:
            held = _fetch(consumer, 2)
            runner.call(lambda: server.core.stats(server.now()))  # the broker is up
            consumer._io.call(
                lambda: consumer._io.coordinator.connection_failed(
                    held[0].delivery.conn_id, ConnectionResetError("cut"), 0.0
                )
            ).result(10)
            wait_for(lambda: all(m.taken_back for m in held), what="taken back at the close")
            assert consumer.finish_many(held) == 2  # answered by this call, as finish()
            wait_for(lambda: consumer.stats().taken_back >= 2, what="late FINs reported")
            assert consumer.stats().finished == 0

"""``Consumer.finish_many``: many FINs in one post, with the semantics of ``finish()`` on each.

Against two brokers (so the answers go to several connections), embedded and real (skipped
without the binaries); nsqd's own finish counts are the referee.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nsq_sansio.errors import LocalProtocolError
from transports.sync import Consumer, Message, Producer
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

from ._helpers import channel_stats, running_nsqd, unique, wait_for

#: (tcp address, channel stats reader) of each of two brokers.
Brokers = list[tuple[str, Callable[[str, str], "dict[str, Any] | None"]]]


@pytest.fixture(params=["embedded", "real"])
def two_brokers(request: pytest.FixtureRequest) -> Iterator[Brokers]:
    with contextlib.ExitStack() as stack:
        brokers: Brokers = []
        for _ in range(2):
            if request.param == "embedded":
                server, runner = stack.enter_context(running_nsqd())
                brokers.append(
                    (server.tcp_address, lambda t, c, r=runner: channel_stats(r, t, c))  # type: ignore[misc]
                )
            else:
                if find_binaries() is None:
                    pytest.skip(MISSING_BINARIES)
                nsqd = stack.enter_context(RealNSQD())
                brokers.append((nsqd.tcp_address, nsqd.channel_stats))
        yield brokers


def _publish(brokers: Brokers, topic: str, per_broker: int) -> None:
    for address, _ in brokers:
        with Producer(address) as producer:
            producer.multi_publish(
                topic, [b"%s-%d" % (address.encode(), i) for i in range(per_broker)]
            )


def _fetch(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        batch = consumer.fetch(count - len(got), timeout=5.0)
        assert batch, f"fetched {len(got)} of {count}"
        got += batch
    return got


def _finished_on_nsqd(brokers: Brokers, topic: str) -> list[int]:
    counts = []
    for _, stats in brokers:
        channel = stats(topic, "c") or {}
        clients = channel.get("clients") or []
        counts.append(sum(client.get("finish_count", 0) for client in clients))
    return counts


def test_finish_many_fins_a_batch_from_several_connections_once_each(
    two_brokers: Brokers,
) -> None:
    """Skips what was answered, FINs a message given twice once, returns how many it answered;
    nsqd counts exactly one FIN per message on each connection and the channels empty."""
    topic = unique()
    _publish(two_brokers, topic, 150)
    nsqd = [address for address, _ in two_brokers]
    with Consumer(topic, "c", nsqd=nsqd, max_in_flight=300, pull=True) as consumer:
        held = _fetch(consumer, 300)
        assert len({m.nsqd_address for m in held}) == 2  # both connections hold some
        assert held[0].finish()  # answered before: skipped
        assert held[1].requeue(0.0, backoff=False)  # answered (REQ) before: skipped
        answered = consumer.finish_many(held + held[5:10])  # five given twice
        assert answered == 298
        assert all(m.answered for m in held)
        assert consumer.finish_many(held) == 0  # all answered now
        assert not held[7].finish()  # as after finish()
        # the REQ'd message comes back (attempts 2): the only one left
        again = _fetch(consumer, 1)
        assert again[0].id == held[1].id and again[0].attempts == 2
        assert consumer.finish_many(again) == 1
        # each nsqd had 150 messages: it counts 150 FINs, none twice
        wait_for(lambda: _finished_on_nsqd(two_brokers, topic) == [150, 150], what="300 FINs")
        assert consumer.stats().finished == 300
        assert consumer.stats().taken_back == 0
        assert not any(m.taken_back for m in held)
    for _, stats in two_brokers:
        channel = stats(topic, "c")
        assert channel is not None and channel["depth"] == 0 and channel["in_flight_count"] == 0


def test_finish_many_marks_only_the_refused_message_taken_back() -> None:
    """A message whose handle is no longer ours (answered behind the transport's back, the
    way a race would) gets ``taken_back``, as after ``finish()``; the others are FIN'd."""
    with running_nsqd() as (server, runner):
        topic = unique()
        with Producer(server.tcp_address) as producer:
            producer.multi_publish(topic, [b"a", b"b", b"c", b"d"])
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=4) as consumer:
            held = [consumer.get(timeout=10) for _ in range(4)]
            assert all(m is not None for m in held)
            messages: list[Message] = held  # type: ignore[assignment]
            gone = messages[2]
            assert consumer._io.call(
                lambda: consumer._io.coordinator.finish(gone.delivery, 0.0)
            ).result(10)
            assert consumer.finish_many(messages) == 4  # as finish(): True, reported later
            wait_for(lambda: gone.taken_back, what="the refused FIN reported")
            wait_for(lambda: consumer.stats().finished == 4, what="four FINs in the core")
            assert [m.taken_back for m in messages] == [False, False, True, False]
            assert consumer.stats().taken_back == 1
        channel = channel_stats(runner, topic, "c")
        assert channel is not None and channel["in_flight_count"] == 0 and channel["depth"] == 0


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


def test_finish_many_refuses_another_consumers_messages_and_answers_none() -> None:
    with running_nsqd() as (server, _):
        topics = unique(), unique()
        with Producer(server.tcp_address) as producer:
            for topic in topics:
                producer.multi_publish(topic, [b"1", b"2"])
        address = [server.tcp_address]
        with (
            Consumer(topics[0], "c", nsqd=address, max_in_flight=2, pull=True) as one,
            Consumer(topics[1], "c", nsqd=address, max_in_flight=2, pull=True) as two,
        ):
            mine, theirs = _fetch(one, 2), _fetch(two, 2)
            with pytest.raises(LocalProtocolError, match="another consumer"):
                one.finish_many(mine + theirs[:1])
            with pytest.raises(TypeError, match="takes Messages"):
                one.finish_many([*mine, "not a message"])  # type: ignore[list-item]
            assert not any(m.answered for m in mine + theirs)  # nothing was answered
            assert one.finish_many(mine) == 2 and two.finish_many(theirs) == 2
            wait_for(lambda: one.stats().finished == 2 and two.stats().finished == 2, what="FINs")

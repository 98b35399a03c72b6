"""``Consumer.finish_many``: many FINs in one core call, with ``finish()``'s semantics on each.

Two embedded brokers (so the answers go to several connections); the broker's own counts
(``finish_count``, in flight, depth) are the referee.
"""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from nsq_sansio.consumer import TakenBack
from nsq_sansio.errors import LocalProtocolError
from transports.anyio import Consumer, Message, Producer

from .conftest import NSQDFactory, wait_channel

pytestmark = pytest.mark.anyio


def _topic() -> str:
    return f"fm{uuid.uuid4().hex[:12]}"


async def _fetch(consumer: Consumer, count: int) -> list[Message]:
    got: list[Message] = []
    while len(got) < count:
        batch = await consumer.fetch(count - len(got), timeout=5.0)
        assert batch, f"fetched {len(got)} of {count}"
        got += batch
    return got


def _finish_count(stats: dict[str, Any]) -> int:
    return sum(client["finish_count"] for client in stats["clients"])


async def test_finish_many_fins_a_batch_from_several_connections_once_each(
    make_nsqd: NSQDFactory,
) -> None:
    """Skips what was answered, FINs a message given twice once, returns how many it FIN'd;
    each broker counts one FIN per message of its own."""
    servers = [make_nsqd(), make_nsqd()]
    topic = _topic()
    for server in servers:
        async with Producer(server.tcp_address) as producer:
            await producer.multi_publish(topic, [b"%d" % i for i in range(100)])
    nsqd = [server.tcp_address for server in servers]
    async with Consumer(topic, "c", nsqd=nsqd, pull=True, max_in_flight=200) as consumer:
        with anyio.fail_after(20):
            # Both connections up first, so each broker's FIN count is this test's alone.
            while sum(conn.connected for conn in consumer.stats().connections) < 2:
                await anyio.sleep(0.01)
            held = await _fetch(consumer, 200)
            assert len({m.nsqd_address for m in held}) == 2
            assert await held[0].finish()  # answered before: skipped
            assert consumer.finish_many_nowait(held + held[3:8]) == 199  # five given twice
            assert all(m.answered for m in held)
            assert await consumer.finish_many(held) == 0
            assert not await held[9].finish()  # as after finish()
            for server in servers:
                await wait_channel(
                    server,
                    topic,
                    "c",
                    lambda ch: ch["in_flight_count"] == 0 and _finish_count(ch) == 100,
                    what="100 FINs on each broker",
                )
            stats = consumer.stats()
            assert stats.finished == 200 and stats.taken_back == 0
            assert not any(m.taken_back for m in held)


async def test_finish_many_reports_messages_no_longer_ours_and_sends_the_rest(
    make_nsqd: NSQDFactory,
) -> None:
    """A message answered behind the transport's back (the way a race would) is not FIN'd
    again: it is marked ``taken_back`` and reported as TakenBack, as after finish_nowait();
    the others are FIN'd. The count is of the messages this call answered, as finish()'s
    True is."""
    server = make_nsqd()
    topic = _topic()
    async with Producer(server.tcp_address) as producer:
        await producer.multi_publish(topic, [b"a", b"b", b"c"])
    events: list[object] = []
    async with Consumer(
        topic, "c", nsqd=[server.tcp_address], pull=True, max_in_flight=3, on_event=events.append
    ) as consumer:
        with anyio.fail_after(20):
            held = await _fetch(consumer, 3)
            gone = held[1]
            assert consumer._coord.finish(gone.delivery, anyio.current_time())
            assert consumer.finish_many_nowait(held) == 3
            assert all(m.answered for m in held)
            assert [m.taken_back for m in held] == [False, True, False]
            while not any(isinstance(e, TakenBack) for e in events):  # reported on the loop
                await anyio.sleep(0.01)
            reports = [e for e in events if isinstance(e, TakenBack)]
            assert [r.delivery for r in reports] == [gone.delivery]
            await wait_channel(
                server,
                topic,
                "c",
                lambda ch: ch["in_flight_count"] == 0 and ch["depth"] == 0,
                what="all FIN'd",
            )
            assert consumer.stats().finished == 3  # the one behind its back too


async def test_finish_many_refuses_another_consumers_messages_and_answers_none(
    make_nsqd: NSQDFactory,
) -> None:
    server = make_nsqd()
    topics = _topic(), _topic()
    async with Producer(server.tcp_address) as producer:
        for topic in topics:
            await producer.multi_publish(topic, [b"1", b"2"])
    address = [server.tcp_address]
    async with (
        Consumer(topics[0], "c", nsqd=address, pull=True, max_in_flight=2) as one,
        Consumer(topics[1], "c", nsqd=address, pull=True, max_in_flight=2) as two,
    ):
        with anyio.fail_after(20):
            mine, theirs = await _fetch(one, 2), await _fetch(two, 2)
            with pytest.raises(LocalProtocolError, match="another consumer"):
                one.finish_many_nowait(mine + theirs[:1])
            with pytest.raises(TypeError, match="takes Messages"):
                await one.finish_many([*mine, "not a message"])  # type: ignore[list-item]
            assert not any(m.answered for m in mine + theirs)
            assert one.finish_many_nowait(mine) == 2
            assert two.finish_many_nowait(theirs) == 2
            assert one.stats().finished == 2 and two.stats().finished == 2

"""``Consumer.finish_many`` on every runtime: many FINs in one call, with the semantics of
``finish()`` on each.

Against two brokers (so the answers go to several connections), embedded and real (skipped
without the binaries); nsqd's own finish counts are the referee.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from support.brokers import BROKER_KINDS, running_nsqd, unique
from support.runtimes import ConsumerDriver, Runtime, broker_channel, wait_channel, wait_until

from nsq_sansio.consumer import TakenBack
from nsq_sansio.errors import LocalProtocolError
from transports.testing.real_nsq import RealNSQD

pytestmark = pytest.mark.anyio


@pytest.fixture(params=BROKER_KINDS)
def two_brokers(request: pytest.FixtureRequest) -> Iterator[list[Any]]:
    """Two running nsqd (embedded or real): each has ``tcp_address`` and ``http_url``."""
    with contextlib.ExitStack() as stack:
        if request.param == "real":
            yield [stack.enter_context(RealNSQD()) for _ in range(2)]
        else:
            yield [stack.enter_context(running_nsqd())[0] for _ in range(2)]


async def _fetch(consumer: ConsumerDriver, count: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < count:
        batch = await consumer.fetch(count - len(got), timeout=5.0)
        assert batch, f"fetched {len(got)} of {count}"
        got += batch
    return got


def _finish_count(channel: dict[str, Any]) -> int:
    return sum(client.get("finish_count", 0) for client in channel.get("clients") or [])


async def test_finish_many_fins_a_batch_from_several_connections_once_each(
    runtime: Runtime, two_brokers: list[Any]
) -> None:
    """Skips what was answered, FINs a message given twice once, returns how many it answered;
    nsqd counts exactly one FIN per message on each connection and the channels empty."""
    topic = unique()
    for server in two_brokers:
        async with runtime.producer(server.tcp_address) as p:
            await p.multi_publish(topic, [b"%d" % i for i in range(150)])
    nsqd = [server.tcp_address for server in two_brokers]
    async with runtime.consumer(topic, "c", nsqd=nsqd, max_in_flight=300, pull=True) as c:
        # Both connections up first, so each broker's FIN count is this test's alone.
        await wait_until(lambda: c.stats().connected == 2, what="both connections")
        held = await _fetch(c, 300)
        assert len({m.nsqd_address for m in held}) == 2  # both connections hold some
        assert await c.finish(held[0])  # answered before: skipped
        assert await runtime.call(held[1].requeue, 0.0, backoff=False)  # REQ'd before: skipped
        assert await runtime.call(c.client.finish_many, held + held[5:10]) == 298  # 5 twice
        assert all(m.answered for m in held)
        assert await runtime.call(c.client.finish_many, held) == 0  # all answered now
        assert not await c.finish(held[7])  # as after finish()
        # the REQ'd message comes back (attempts 2): the only one left
        again = await _fetch(c, 1)
        assert again[0].id == held[1].id and again[0].attempts == 2
        assert await runtime.call(c.client.finish_many, again) == 1
        for server in two_brokers:  # each nsqd had 150: it counts 150 FINs, none twice
            await wait_channel(
                server,
                topic,
                "c",
                lambda ch: ch["in_flight_count"] == 0 and _finish_count(ch) == 150,
                what="150 FINs on each broker",
            )
        stats = c.stats()
        assert stats.finished == 300 and stats.taken_back == 0
        assert not any(m.taken_back for m in held)
    for server in two_brokers:
        channel = await broker_channel(server, topic, "c")
        assert channel["depth"] == 0 and channel["in_flight_count"] == 0


async def _answer_behind_its_back(runtime: Runtime, consumer: Any, message: Any) -> None:
    """FIN ``message`` in the core directly, the way a race would (the transport not told)."""
    if runtime.blocking:
        io = consumer._io
        assert await anyio.to_thread.run_sync(
            lambda: io.call(lambda: io.coordinator.finish(message.delivery, 0.0)).result(10)
        )
    else:
        assert consumer._coord.finish(message.delivery, anyio.current_time())


async def test_finish_many_marks_only_a_message_no_longer_ours_taken_back(
    runtime: Runtime,
) -> None:
    """A message whose handle is no longer ours (answered behind the transport's back) is
    not FIN'd again: it is marked ``taken_back`` and reported as TakenBack, as after
    ``finish()``; the others are FIN'd. The count is of the messages this call answered, as
    ``finish()``'s True is."""
    topic = unique()
    events: list[object] = []
    with running_nsqd() as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            await p.multi_publish(topic, [b"a", b"b", b"c", b"d"])
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=4, on_event=events.append
        ) as c:
            held = [await c.get(timeout=10) for _ in range(4)]
            assert all(m is not None for m in held)
            gone = held[2]
            await _answer_behind_its_back(runtime, c.client, gone)
            if runtime.blocking:
                assert await runtime.call(c.client.finish_many, held) == 4
            else:  # the loop's own call, answered on the spot
                assert c.client.finish_many_nowait(held) == 4
            assert all(m.answered for m in held)
            await wait_until(lambda: gone.taken_back, what="the refused FIN reported")
            await wait_until(lambda: c.stats().finished == 4, what="four FINs in the core")
            assert [m.taken_back for m in held] == [False, False, True, False]
            assert c.stats().taken_back == 1
            reports = await wait_until(  # reported on the consumer's loop / IO thread
                lambda: [e for e in events if isinstance(e, TakenBack)], what="TakenBack"
            )
            assert [r.delivery for r in reports] == [gone.delivery]
            await wait_channel(
                server,
                topic,
                "c",
                lambda ch: ch["in_flight_count"] == 0 and ch["depth"] == 0,
                what="all FIN'd",
            )


async def test_finish_many_refuses_another_consumers_messages_and_answers_none(
    runtime: Runtime,
) -> None:
    topics = unique(), unique()
    with running_nsqd() as (server, _):
        async with runtime.producer(server.tcp_address) as p:
            for topic in topics:
                await p.multi_publish(topic, [b"1", b"2"])
        address = [server.tcp_address]
        async with (
            runtime.consumer(topics[0], "c", nsqd=address, max_in_flight=2, pull=True) as one,
            runtime.consumer(topics[1], "c", nsqd=address, max_in_flight=2, pull=True) as two,
        ):
            mine, theirs = await _fetch(one, 2), await _fetch(two, 2)
            with pytest.raises(LocalProtocolError, match="another consumer"):
                await runtime.call(one.client.finish_many, mine + theirs[:1])
            if not runtime.blocking:
                with pytest.raises(LocalProtocolError, match="another consumer"):
                    one.client.finish_many_nowait(mine + theirs[:1])
            with pytest.raises(TypeError, match="takes Messages"):
                await runtime.call(one.client.finish_many, [*mine, "not a message"])
            assert not any(m.answered for m in mine + theirs)  # nothing was answered
            assert await runtime.call(one.client.finish_many, mine) == 2
            assert await runtime.call(two.client.finish_many, theirs) == 2
            await wait_until(
                lambda: one.stats().finished == 2 and two.stats().finished == 2, what="FINs"
            )

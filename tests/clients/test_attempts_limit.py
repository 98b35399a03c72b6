"""``max_attempts`` on every runtime, on the paths a failing handler really takes: a message is
delivered exactly ``max_attempts`` times, then FIN'd and reported (:class:`GiveUp`) once;
``max_attempts=0`` never gives up. Backoff stays on, as it is by default, so the redeliveries
arrive while the consumer backs off (the coordinator's slow path, not the plain read path);
pull mode gives up the same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
from support.brokers import http_channel_stats, unique
from support.runtimes import Runtime

from nsq_sansio.consumer import GiveUp
from transports.embedded import EmbeddedNSQD

#: Backoff windows of tens of milliseconds, and REQ without delay: a failure costs little time.
FAST_RETRIES: dict[str, Any] = {
    "backoff_multiplier": 0.02,
    "max_backoff_duration": 0.1,
    "default_requeue_delay": 0.0,
}


async def answer(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A message's answer call, awaited where it is a coroutine (the blocking ones only post
    to the IO thread)."""
    result = call(*args, **kwargs)
    return await result if inspect.isawaitable(result) else result


def channel(nsqd: EmbeddedNSQD, topic: str) -> dict[str, Any]:
    return http_channel_stats(nsqd.http_url, topic, "c") or {}


@pytest.mark.anyio
async def test_a_failing_message_is_delivered_max_attempts_times_then_given_up(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """max_attempts=3 and a handler that fails each time (REQ with backoff): deliveries 1, 2
    and 3 reach the user (2 and 3 while backing off), the 4th is FIN'd and reported."""
    topic = unique()
    events: list[object] = []
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"poison")
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_attempts=3, on_event=events.append, **FAST_RETRIES
    ) as c:
        seen: list[int] = []
        ids: set[bytes] = set()
        while (msg := await c.get(5)) is not None:
            seen.append(msg.attempts)
            ids.add(msg.id)
            assert await answer(msg.requeue, 0.0)  # a failure: backoff on
            if len(seen) > 3:
                break
        given_up = [e for e in events if isinstance(e, GiveUp)]
        stats = c.stats()
    assert seen == [1, 2, 3]
    assert len(given_up) == 1 and given_up[0].message.attempts == 4
    assert {given_up[0].message.id} == ids
    assert stats.given_up == 1 and stats.requeued == 3 and stats.finished == 0
    after = channel(nsqd, topic)
    assert after["depth"] == 0 and after["in_flight_count"] == 0  # FIN'd, not requeued


@pytest.mark.anyio
async def test_zero_max_attempts_never_gives_up_even_while_backing_off(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """max_attempts=0 means no limit: six failures in a row (each delivery after the first
    arriving while the consumer backs off) are six deliveries, then the user finishes it."""
    topic = unique()
    events: list[object] = []
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"stubborn")
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_attempts=0, on_event=events.append, **FAST_RETRIES
    ) as c:
        seen: list[int] = []
        while (msg := await c.get(5)) is not None:
            seen.append(msg.attempts)
            if len(seen) == 7:
                assert await c.finish(msg)
                break
            assert await answer(msg.requeue, 0.0)
        stats = c.stats()
    assert seen == [1, 2, 3, 4, 5, 6, 7]
    assert not [e for e in events if isinstance(e, GiveUp)]
    assert stats.given_up == 0 and stats.finished == 1


@pytest.mark.anyio
async def test_pull_mode_gives_up_after_max_attempts_too(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """A pull consumer with max_attempts=2: two fetches get the message (each requeued), the
    third delivery never reaches a fetch: it is FIN'd and reported."""
    topic = unique()
    events: list[object] = []
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"poison")
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        pull=True,
        max_attempts=2,
        on_event=events.append,
        **FAST_RETRIES,
    ) as c:
        seen: list[int] = []
        for _ in range(2):
            [msg] = await c.fetch(1, 5.0)
            seen.append(msg.attempts)
            assert await answer(msg.requeue, 0.0, backoff=False)
        assert await c.fetch(1, 1.0) == []  # the third delivery went nowhere
        given_up = [e for e in events if isinstance(e, GiveUp)]
        stats = c.stats()
    assert seen == [1, 2]
    assert len(given_up) == 1 and given_up[0].message.attempts == 3
    assert stats.given_up == 1
    after = channel(nsqd, topic)
    assert after["depth"] == 0 and after["in_flight_count"] == 0

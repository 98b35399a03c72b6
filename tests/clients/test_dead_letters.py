"""Dead-letter topics on every runtime, against the embedded broker: a message given up after
``max_attempts`` is published to the dead-letter topic once (its body, or the documented
envelope), and only then FIN'd; a dead-letter nsqd killed mid-way loses nothing (the messages
are requeued and dead-lettered later); push (iteration, run()) and pull (fetch()); routing by
a function; bad settings are a ConfigError at construction, the same everywhere."""

from __future__ import annotations

import base64
import json
from typing import Any

import anyio
import pytest
from support.brokers import LateBroker, get_json, http_channel_stats, unique
from support.runtimes import Runtime

from nsq_sansio.consumer import GiveUp
from nsq_sansio.dead_letter import decode_envelope
from nsq_sansio.errors import ConfigError
from nsq_sansio.events import Message
from transports.embedded import EmbeddedNSQD

from .test_attempts_limit import FAST_RETRIES, answer


def topic_count(http_url: str, topic: str) -> int:
    """Messages nsqd stored for ``topic`` (0 when it has no such topic)."""
    stats = get_json(f"{http_url}/stats?format=json&topic={topic}")
    topics = stats.get("topics") or []
    return sum(int(t["message_count"]) for t in topics if t["topic_name"] == topic)


def source_empty(nsqd: EmbeddedNSQD, topic: str) -> bool:
    found = http_channel_stats(nsqd.http_url, topic, "c") or {}
    return found.get("depth") == 0 and found.get("in_flight_count") == 0


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_a_poison_message_lands_on_the_dead_letter_topic_once_then_is_finished(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic, dead = unique(), unique("dead")
    events: list[object] = []
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"poison")
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_attempts=2,
        dead_letter_topic=dead,
        on_event=events.append,
        **FAST_RETRIES,
    ) as c:
        seen = []
        for _ in range(2):
            msg = await c.get(5)
            assert msg is not None
            seen.append(msg.attempts)
            assert await answer(msg.requeue, 0.0)
        await wait_until(lambda: any(isinstance(e, GiveUp) for e in events))
        assert await c.get(0.3) is None  # the third delivery never reached the user
    assert seen == [1, 2]
    (give_up,) = [e for e in events if isinstance(e, GiveUp)]
    assert isinstance(give_up, GiveUp)
    assert give_up.dead_letter_topic == dead and give_up.message.attempts == 3
    assert topic_count(nsqd.http_url, dead) == 1
    assert source_empty(nsqd, topic)  # FIN'd, not requeued
    async with runtime.consumer(dead, "read", nsqd=[nsqd.tcp_address]) as reader:
        assert await reader.bodies(1, 5.0) == [b"poison"]  # the body, unchanged


@pytest.mark.anyio
async def test_run_envelope_carries_id_attempts_source_and_the_handler_error(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic, dead = unique(), unique("dead")
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"\xff\x00not utf-8")
    events: list[object] = []
    ids: set[bytes] = set()

    def handler(msg: Any) -> None:
        ids.add(msg.id)
        raise ValueError(f"bad order, attempt {msg.attempts}")

    async with (
        runtime.consumer(
            topic,
            "c",
            nsqd=[nsqd.tcp_address],
            max_attempts=2,
            dead_letter_topic=dead,
            dead_letter_format="envelope",
            on_event=events.append,
            **FAST_RETRIES,
        ) as c,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(c.run, handler, 2)
        await wait_until(lambda: any(isinstance(e, GiveUp) for e in events))
        c.client.start_drain()
    assert topic_count(nsqd.http_url, dead) == 1
    assert source_empty(nsqd, topic)
    async with runtime.consumer(dead, "read", nsqd=[nsqd.tcp_address]) as reader:
        (raw,) = await reader.bodies(1, 5.0)
    document = json.loads(raw)
    envelope = decode_envelope(raw)
    assert {envelope.id.encode()} == ids
    assert envelope.attempts == 3
    assert (envelope.topic, envelope.channel) == (topic, "c")
    assert envelope.nsqd == nsqd.tcp_address
    assert envelope.error == "ValueError('bad order, attempt 2')"
    assert envelope.body == b"\xff\x00not utf-8"
    assert base64.b64decode(document["body"]) == envelope.body
    assert document["first_seen"].endswith("Z") and envelope.timestamp > 0


@pytest.mark.anyio
async def test_pull_mode_dead_letters_too(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic, dead = unique(), unique("dead")
    events: list[object] = []
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.publish(topic, b"poison")
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        pull=True,
        max_attempts=1,
        dead_letter_topic=dead,
        on_event=events.append,
        **FAST_RETRIES,
    ) as c:
        [msg] = await c.fetch(1, 5.0)
        assert await answer(msg.requeue, 0.0, backoff=False)
        assert await c.fetch(1, 1.0) == []  # the second delivery went to the dead letters
        await wait_until(lambda: any(isinstance(e, GiveUp) for e in events))
    assert topic_count(nsqd.http_url, dead) == 1
    assert source_empty(nsqd, topic)


@pytest.mark.anyio
async def test_a_routing_function_chooses_per_message(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    a, b = unique("deada"), unique("deadb")
    events: list[object] = []
    bodies = [b"to-a", b"to-b", b"nowhere"]
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, bodies)

    def route(message: Message) -> str | None:
        return {b"to-a": a, b"to-b": b}.get(message.body)

    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_attempts=1,
        dead_letter_topic=route,
        on_event=events.append,
        **FAST_RETRIES,
    ) as c:
        for _ in range(3):
            msg = await c.get(5)
            assert msg is not None
            assert await answer(msg.requeue, 0.0, backoff=False)
        await wait_until(lambda: len([e for e in events if isinstance(e, GiveUp)]) == 3)
    routed = {e.message.body: e.dead_letter_topic for e in events if isinstance(e, GiveUp)}
    assert routed == {b"to-a": a, b"to-b": b, b"nowhere": None}
    assert (topic_count(nsqd.http_url, a), topic_count(nsqd.http_url, b)) == (1, 1)
    assert source_empty(nsqd, topic)


@pytest.mark.anyio
async def test_nothing_lost_when_the_dead_letter_nsqd_dies_mid_way(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """Poison messages dead-lettered to a second nsqd, which is killed after some arrived:
    the publishes that fail requeue their messages, which come back and are dead-lettered
    once an nsqd is there again. Every message is given up after a stored publish, none is
    lost: counted on the consumer's side (one GiveUp per id) and on the new nsqd."""
    topic, dead = unique(), unique("dead")
    total = 30
    bodies = [b"m%d" % i for i in range(total)]
    late = LateBroker("embedded")
    late.start()
    events: list[object] = []

    def given_up() -> list[GiveUp]:
        return [e for e in events if isinstance(e, GiveUp)]

    try:
        async with runtime.consumer(
            topic,
            "c",
            nsqd=[nsqd.tcp_address],
            max_attempts=1,
            dead_letter_topic=dead,
            dead_letter_nsqd=late.tcp_address,
            on_event=events.append,
            connect_timeout=0.5,
            **FAST_RETRIES,
        ) as c:

            def fail(msg: Any) -> None:
                raise RuntimeError("poison")

            before_restart = 0

            async def publish_kill_restart() -> None:
                nonlocal before_restart
                async with runtime.producer(nsqd.tcp_address) as p:
                    await p.multi_publish(topic, bodies[:10])
                    await wait_until(lambda: len(given_up()) >= 10)
                    await anyio.to_thread.run_sync(late.close)  # the dead-letter nsqd dies
                    await p.multi_publish(topic, bodies[10:])
                    await wait_until(lambda: failures_of(c) >= 3)
                    before_restart = len(given_up())
                    await anyio.to_thread.run_sync(late.start)  # back, empty, same port
                    everything = set(bodies)
                    await wait_until(lambda: {e.message.body for e in given_up()} >= everything, 30)

            async with anyio.create_task_group() as tg:
                tg.start_soon(c.run, fail, 4)
                try:
                    await publish_kill_restart()
                finally:  # run() returns (even when the test fails)
                    c.client.start_drain()
            stats = core_stats(c)
        stored_after_restart = topic_count(late.http_url, dead)
    finally:
        late.close()
    assert before_restart == 10  # no publish was reported stored while it was down
    ids_given_up = [e.message.id for e in given_up()]
    assert len(set(ids_given_up)) == total
    assert stats["dead_letter_failures"] >= 3
    assert source_empty(nsqd, topic)
    # Every give-up after the restart was stored on the new nsqd (at least once).
    assert stored_after_restart >= len(given_up()) - before_restart >= total - 10


def core_stats(c: Any) -> dict[str, int]:
    """The consumer's core counters (dead_lettered, dead_letter_failures...)."""
    client = c.client
    coordinator = client._io.coordinator if hasattr(client, "_io") else client._coord
    return dict(coordinator.stats)


def failures_of(c: Any) -> int:
    return core_stats(c)["dead_letter_failures"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "options",
    [
        {"dead_letter_topic": ""},
        {"dead_letter_topic": "has space"},
        {"dead_letter_topic": "x" * 65},
        {"dead_letter_topic": 42},
        {"dead_letter_topic": "ok", "dead_letter_format": "xml"},
        {"dead_letter_format": "envelope"},
        {"dead_letter_nsqd": "127.0.0.1:4150"},
        {"dead_letter_topic": "ok", "dead_letter_nsqd": []},
    ],
)
async def test_bad_dead_letter_settings_are_config_errors(
    runtime: Runtime, options: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError):
        runtime.module.Consumer("t", "c", nsqd=["127.0.0.1:4150"], **options)

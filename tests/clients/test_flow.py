"""Flow control, message policy, long jobs and brokers that go away, on every runtime, checked
on the broker's side where it matters.

What is the core's decision about time (the backoff window and the RDY it sends around it, a
fetch's expiry) is checked to the tick on the virtual clock (tests/consumer/test_timing.py);
here one short run per behaviour shows the runtime wires it: timers fire, RDY reaches nsqd,
heartbeats are answered while user code holds a message, TOUCHes go out under keepalive.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import anyio
import pytest
from support.brokers import running_nsqd, unique
from support.runtimes import Runtime, broker_channel, wait_channel, wait_until

from nsq_sansio.consumer import ConnectionUp, Disconnected, GiveUp, TakenBack
from nsq_sansio.errors import LocalProtocolError
from transports.embedded import EmbeddedLookupd, EmbeddedNSQD, ServerThread

pytestmark = pytest.mark.anyio


async def publish(runtime: Runtime, address: str, topic: str, bodies: list[bytes]) -> None:
    async with runtime.producer(address) as p:
        await p.multi_publish(topic, bodies)


def _client(channel: dict[str, Any]) -> dict[str, Any]:
    clients = channel.get("clients") or [{}]
    return clients[0]


async def test_max_in_flight_is_respected_on_the_broker(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """Holding max_in_flight messages, nothing more comes until one is answered; nsqd never
    has more in flight to this consumer."""
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"%d" % i for i in range(100)])
    peak = done = 0
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=7, msg_timeout=300.0
    ) as c:
        held: list[Any] = []
        while done < 100:
            msg = await c.get(timeout=5)
            assert msg is not None
            held.append(msg)
            if len(held) == 7 or done + len(held) == 100:
                channel = await broker_channel(nsqd, topic, "c")
                peak = max(peak, channel["in_flight_count"])
                assert channel["in_flight_count"] <= 7
                if len(held) == 7:  # nothing more is delivered until one is answered
                    assert await c.get(timeout=0.05) is None
                for m in held:
                    assert await c.finish(m)
                done += len(held)
                held = []
        assert c.stats().finished == 100
    assert peak == 7


async def test_backoff_after_a_failure_is_wired_to_the_broker(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """A failure: backoff (RDY 0) for the window, then the test phase, then a success brings
    full RDY back, on nsqd too. The window's length and the RDY nsqd sees in each phase are
    checked on the virtual clock; here the runtime's timer ends the window."""
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"%d" % i for i in range(6)])
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_in_flight=10,
        backoff_multiplier=0.25,  # a 0.5 s window
        max_backoff_duration=0.5,
    ) as c:
        first = await c.get(timeout=5)
        assert first is not None
        await wait_until(lambda: c.stats().in_flight == 6, what="6 in flight")
        started = time.monotonic()
        assert await runtime.call(first.requeue, delay=0)  # a failure: backoff starts
        stats = c.stats()
        assert stats.backoff_level == 1 and stats.backoff_phase == "waiting"
        assert stats.rdy == 0
        await wait_until(lambda: c.stats().backoff_phase == "testing", what="testing")
        assert time.monotonic() - started >= 0.45  # the window, by the runtime's timer
        # the five still held, and one test message (the requeued one)
        await wait_channel(
            nsqd, topic, "c", lambda ch: _client(ch)["ready_count"] == 6, what="RDY 5 + 1"
        )
        got: list[bytes] = []
        while c.stats().backoff_phase != "normal":
            msg = await c.get(timeout=5)
            assert msg is not None
            got.append(msg.body)
            assert await c.finish(msg)
        assert c.stats().backoff_level == 0 and c.stats().rdy == 10
        await wait_channel(
            nsqd, topic, "c", lambda ch: _client(ch)["ready_count"] == 10, what="full RDY"
        )


async def test_max_attempts_gives_up(
    runtime: Runtime, nsqd: EmbeddedNSQD, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"poison", b"fine"])
    events: list[object] = []
    attempts: list[int] = []
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        max_in_flight=2,
        max_attempts=3,
        backoff_enabled=False,
        on_event=events.append,
    ) as c:
        with anyio.fail_after(10):
            while not any(isinstance(e, GiveUp) for e in events):
                msg = await c.get(timeout=0.1)
                if msg is None:
                    continue
                if msg.body == b"poison":
                    attempts.append(msg.attempts)
                    assert await runtime.call(msg.requeue, delay=0)
                else:
                    assert await c.finish(msg)
        stats = c.stats()
    assert attempts == [1, 2, 3]  # attempts 1..3 reached user code; the 4th was given up
    (give_up,) = [e for e in events if isinstance(e, GiveUp)]
    assert give_up.message.body == b"poison" and give_up.message.attempts == 4
    assert stats.given_up == 1
    assert "giving up on message" in caplog.text
    await wait_channel(
        nsqd,
        topic,
        "c",
        lambda ch: ch["depth"] == 0 and ch["deferred_count"] == 0 and ch["in_flight_count"] == 0,
        what="the given-up message FIN'd",
    )


async def test_drain_with_messages_in_flight_loses_and_redelivers_nothing(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """drain() waits for what user code holds (answered during the drain: FIN'd), requeues the
    rest at once; iteration ends; another consumer gets exactly the rest, each once."""
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"%d" % i for i in range(100)])
    processed: list[bytes] = []
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=20) as c:
        held = [await c.get(timeout=5) for _ in range(3)]
        assert all(m is not None for m in held)
        await wait_until(lambda: c.stats().in_flight == 20, what="20 in flight")
        drained = anyio.Event()

        async def drain() -> None:
            await runtime.call(c.client.drain, timeout=10)
            drained.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(drain)
            await wait_until(lambda: c.client.draining, what="the drain")
            await anyio.sleep(0.2)
            assert not drained.is_set()  # it waits for the 3 messages user code holds
            for m in held:
                processed.append(m.body)
                assert await c.finish(m)  # answered during the drain: FIN'd, not requeued
        assert [m async for m in c.messages()] == []  # iteration ends once drained
        assert c.stats().finished == 3
    await wait_channel(nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0, what="drained")
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=50) as c2:
        processed += await c2.bodies(97, timeout=10)
        assert await c2.get(timeout=0.3) is None  # nothing redelivered
    assert sorted(processed) == sorted(b"%d" % i for i in range(100))


async def test_broker_killed_and_restarted_consumer_reconnects_and_continues(
    runtime: Runtime,
) -> None:
    topic = unique()
    with running_nsqd() as (server, _):
        address = server.tcp_address
    events: list[object] = []
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[address],
        max_in_flight=5,
        reconnect_delay=0.05,
        max_reconnect_delay=0.2,
        on_event=events.append,
    ) as c:
        for round_ in range(2):
            runner = ServerThread(EmbeddedNSQD(tcp_address=address))
            await anyio.to_thread.run_sync(runner.start)
            try:
                bodies = [b"%d-%d" % (round_, i) for i in range(10)]
                await publish(runtime, address, topic, bodies)
                assert sorted(await c.bodies(10, timeout=15)) == sorted(bodies)
                done = 10 * (round_ + 1)
                await wait_until(lambda d=done: c.stats().finished == d, what="FINs")
                await wait_channel(runner.server, topic, "c", lambda ch: ch["in_flight_count"] == 0)
            finally:
                await anyio.to_thread.run_sync(runner.stop)  # kill the broker under it
            await wait_until(lambda: c.stats().connected == 0, what="disconnect noticed")
            assert any(isinstance(e, Disconnected) for e in events)
        stats = c.stats()
    assert stats.finished == 20
    assert stats.reconnects >= 1


async def test_a_message_held_past_two_heartbeats_keeps_the_connection(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    """nsqd drops a client after two unanswered heartbeats (one a second here): user code
    holding a message for 2.5 s must not stop the runtime answering them."""
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"slow", b"next"])
    events: list[object] = []
    async with runtime.consumer(
        topic,
        "c",
        nsqd=[nsqd.tcp_address],
        heartbeat_interval=1.0,
        msg_timeout=10.0,
        max_in_flight=1,
        on_event=events.append,
    ) as c:
        msg = await c.get(timeout=5)
        assert msg is not None and msg.body == b"slow"
        await anyio.sleep(2.5)  # the job
        assert await c.finish(msg)
        nxt = await c.get(timeout=5)
        assert nxt is not None and nxt.body == b"next" and nxt.attempts == 1
        assert await c.finish(nxt)
        stats = c.stats()
    assert stats.reconnects == 0 and stats.connection_errors == 0 and stats.taken_back == 0
    assert not [e for e in events if isinstance(e, TakenBack)]
    assert not [e for e in events if isinstance(e, Disconnected) and e.error is not None]


async def test_keepalive_keeps_a_job_past_msg_timeout_alive(runtime: Runtime) -> None:
    topic = unique()
    events: list[object] = []
    with running_nsqd(msg_timeout=1.0) as (server, _):
        await publish(runtime, server.tcp_address, topic, [b"long job"])
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=5, on_event=events.append
        ) as c:
            msg = await c.get(timeout=5)
            assert msg is not None
            async with runtime.keepalive(msg):
                await anyio.sleep(2.5)  # 2.5x msg_timeout
            assert not msg.taken_back and not msg.keepalive_expiring
            assert await c.finish(msg)
            assert await c.get(timeout=0.5) is None  # not redelivered
            stats = c.stats()
        channel = await broker_channel(server, topic, "c")
    assert stats.taken_back == 0 and stats.finished == 1 and stats.received == 1
    assert not [e for e in events if isinstance(e, (TakenBack, runtime.module.KeepaliveExpired))]
    assert channel["timeout_count"] == 0 and channel["requeue_count"] == 0


async def test_without_keepalive_nothing_is_touched_and_the_message_times_out(
    runtime: Runtime,
) -> None:
    """A message held past msg_timeout without keepalive: nsqd takes it back and sends it
    again; the late FIN of the first delivery is reported (taken back), not raised."""
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, _):
        await publish(runtime, server.tcp_address, topic, [b"long job"])
        async with runtime.consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=5) as c:
            msg = await c.get(timeout=5)
            assert msg is not None
            again = await c.get(timeout=5)  # nsqd took it back after 1 s and sent it again
            assert again is not None and again.id == msg.id and again.attempts == 2
            assert await c.finish(again)
            await c.finish(msg)  # late: reported, not raised
            await wait_until(lambda: c.stats().taken_back >= 1, what="taken back")
            assert msg.taken_back
        channel = await broker_channel(server, topic, "c")
    assert channel["timeout_count"] == 1


async def test_pull_batch_held_under_keepalive_then_finished_after_commit(
    runtime: Runtime,
) -> None:
    """The Spark source's pattern: fetch a batch, keep it alive while committing (longer than
    msg_timeout), FIN after the commit: nothing times out, nothing is delivered twice."""
    topic = unique()
    with running_nsqd(msg_timeout=1.0) as (server, _):
        await publish(runtime, server.tcp_address, topic, [b"%d" % i for i in range(30)])
        async with runtime.consumer(
            topic, "spark", nsqd=[server.tcp_address], pull=True, max_in_flight=100
        ) as c:
            batch = await c.fetch(20, timeout=5.0)
            assert len(batch) == 20
            async with contextlib.AsyncExitStack() as stack:
                for m in batch:
                    await stack.enter_async_context(runtime.keepalive(m))
                await anyio.sleep(2.5)  # "commit"
            for m in batch:
                assert not m.taken_back
                assert await c.finish(m)
            rest = await c.fetch(10, timeout=5.0)  # filled at once: no wait past msg_timeout
            assert len(rest) == 10 and all(m.attempts == 1 for m in rest)
            for m in rest:
                assert await c.finish(m)
        # the last FINs are applied by the broker a little after the consumer closed
        channel = await wait_channel(
            server, topic, "spark", lambda ch: ch["in_flight_count"] == 0, what="every FIN"
        )
    assert channel["timeout_count"] == 0 and channel["depth"] == 0


async def test_keepalive_warns_before_max_msg_timeout(
    runtime: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nsq_sansio")
    topic = unique()
    events: list[object] = []
    KeepaliveExpired = runtime.module.KeepaliveExpired
    with running_nsqd(msg_timeout=1.0, max_msg_timeout=2.0) as (server, _):
        await publish(runtime, server.tcp_address, topic, [b"too long"])
        async with runtime.consumer(
            topic, "c", nsqd=[server.tcp_address], max_in_flight=5, on_event=events.append
        ) as c:
            msg = await c.get(timeout=5)
            assert msg is not None
            async with runtime.keepalive(msg):
                await wait_until(lambda: msg.keepalive_expiring, timeout=3, what="the warning")
                expired = [e for e in events if isinstance(e, KeepaliveExpired)]
                assert len(expired) == 1 and expired[0].message_id == msg.id
                assert expired[0].deadline - msg.received_at == pytest.approx(2.0, abs=0.05)
                # The warning comes before nsqd takes the message back.
                assert expired[0].deadline > time.monotonic()
                assert not msg.taken_back
                again = await c.get(timeout=3)  # nsqd took it back at max_msg_timeout
            assert again is not None and again.id == msg.id
            assert await c.finish(again)
    assert "max_msg_timeout" in caplog.text


async def test_fetch_batch_expiry_and_no_wait(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    """A fetch returns what it asked for in order; one asking for more ends at its expiry with
    what came; ``no_wait`` answers at once; the broker never holds more than was asked; a pull
    consumer refuses iteration. (The expiry to the tick: on the virtual clock.)"""
    topic = unique()
    await publish(runtime, nsqd.tcp_address, topic, [b"%d" % i for i in range(25)])
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=100, pull=True
    ) as c:
        batch = await c.fetch(10, timeout=5.0)
        assert [m.body for m in batch] == [b"%d" % i for i in range(10)]
        # RDY follows the fetches: the broker holds only what was asked
        assert (await broker_channel(nsqd, topic, "c"))["in_flight_count"] <= 10
        for m in batch:
            assert await c.finish(m)
        started = time.monotonic()
        rest = await c.fetch(100, timeout=0.3)  # expires with what arrived: the other 15
        assert 0.25 <= time.monotonic() - started < 3.0
        assert sorted(m.body for m in rest) == sorted(b"%d" % i for i in range(10, 25))
        for m in rest:
            assert await c.finish(m)
        started = time.monotonic()
        assert await runtime.call(c.client.fetch, 5, no_wait=True) == []  # at once
        assert time.monotonic() - started < 1.0
        with pytest.raises(LocalProtocolError, match="pull consumers use fetch"):
            await c.get(timeout=1)
        with pytest.raises(LocalProtocolError, match="pull consumers use fetch"):
            async for _msg in c.messages():
                pass
        await wait_channel(nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0)
        assert c.stats().finished == 25 and c.stats().received == 25


async def test_lookupd_mode_reconnects_only_to_a_rediscovered_nsqd(runtime: Runtime) -> None:
    topic = unique()
    with ServerThread(EmbeddedLookupd()) as lookupd:
        options: dict[str, Any] = {
            "lookupd_tcp_addresses": [lookupd.tcp_address],
            "lookupd_ping_interval": 0.2,
        }
        first = ServerThread(EmbeddedNSQD(**options))
        address = first.start().tcp_address
        events: list[object] = []
        async with runtime.consumer(
            topic,
            "c",
            lookupd=[lookupd.http_url],
            lookupd_poll_interval=0.3,
            lookupd_poll_jitter=0.0,
            on_event=events.append,
        ) as c:
            await publish(runtime, address, topic, [b"one"])
            assert await c.bodies(1, timeout=10) == [b"one"]
            await anyio.to_thread.run_sync(first.stop)
            await wait_until(lambda: c.stats().connected == 0, what="disconnect noticed")
            assert any(isinstance(e, Disconnected) for e in events)
            await anyio.sleep(1.0)  # several polls: the dead nsqd is not retried on its own
            assert sum(1 for e in events if isinstance(e, ConnectionUp)) == 1
            second = ServerThread(EmbeddedNSQD(tcp_address=address, **options))
            await anyio.to_thread.run_sync(second.start)
            try:
                await publish(runtime, address, topic, [b"two"])  # registered again
                assert await c.bodies(1, timeout=10) == [b"two"]
            finally:
                await anyio.to_thread.run_sync(second.stop)
            stats = c.stats()
    assert sum(1 for e in events if isinstance(e, ConnectionUp)) == 2
    assert stats.reconnects >= 1 and stats.connection_errors >= 1

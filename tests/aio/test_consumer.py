"""anyio consumer behaviour against the embedded broker: flow control, failures, shutdown."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import anyio
import pytest
from support.runtimes import broker_channel, wait_channel

from nsq_sansio.consumer import GiveUp
from nsq_sansio.errors import LocalProtocolError
from transports.anyio import Consumer, Message, Producer, drain_on_signals
from transports.embedded import EmbeddedNSQD

from .conftest import NSQDFactory, stop_nsqd

pytestmark = pytest.mark.anyio


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(address) as p:
        await p.multi_publish(topic, bodies)


async def test_cancellation_cleans_up(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(5)])
    held: list[Message] = []
    with anyio.move_on_after(1.0) as scope:
        async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5) as c:
            async for msg in c:
                held.append(msg)  # never answered
    assert scope.cancelled_caught
    assert held
    # No connection left, nothing in flight: the held messages went back to the queue.
    with anyio.fail_after(5):
        while True:
            ch = await broker_channel(nsqd, topic, "ch")
            if not ch.get("clients") and ch.get("in_flight_count") == 0:
                break
            await anyio.sleep(0.02)
    assert ch["depth"] + ch["deferred_count"] == 5


async def test_fetch_cancelled_from_outside_loses_nothing(make_nsqd: NSQDFactory) -> None:
    # A fetch bounded by an outer cancel scope (not by its own timeout) must leave the
    # coordinator: before, it kept waiting there, swallowed later deliveries (which timed out
    # on nsqd and were given up after max_attempts) and, after 512 of them, every fetch
    # returned [] at once.
    server = make_nsqd(msg_timeout=1.0)
    topic = fresh()
    events: list[object] = []
    async with Consumer(
        topic,
        "ch",
        nsqd=[server.tcp_address],
        pull=True,
        max_in_flight=50,
        max_attempts=3,
        on_event=events.append,
    ) as c:
        with anyio.fail_after(20):
            with anyio.move_on_after(0.2):
                await c.fetch(10)
            for _ in range(600):  # more than max_waiting_fetches
                with anyio.CancelScope() as scope:
                    scope.cancel()
                    await c.fetch(5)
            await publish(server.tcp_address, topic, [b"a", b"b", b"c"])
            await anyio.sleep(1.5)  # longer than msg_timeout: nothing may be in flight
            batch = await c.fetch(3, timeout=5)
            assert sorted(m.body for m in batch) == [b"a", b"b", b"c"]
            assert [m.attempts for m in batch] == [1, 1, 1]
            for msg in batch:
                await msg.finish()
            # Messages a cancelled fetch had gathered go to the next fetch, not to nsqd.
            await publish(server.tcp_address, topic, [b"d", b"e"])
            with anyio.move_on_after(0.5):
                await c.fetch(5)
            batch = await c.fetch(2, timeout=5)
            assert sorted(m.body for m in batch) == [b"d", b"e"]
            assert [m.attempts for m in batch] == [1, 1]
            for msg in batch:
                await msg.finish()
        assert c.stats().given_up == 0
        assert c.stats().finished == 5
        assert not [e for e in events if isinstance(e, GiveUp)]


async def test_drain_requeues_messages_never_handed_out_at_once(nsqd: EmbeddedNSQD) -> None:
    # The user never iterated: the 5 messages wait in the transport's inbox. drain() must
    # requeue them at once (REQ 0), not wait its whole timeout for answers that never come.
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(5)])
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5) as c:
        with anyio.fail_after(10):
            while c.stats().received < 5:
                await anyio.sleep(0.02)
        start = time.monotonic()
        await c.drain(timeout=5)
        assert time.monotonic() - start < 2
        assert c.stats().requeued == 5
    ch = await broker_channel(nsqd, topic, "ch")
    assert ch["in_flight_count"] == 0
    assert ch["depth"] == 5


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
async def test_drain_on_signals(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(3)])
    handled: list[bytes] = []
    sent = False

    async def handler(msg: Message) -> None:
        nonlocal sent
        if not sent:  # one signal (a second one would stop at once)
            sent = True
            os.kill(os.getpid(), signal.SIGHUP)
        await anyio.sleep(0.2)
        handled.append(msg.body)

    async with (
        Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=3) as c,
        drain_on_signals(c, signal.SIGHUP),
    ):
        await anyio.sleep(0.1)  # the receiver is installed
        with anyio.fail_after(10):
            await c.run(handler)  # returns once the signal's drain finished
    assert c.draining
    assert c.stats().finished == len(handled) >= 1


async def test_touch_requeue_delay_and_pause(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"a", b"b"])
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        with anyio.fail_after(10):
            msg = await c.__anext__()
            before = c._coord.deadline(msg.delivery)
            await anyio.sleep(0.05)
            assert await msg.touch()
            after = c._coord.deadline(msg.delivery)
            assert before is not None and after is not None and after > before
            c.set_max_in_flight(0)  # pause (RDY 0 goes out before the REQ): nothing arrives
            start = time.monotonic()
            assert await msg.requeue(0.5, backoff=False)
            assert not await msg.finish()  # answered once only
            assert not await msg.touch()
            await anyio.sleep(0.7)
            await wait_channel(
                nsqd,
                topic,
                "ch",
                lambda ch: ch["clients"][0]["ready_count"] == 0 and ch["in_flight_count"] == 0,
                what="RDY 0 and the REQ applied",
            )
            assert c.stats().received == 1  # paused: nothing else arrived
            c.set_max_in_flight(1)
            got = []
            async for m in c:
                got.append(m.body)
                await m.finish()
                if len(got) == 2:
                    break
            assert sorted(got) == [b"a", b"b"]
            assert time.monotonic() - start >= 0.5


async def test_nothing_left_behind(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    import threading

    threads_before = set(threading.enumerate())
    tasks_before: set[object] = set()
    if anyio_backend == "asyncio":
        import asyncio

        tasks_before = set(asyncio.all_tasks())
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"x"] * 5)
    with anyio.move_on_after(0.5):
        async with (
            Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5) as c,
            Producer(nsqd.tcp_address) as p,
        ):
            await p.publish(topic, b"y")
            async for msg in c:
                async with msg.keepalive():
                    await anyio.sleep(10)  # cancelled
    await anyio.sleep(0)
    if anyio_backend == "asyncio":
        import asyncio

        assert set(asyncio.all_tasks()) == tasks_before
    # The event loop's own resolver threads (getaddrinfo) may stay cached; nothing else may.
    new = [t.name for t in set(threading.enumerate()) - threads_before]
    assert all(name.startswith(("Trio thread", "asyncio_", "AnyIO worker")) for name in new), new


def _live_tasks(backend: str) -> set[object]:
    """Every task of the running event loop (asyncio or trio)."""
    if backend == "asyncio":
        import asyncio

        return set(asyncio.all_tasks())
    import trio

    tasks: set[object] = set()
    todo = [trio.lowlevel.current_root_task()]
    while todo:
        task = todo.pop()
        if task is None:
            continue
        tasks.add(task)
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return tasks


async def test_start_then_close_leaves_no_task(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    # The public start()/close() pair (no `async with`) must end the pump and every
    # connection task, and exit the consumer's task group.
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"a", b"b"])
    before = _live_tasks(anyio_backend)
    c = Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5)
    await c.start()
    with anyio.fail_after(10):
        msg = await c.__anext__()
        await msg.finish()
    await c.close()  # (not inside a cancel scope entered after start(): it exits the group)
    await anyio.sleep(0.05)
    assert _live_tasks(anyio_backend) == before
    assert c.draining
    with pytest.raises(LocalProtocolError):
        await c.start()
    await c.close()  # again: nothing to do
    ch = await broker_channel(nsqd, topic, "ch")
    assert ch["in_flight_count"] == 0, (ch, c.stats())
    assert ch["depth"] == 1  # the message never handed out was requeued


async def test_pull_consumer_cannot_be_iterated(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"a", b"b"])
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], pull=True, max_in_flight=10) as c:
        with anyio.fail_after(5):
            with pytest.raises(LocalProtocolError, match="fetch"):
                async for _msg in c:
                    pass
            with pytest.raises(LocalProtocolError, match="fetch"):
                await c.__anext__()
            batch = await c.fetch(2, timeout=5)  # still usable
        assert sorted(m.body for m in batch) == [b"a", b"b"]
        for msg in batch:
            await msg.finish()


async def test_pump_never_spins_on_a_stale_deadline(
    nsqd: EmbeddedNSQD, monkeypatch: pytest.MonkeyPatch
) -> None:
    # If the core keeps reporting a deadline in the past after handle_timer ran (a core bug
    # once: pull mode with no connection up), the transport must keep calling handle_timer at
    # a modest pace and re-reading the deadline, not spin at 100% CPU.
    from nsq_sansio.consumer import ConsumerCoordinator

    topic = fresh()
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], pull=True, max_in_flight=10) as c:
        coord = c._coord
        stale = time.monotonic() - 1.0
        calls = 0
        real_next = ConsumerCoordinator.next_deadline
        real_timer = ConsumerCoordinator.handle_timer

        def next_deadline(self: ConsumerCoordinator) -> float | None:
            real = real_next(self)
            if self is not coord:
                return real
            return stale if real is None else min(real, stale)

        def handle_timer(self: ConsumerCoordinator, now: float) -> None:
            nonlocal calls
            if self is coord:
                calls += 1
            real_timer(self, now)

        monkeypatch.setattr(ConsumerCoordinator, "next_deadline", next_deadline)
        monkeypatch.setattr(ConsumerCoordinator, "handle_timer", handle_timer)
        c._kick()
        cpu = time.process_time()
        await anyio.sleep(1.0)
        used = time.process_time() - cpu
        assert used < 0.4, f"{used:.2f}s CPU in 1s idle"
        assert 5 <= calls <= 100, calls
        # Still working meanwhile.
        await publish(nsqd.tcp_address, topic, [b"x"])
        with anyio.fail_after(5):
            batch = await c.fetch(1, timeout=5)
        assert [m.body for m in batch] == [b"x"]
        await batch[0].finish()
        monkeypatch.undo()


async def test_pull_consumer_idle_with_nsqd_down_uses_no_cpu(make_nsqd: NSQDFactory) -> None:
    # A held message and a waiting fetch while the only nsqd is down (reconnect far away):
    # the held message's deadline passes; the consumer must stay idle.
    server = make_nsqd(msg_timeout=1.0)
    topic = fresh()
    await publish(server.tcp_address, topic, [b"a", b"b"])
    async with Consumer(
        topic,
        "ch",
        nsqd=[server.tcp_address],
        pull=True,
        max_in_flight=10,
        reconnect_delay=20.0,
        max_reconnect_delay=20.0,
    ) as c:
        with anyio.fail_after(5):
            held = await c.fetch(1, timeout=5)
        assert len(held) == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.fetch, 5)  # waits, no timeout
            await anyio.sleep(0.2)
            await anyio.to_thread.run_sync(stop_nsqd, server)
            await anyio.sleep(0.2)
            cpu = time.process_time()
            await anyio.sleep(2.0)  # the held message's deadline (1 s) passes meanwhile
            used = time.process_time() - cpu
            tg.cancel_scope.cancel()
        assert used < 0.5, f"{used:.2f}s CPU in 2s idle"

"""anyio consumer behaviour against the embedded broker: flow control, failures, shutdown."""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

import anyio
import pytest

from nsq_sansio.consumer import Disconnected, GiveUp, TakenBack
from nsq_sansio.errors import LocalProtocolError
from transports.anyio import Consumer, KeepaliveExpired, Message, Producer, drain_on_signals
from transports.embedded import EmbeddedNSQD

from .conftest import NSQDFactory, channel_stats, stop_nsqd, wait_channel

pytestmark = pytest.mark.anyio


def fresh(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:12]}"


async def publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with Producer(address) as p:
        await p.multi_publish(topic, bodies)


async def test_max_in_flight_is_respected_on_the_broker(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(40)])
    peak_broker = 0
    active = 0
    peak_handlers = 0
    done = 0

    # msg_timeout well past anything a loaded machine does to this test: a message nsqd
    # took back (and redelivered) once made finished 39 of 40
    async with Consumer(
        topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=5, msg_timeout=300.0
    ) as c:

        async def handler(msg: Message) -> None:
            nonlocal active, peak_handlers, done
            active += 1
            peak_handlers = max(peak_handlers, active)
            await anyio.sleep(0.05)
            active -= 1
            done += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(c.run, handler)  # concurrency defaults to max_in_flight
            while done < 40:
                ch = await channel_stats(nsqd, topic, "ch")
                peak_broker = max(peak_broker, ch.get("in_flight_count", 0))
                await anyio.sleep(0.01)
            await c.drain()  # run() returns
    assert 1 <= peak_broker <= 5
    assert peak_handlers <= 5
    assert c.stats().finished == 40


async def test_backoff_after_failures(nsqd: EmbeddedNSQD) -> None:
    # The broker must see the whole cycle: RDY 0 for the window, then RDY 1 (one message in
    # flight) while testing, then full RDY once the test message succeeded.
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"fail"])
    async with Consumer(
        topic,
        "ch",
        nsqd=[nsqd.tcp_address],
        max_in_flight=5,
        backoff_multiplier=1.0,  # a 2 s window: long enough to see RDY 0 on a loaded broker
        max_backoff_duration=2.0,
        default_requeue_delay=0,
    ) as c:
        with anyio.fail_after(15):
            msg = await c.__anext__()
            await msg.requeue()  # a failure: backoff starts
            stats = c.stats()
            assert stats.backoff_level == 1 and stats.backoff_phase == "waiting"
            assert stats.rdy == 0
            await wait_channel(
                nsqd, topic, "ch", lambda ch: ch["clients"][0]["ready_count"] == 0, what="RDY 0"
            )
            # During the window nothing is sent, though messages wait on the broker. (The REQ
            # goes out before RDY 0, so nsqd may have sent the requeued one straight back.)
            await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(10)])
            await anyio.sleep(0.3)
            ch = await channel_stats(nsqd, topic, "ch")
            assert ch["in_flight_count"] <= 1
            assert ch["in_flight_count"] + ch["depth"] == 11
            await anyio.sleep(0.3)
            assert (await channel_stats(nsqd, topic, "ch"))["in_flight_count"] == ch[
                "in_flight_count"
            ]
            assert c.stats().backoff_phase == "waiting"
            while c.stats().backoff_phase == "waiting":
                await anyio.sleep(0.01)
            assert c.stats().backoff_phase == "testing"
            assert c.stats().rdy == 1
            await wait_channel(
                nsqd,
                topic,
                "ch",
                lambda ch: ch["clients"][0]["ready_count"] == 1,
                what="RDY 1 while testing",
            )
            msg = await c.__anext__()
            assert c.stats().backoff_phase == "testing"
            ch = await channel_stats(nsqd, topic, "ch")
            assert ch["in_flight_count"] == 1  # the single test message
            assert ch["clients"][0]["ready_count"] == 1
            await msg.finish()  # the test succeeds: back to normal, full RDY
            stats = c.stats()
            assert stats.backoff_phase == "normal" and stats.backoff_level == 0
            assert stats.rdy == 5
            await wait_channel(
                nsqd,
                topic,
                "ch",
                lambda ch: ch["clients"][0]["ready_count"] == 5,
                what="full RDY after the test",
            )
            for _ in range(10):
                await (await c.__anext__()).finish()
        assert c.stats().finished == 11


async def test_max_attempts_gives_up(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    events: list[object] = []
    await publish(nsqd.tcp_address, topic, [b"poison"])
    attempts: list[int] = []
    async with Consumer(
        topic,
        "ch",
        nsqd=[nsqd.tcp_address],
        max_attempts=3,
        backoff_enabled=False,
        on_event=events.append,
    ) as c:
        with anyio.fail_after(10):
            async for msg in c:
                attempts.append(msg.attempts)
                await msg.requeue(0)
                if len(attempts) == 3:
                    break
            while not any(isinstance(e, GiveUp) for e in events):
                await anyio.sleep(0.01)
    assert attempts == [1, 2, 3]
    give_up = next(e for e in events if isinstance(e, GiveUp))
    assert give_up.message.body == b"poison" and give_up.message.attempts == 4
    assert c.stats().given_up == 1
    await wait_channel(
        nsqd,
        topic,
        "ch",
        lambda ch: ch["depth"] == 0 and ch["deferred_count"] == 0 and ch["in_flight_count"] == 0,
        what="the given-up message FIN'd",
    )


async def test_drain_with_messages_in_flight(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    bodies = [b"%d" % i for i in range(30)]
    await publish(nsqd.tcp_address, topic, bodies)
    handled: list[bytes] = []
    started = anyio.Event()
    in_handler = 0

    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=10) as c:

        async def handler(msg: Message) -> None:
            nonlocal in_handler
            in_handler += 1
            if in_handler >= 3:
                started.set()
            await anyio.sleep(0.3)
            handled.append(msg.body)

        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: c.run(handler, concurrency=3))
            await started.wait()
            await c.drain(timeout=5)  # run() returns after this
    # The three handlers running at drain time finished and FIN'd their messages.
    assert len(handled) >= 3
    assert c.stats().finished == len(handled)
    # Everything else went back to nsqd: another consumer gets exactly the rest.
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=30) as c2:
        rest: list[bytes] = []
        with anyio.fail_after(10):
            async for msg in c2:
                rest.append(msg.body)
                await msg.finish()
                if len(rest) == 30 - len(handled):
                    break
        await anyio.sleep(0.2)
        assert c2.stats().received == 30 - len(handled)  # nothing redelivered
    assert sorted(handled + rest) == sorted(bodies)


async def test_broker_killed_and_restarted(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd()
    address = server.tcp_address
    topic = fresh()
    events: list[object] = []
    await publish(address, topic, [b"before"])
    async with Consumer(
        topic,
        "ch",
        nsqd=[address],
        reconnect_delay=0.05,
        max_reconnect_delay=0.2,
        on_event=events.append,
    ) as c:
        with anyio.fail_after(15):
            msg = await c.__anext__()
            assert msg.body == b"before"
            await msg.finish()
            await anyio.sleep(0.1)
            stop_nsqd(server)
            while not any(isinstance(e, Disconnected) for e in events):
                await anyio.sleep(0.01)
            server = make_nsqd(tcp_address=address)
            await publish(address, topic, [b"after"])
            msg = await c.__anext__()
            assert msg.body == b"after"
            assert await msg.finish()
        assert c.stats().reconnects >= 1


async def test_slow_handler_heartbeats_still_answered(make_nsqd: NSQDFactory) -> None:
    # nsqd drops a client after two unanswered heartbeats; here one is due every second
    # while the handler blocks its task for 3 s.
    server = make_nsqd()
    topic = fresh()
    await publish(server.tcp_address, topic, [b"slow"])
    events: list[object] = []
    async with Consumer(
        topic,
        "ch",
        nsqd=[server.tcp_address],
        heartbeat_interval=1.0,
        msg_timeout=10.0,
        on_event=events.append,
    ) as c:
        with anyio.fail_after(10):
            async for msg in c:
                await anyio.sleep(3.2)
                assert await msg.finish()
                break
        stats = c.stats()
    assert stats.connection_errors == 0 and stats.reconnects == 0
    assert not [e for e in events if isinstance(e, TakenBack)]
    assert not [e for e in events if isinstance(e, Disconnected) and e.error is not None]


async def test_keepalive_keeps_a_long_job_alive(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd()
    topic = fresh()
    await publish(server.tcp_address, topic, [b"long job"])
    events: list[object] = []
    async with Consumer(
        topic, "ch", nsqd=[server.tcp_address], msg_timeout=1.0, on_event=events.append
    ) as c:
        with anyio.fail_after(10):
            msg = await c.__anext__()
            async with msg.keepalive():
                await anyio.sleep(3.0)  # 3x msg_timeout
            assert await msg.finish()
            await anyio.sleep(0.2)
        assert c.stats().received == 1  # never redelivered
    assert not [e for e in events if isinstance(e, (TakenBack, KeepaliveExpired))]
    ch = await channel_stats(server, topic, "ch")
    assert ch["timeout_count"] == 0 and ch["requeue_count"] == 0


async def test_keepalive_warns_at_max_msg_timeout(make_nsqd: NSQDFactory) -> None:
    server = make_nsqd(msg_timeout=1.0, max_msg_timeout=2.0)
    topic = fresh()
    await publish(server.tcp_address, topic, [b"too long"])
    events: list[object] = []
    async with Consumer(topic, "ch", nsqd=[server.tcp_address], on_event=events.append) as c:
        with anyio.fail_after(10):
            msg = await c.__anext__()
            async with msg.keepalive():
                while not any(isinstance(e, KeepaliveExpired) for e in events):
                    await anyio.sleep(0.05)
                expired = next(e for e in events if isinstance(e, KeepaliveExpired))
                assert expired.message_id == msg.id
                assert msg.keepalive_expiring
                # The warning comes before nsqd takes the message back.
                assert expired.deadline > time.monotonic()
                assert not msg.taken_back


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
            ch = await channel_stats(nsqd, topic, "ch")
            if not ch.get("clients") and ch.get("in_flight_count") == 0:
                break
            await anyio.sleep(0.02)
    assert ch["depth"] + ch["deferred_count"] == 5


async def test_fetch_batch_expiry_and_no_wait(nsqd: EmbeddedNSQD) -> None:
    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"%d" % i for i in range(5)])
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], pull=True, max_in_flight=50) as c:
        with anyio.fail_after(10):
            batch = await c.fetch(3, timeout=5)
            assert len(batch) == 3
            for msg in batch:
                await msg.finish()
            start = anyio.current_time()
            batch = await c.fetch(10, timeout=0.5)  # only 2 left: returns them at expiry
            assert len(batch) == 2
            assert anyio.current_time() - start >= 0.4
            for msg in batch:
                await msg.finish()
            assert await c.fetch(5, no_wait=True) == []
            # The broker never pushed more than was asked: once the FINs are applied, nothing
            # is in flight and nothing more was sent.
            await wait_channel(
                nsqd, topic, "ch", lambda ch: ch["in_flight_count"] == 0, what="FINs applied"
            )
            assert c.stats().finished == 5 and c.stats().received == 5


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
    ch = await channel_stats(nsqd, topic, "ch")
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


async def test_lookupd_mode_reconnects_to_a_rediscovered_nsqd(
    make_nsqd: NSQDFactory, nsqlookupd: object
) -> None:
    lookupd_tcp = nsqlookupd.tcp_address  # type: ignore[attr-defined]
    lookupd_http = nsqlookupd.http_url  # type: ignore[attr-defined]
    server = make_nsqd(lookupd_tcp_addresses=[lookupd_tcp], lookupd_ping_interval=0.2)
    address = server.tcp_address
    topic = fresh()
    events: list[object] = []
    await publish(address, topic, [b"before"])
    async with Consumer(
        topic, "ch", lookupd=[lookupd_http], lookupd_poll_interval=0.2, on_event=events.append
    ) as c:
        with anyio.fail_after(15):
            msg = await c.__anext__()
            assert msg.body == b"before" and await msg.finish()
            stop_nsqd(server)
            while not any(isinstance(e, Disconnected) for e in events):
                await anyio.sleep(0.01)
            make_nsqd(
                tcp_address=address,
                lookupd_tcp_addresses=[lookupd_tcp],
                lookupd_ping_interval=0.2,
            )
            await publish(address, topic, [b"after"])
            msg = await c.__anext__()
            assert msg.body == b"after" and await msg.finish()
        stats = c.stats()
    assert stats.reconnects >= 1 and stats.connection_errors >= 1


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
    ch = await channel_stats(nsqd, topic, "ch")
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


async def test_bad_user_input_raises_in_the_caller(nsqd: EmbeddedNSQD) -> None:
    # Bad arguments raise a clear error where they are passed; the message stays answerable
    # and the consumer's tasks keep running.
    from nsq_sansio.errors import ConfigError

    topic = fresh()
    await publish(nsqd.tcp_address, topic, [b"1", b"2", b"3"])
    async with Consumer(topic, "ch", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        with anyio.fail_after(10):
            msg = await c.__anext__()
            for delay in (float("inf"), float("nan"), -1, "1", True):
                with pytest.raises(LocalProtocolError, match="requeue delay"):
                    await msg.requeue(delay=delay)  # type: ignore[arg-type]
                with pytest.raises(LocalProtocolError, match="requeue delay"):
                    msg.requeue_nowait(delay=delay)  # type: ignore[arg-type]
            assert not msg.answered
            assert c._coord.deadline(msg.delivery) is not None  # still ours
            for bad in (-1, "10", 1.5):
                with pytest.raises(ConfigError, match="max_in_flight"):
                    c.set_max_in_flight(bad)  # type: ignore[arg-type]
            assert c.config.max_in_flight == 1
            for timeout in (-1, float("inf"), float("nan"), "5"):
                with pytest.raises(LocalProtocolError, match="drain timeout"):
                    await c.drain(timeout=timeout)  # type: ignore[arg-type]
                with pytest.raises(LocalProtocolError, match="drain timeout"):
                    async with drain_on_signals(c, timeout=timeout):  # type: ignore[arg-type]
                        pass
            assert not c.draining
            assert await msg.requeue(delay=1e10, backoff=False)  # clamped to max_req_timeout
            # Everything still runs: the rest arrives and is answered.
            bodies = []
            for _ in range(2):
                msg = await c.__anext__()
                bodies.append(msg.body)
                assert await msg.finish()
        assert sorted(bodies) == [b"2", b"3"]
        await wait_channel(
            nsqd,
            topic,
            "ch",
            lambda ch: ch["in_flight_count"] == 0 and ch["deferred_count"] == 1,
            what="both FINs and the clamped REQ applied",
        )

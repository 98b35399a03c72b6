"""Bad user input raises a clear error in the caller on every runtime, changes nothing, and
never stops the tasks or the IO thread that own the connections: the same message stays
answerable, the consumer goes on delivering. Real loopback sockets, embedded nsqd.

What only the blocking API has (``get(timeout=)``, a publish's own ``timeout=``, ``flush``) and
what reaches into its IO thread is in tests/sync/test_bad_input.py.
"""

from __future__ import annotations

import math
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any

import pytest
from support.brokers import embedded_topic_count, running_nsqd, unique
from support.runtimes import ConsumerDriver, Runtime, broker_channel, wait_channel

from nsq_sansio.errors import ConfigError, LocalProtocolError
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio

NOT_SECONDS: tuple[Any, ...] = (math.inf, math.nan, -math.inf, -1, -0.5, "1", "5", True, object())


async def publish(runtime: Runtime, server: EmbeddedNSQD, topic: str, count: int) -> None:
    async with runtime.producer(server.tcp_address) as p:
        await p.multi_publish(topic, [b"%d" % i for i in range(count)])


async def take(c: ConsumerDriver) -> Any:
    msg = await c.get(timeout=5)
    assert msg is not None, "no message delivered"
    return msg


def assert_alive(c: ConsumerDriver) -> None:
    """Nothing failed in what serves the consumer's connections (blocking: its IO thread)."""
    io = getattr(c.client, "_io", None)
    if io is not None:
        assert io.loop.failure is None, f"IO thread crashed: {io.loop.failure!r}"
        assert io.loop.thread is not None and io.loop.thread.is_alive()
    else:
        assert c.client._failure is None, c.client._failure


async def entered(manager: Any) -> None:
    """Enter (and leave) ``manager``, a context manager or an async one."""
    if isinstance(manager, AbstractAsyncContextManager) or hasattr(manager, "__aenter__"):
        async with manager:
            pass
    else:
        assert isinstance(manager, AbstractContextManager) or hasattr(manager, "__enter__")
        with manager:
            pass


async def test_bad_requeue_delay_raises_in_caller_and_message_stays_answerable(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 3)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        msg = await take(c)
        for delay in NOT_SECONDS:
            with pytest.raises(LocalProtocolError, match="requeue delay"):
                await runtime.call(msg.requeue, delay=delay)
            if hasattr(msg, "requeue_nowait"):  # async only
                with pytest.raises(LocalProtocolError, match="requeue delay"):
                    msg.requeue_nowait(delay=delay)
        assert not msg.answered
        assert c.stats().in_flight == 1  # still ours: nothing was sent
        assert_alive(c)
        ch = await broker_channel(nsqd, topic, "c")
        assert ch["requeue_count"] == 0 and ch["in_flight_count"] == 1
        assert await c.finish(msg)  # a later valid answer works
        # A huge (finite) delay is clamped to nsqd's max_req_timeout, not refused.
        second = await take(c)
        assert await runtime.call(second.requeue, delay=1e10, backoff=False)
        third = await take(c)
        assert await c.finish(third)
        ch = await wait_channel(
            nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0, what="FINs and REQ applied"
        )
        assert ch["deferred_count"] == 1 and ch["requeue_count"] == 1
        assert_alive(c)


async def test_bad_max_in_flight_raises_in_caller_and_changes_nothing(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 4)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        first = await take(c)
        not_counts: tuple[Any, ...] = (-1, "10", 1.5, True, None, 2**31)
        for bad in not_counts:
            with pytest.raises(ConfigError, match="max_in_flight"):
                await runtime.call(c.client.set_max_in_flight, bad)
        assert c.client.config.max_in_flight == 1
        assert c.stats().max_in_flight == 1
        assert_alive(c)
        await runtime.call(c.client.set_max_in_flight, 3)  # applied before it returns
        assert c.client.config.max_in_flight == 3
        assert c.stats().max_in_flight == 3
        held = [first] + [await take(c) for _ in range(2)]  # 3 in flight at once now
        for m in held:
            assert await c.finish(m)
        held.append(await take(c))
        assert await c.finish(held[-1])
        assert sorted(m.body for m in held) == [b"0", b"1", b"2", b"3"]
        await wait_channel(nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0)


async def test_bad_drain_and_close_timeouts_raise_in_caller(
    runtime: Runtime, nsqd: EmbeddedNSQD
) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 2)
    for timeout in NOT_SECONDS:
        with pytest.raises(ConfigError, match="close_timeout"):
            runtime.module.Consumer(topic, "c", nsqd=[nsqd.tcp_address], close_timeout=timeout)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        msg = await take(c)
        for timeout in NOT_SECONDS:
            with pytest.raises(LocalProtocolError, match="drain timeout"):
                await runtime.call(c.client.drain, timeout=timeout)
            with pytest.raises(LocalProtocolError, match="drain timeout"):
                c.client.start_drain(timeout)
            with pytest.raises(LocalProtocolError, match="drain timeout"):  # not at signal time
                await entered(runtime.module.drain_on_signals(c.client, timeout=timeout))
        assert not c.client.draining
        assert_alive(c)
        assert await c.finish(msg)
        assert await c.finish(await take(c))
        await runtime.call(c.client.drain, timeout=5)  # the real drain still works
        assert c.client.draining
    ch = await wait_channel(nsqd, topic, "c", lambda ch: not ch["clients"], what="closed")
    assert ch["in_flight_count"] == 0 and ch["depth"] == 0


async def test_bad_run_arguments_raise_in_caller(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 1)
    async with runtime.consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=1) as c:
        not_counts: tuple[Any, ...] = (0, -1, 1.5, "2", True)
        for concurrency in not_counts:
            with pytest.raises(LocalProtocolError, match="concurrency"):
                await runtime.call(c.client.run, lambda m: None, concurrency=concurrency)
        with pytest.raises(LocalProtocolError, match="handler"):
            await runtime.call(c.client.run, "not callable", concurrency=1)
        assert_alive(c)
        assert await c.finish(await take(c))


async def test_bad_fetch_arguments_raise_in_caller(runtime: Runtime, nsqd: EmbeddedNSQD) -> None:
    topic = unique()
    await publish(runtime, nsqd, topic, 2)
    bad: list[tuple[tuple[Any, ...], dict[str, Any], str]] = [
        ((0,), {}, "fetch batch"),
        ((-1,), {"timeout": 1.0}, "fetch batch"),
        ((1.5,), {}, "fetch batch"),
        (("3",), {}, "fetch batch"),
        ((True,), {}, "fetch batch"),
        ((1,), {"timeout": -1}, "fetch (timeout|expires)"),
        ((1,), {"timeout": 0}, "fetch (timeout|expires)"),
        ((1,), {"timeout": math.inf}, "fetch (timeout|expires)"),
        ((1,), {"timeout": math.nan}, "fetch (timeout|expires)"),
        ((1,), {"timeout": "5"}, "fetch (timeout|expires)"),
    ]
    async with runtime.consumer(
        topic, "c", nsqd=[nsqd.tcp_address], pull=True, max_in_flight=10
    ) as c:
        for args, kwargs, what in bad:
            with pytest.raises(LocalProtocolError, match=what):
                await runtime.call(c.client.fetch, *args, **kwargs)
        assert_alive(c)
        got: list[Any] = []
        while len(got) < 2:
            got += await c.fetch(2 - len(got), timeout=5)
        for m in got:
            assert await c.finish(m)
        await wait_channel(nsqd, topic, "c", lambda ch: ch["in_flight_count"] == 0)
    for args, kwargs, what in bad:  # also once closed (not a silent [])
        with pytest.raises(LocalProtocolError, match=what):
            await runtime.call(c.client.fetch, *args, **kwargs)


async def test_bad_producer_arguments_raise_in_caller_and_publish_nothing(
    runtime: Runtime,
) -> None:
    topic = unique()
    with running_nsqd() as (server, runner):
        async with runtime.producer(server.tcp_address) as p:
            for delay in NOT_SECONDS:
                with pytest.raises(LocalProtocolError, match="DPUB delay"):
                    await p.deferred_publish(topic, b"x", delay)
                if hasattr(p.client, "deferred_publish_async"):  # blocking only
                    with pytest.raises(LocalProtocolError, match="DPUB delay"):
                        p.client.deferred_publish_async(topic, b"x", delay)
            for timeout in NOT_SECONDS:
                with pytest.raises(LocalProtocolError, match="close timeout"):
                    await runtime.call(p.client.close, timeout)
            assert p.stats().pending == 0
            assert embedded_topic_count(runner, topic) == 0  # nothing bad was sent
            await p.publish(topic, b"ok")  # still open and working
        assert embedded_topic_count(runner, topic) == 1
        not_counts: tuple[Any, ...] = (0, -1, 1.5, "8", True)
        for bad_pending in not_counts:
            with pytest.raises(ConfigError, match="max_pending"):
                runtime.module.Producer(server.tcp_address, max_pending=bad_pending)
        for bad_timeout in (0, *NOT_SECONDS):
            with pytest.raises(ConfigError, match="Producer timeout"):
                runtime.module.Producer(server.tcp_address, timeout=bad_timeout)

"""An exception raised in user code reaches the caller as itself, on asyncio and on trio: from
the body of ``async with Consumer/Producer/HTTPProducer``, from ``async for``, from a handler of
``run()`` that raises a BaseException. A failure of the library's own tasks surfaces as one
exception, not a group. Cancellation still ends everything, and nothing is left behind: no
task, no socket.
"""

from __future__ import annotations

import os
import traceback
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

import transports.anyio
import transports.trio
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


class Oops(Exception):
    """The user's own exception."""


class Halt(BaseException):
    """The user's own BaseException (as KeyboardInterrupt or SystemExit are)."""


def fresh() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


def _raise_oops() -> None:
    raise Oops("from the user's code")


def _assert_plain(exc: BaseException) -> None:
    """``exc`` is the user's Oops itself (not a group) and its traceback still reaches the
    line that raised it."""
    assert type(exc) is Oops, repr(exc)
    frames = traceback.extract_tb(exc.__traceback__)
    assert frames[-1].name == "_raise_oops", frames


def _module(anyio_backend: str) -> Any:
    """The package a user of this event loop imports."""
    return transports.trio if anyio_backend == "trio" else transports.anyio


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@asynccontextmanager
async def _nothing_left_behind() -> AsyncIterator[None]:
    """No task of ours and no socket of ours outlives the block (the broker closes its side of
    a connection a little later, on its own thread: waited for, boundedly)."""
    tasks_before = len(anyio.get_running_tasks())
    fds_before = _open_fds()
    yield
    assert len(anyio.get_running_tasks()) == tasks_before
    with anyio.move_on_after(5):
        while _open_fds() - fds_before:
            await anyio.sleep(0.02)
    assert not _open_fds() - fds_before, "sockets left open"


async def _publish(address: str, topic: str, bodies: list[bytes]) -> None:
    async with transports.anyio.Producer(address) as p:
        await p.multi_publish(topic, bodies)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_raised_in_async_with_consumer(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    module = _module(anyio_backend)
    async with _nothing_left_behind():
        with pytest.raises(Oops) as raised:
            async with module.Consumer(fresh(), "c", nsqd=[nsqd.tcp_address]):
                await anyio.sleep(0.05)  # its tasks are running (connecting)
                _raise_oops()
    _assert_plain(raised.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_raised_in_async_for(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    module = _module(anyio_backend)
    topic = fresh()
    await _publish(nsqd.tcp_address, topic, [b"a", b"b"])
    async with _nothing_left_behind():
        with pytest.raises(Oops) as raised:
            async with module.Consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=2) as c:
                async for msg in c:
                    assert msg.body == b"a"
                    _raise_oops()
    _assert_plain(raised.value)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_raised_in_async_with_producer(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    module = _module(anyio_backend)
    async with _nothing_left_behind():
        with pytest.raises(Oops) as raised:
            async with module.Producer(nsqd.tcp_address) as p:
                await p.publish(fresh(), b"x")  # its connection and timer tasks run
                _raise_oops()
        with pytest.raises(Oops) as raised_http:
            async with module.HTTPProducer(nsqd.http_url) as hp:
                await hp.publish(fresh(), b"x")
                _raise_oops()
    _assert_plain(raised.value)
    _assert_plain(raised_http.value)


async def test_a_handler_base_exception_comes_out_of_run_as_itself(
    nsqd: EmbeddedNSQD, anyio_backend: str
) -> None:
    """A handler that raises an Exception has its message requeued; one that raises a
    BaseException (KeyboardInterrupt, SystemExit, one of the user's) ends run() with it, not
    with a group."""
    module = _module(anyio_backend)
    topic = fresh()
    await _publish(nsqd.tcp_address, topic, [b"a"])

    async def handler(msg: Any) -> None:
        raise Halt

    with pytest.raises(Halt) as raised:
        async with module.Consumer(topic, "c", nsqd=[nsqd.tcp_address]) as c:
            with anyio.fail_after(10):
                await c.run(handler, concurrency=4)
    assert type(raised.value) is Halt


async def test_a_crashed_task_of_ours_is_raised_once_as_itself(
    nsqd: EmbeddedNSQD, anyio_backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A bug in one of the consumer's tasks (here: the core's timer made to fail, in the task
    that runs the timers) does not cancel the user's code: the consumer fails, and the next
    wait raises that error, plain; leaving the block does not raise it again."""
    module = _module(anyio_backend)
    topic = fresh()
    await _publish(nsqd.tcp_address, topic, [b"a"])
    async with module.Consumer(topic, "c", nsqd=[nsqd.tcp_address]) as c:

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug in a task")

        c._coord.handle_timer = broken
        c._coord.next_deadline = lambda: 0.0  # a timer is due: the timer task calls it
        c._kick()
        with pytest.raises(RuntimeError, match="a bug in a task") as raised:
            with anyio.fail_after(10):
                async for _ in c:
                    pass
    assert type(raised.value) is RuntimeError
    assert "crashed" in caplog.text


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_cancellation_still_ends_everything(nsqd: EmbeddedNSQD, anyio_backend: str) -> None:
    module = _module(anyio_backend)
    topic = fresh()
    await _publish(nsqd.tcp_address, topic, [b"a", b"b", b"c"])
    held: list[Any] = []
    async with _nothing_left_behind():
        with anyio.move_on_after(1.0) as scope:
            async with (
                module.Producer(nsqd.tcp_address) as p,
                module.Consumer(topic, "c", nsqd=[nsqd.tcp_address], max_in_flight=3) as c,
            ):
                await p.publish(topic, b"d")
                async for msg in c:
                    held.append(msg)  # never answered: requeued on the way out
        assert scope.cancelled_caught
    assert len(held) == 3  # max_in_flight


@pytest.mark.parametrize(
    "make",
    [
        lambda m, n: m.Consumer(fresh(), "c", nsqd=[n.tcp_address]),
        lambda m, n: m.Producer(n.tcp_address),
    ],
    ids=["Consumer", "Producer"],
)
async def test_cancelled_from_outside_while_the_block_raises(
    nsqd: EmbeddedNSQD, anyio_backend: str, make: Callable[[Any, EmbeddedNSQD], Any]
) -> None:
    """An outer cancel scope that fires while the block is inside the client: the
    cancellation is caught by its scope, nothing escapes as a group."""
    module = _module(anyio_backend)
    with anyio.move_on_after(0.2) as scope:
        async with make(module, nsqd):
            await anyio.sleep_forever()
    assert scope.cancelled_caught

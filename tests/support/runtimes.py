"""One adapter per client runtime, so a client scenario is written once and runs on asyncio,
trio and the blocking transport with the same assertions.

A scenario is an ``async def`` test taking the ``runtime`` fixture (``tests/clients``): on
asyncio and trio it drives ``transports.anyio`` in the test's own event loop; on ``blocking``
the test runs on asyncio and each call into ``transports.sync`` runs on a worker thread
(``anyio.to_thread``), as any blocking call from async code would. Only what differs between
the two APIs is adapted: a deadline per call, publishes in flight together, the handler of
``run()``; the clients' own ``stats()`` and messages are passed through.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.to_thread

import transports.anyio
import transports.sync
from support.brokers import http_channel_stats

RUNTIMES = ["asyncio", "trio", "blocking"]

#: A publish to start among others: ``("publish", (topic, body))`` or
#: ``("multi_publish", (topic, [bodies]))``.
Call = tuple[str, tuple[Any, ...]]


#: What a publish observer saw: (topic, messages, seconds, error) per request.
Observed = list[tuple[str, int, float, "BaseException | None"]]


def recorder() -> tuple[Observed, Callable[[str, int, float, BaseException | None], None]]:
    """A ``publish_observer`` that keeps what it saw (called from any thread)."""
    seen: Observed = []
    lock = threading.Lock()

    def observe(topic: str, count: int, seconds: float, error: BaseException | None) -> None:
        with lock:
            seen.append((topic, count, seconds, error))

    return seen, observe


async def _in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs))


class Runtime:
    """``asyncio``, ``trio`` or ``blocking``: how a scenario makes and drives the clients."""

    def __init__(self, name: str) -> None:
        assert name in RUNTIMES, name
        self.name = name
        self.blocking = name == "blocking"
        #: The client module's classes, for what is checked before anything runs.
        self.module: Any = transports.sync if self.blocking else transports.anyio

    def __repr__(self) -> str:
        return f"Runtime({self.name!r})"

    @property
    def anyio_backend(self) -> str:
        """The event loop the scenario itself runs on."""
        return "asyncio" if self.blocking else self.name

    async def call(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A client's or a message's own method, the same on every runtime: on a worker thread
        (blocking), else called and awaited when it returns an awaitable."""
        if self.blocking:
            return await _in_thread(func, *args, **kwargs)
        result = func(*args, **kwargs)
        if inspect.isawaitable(result):
            return await result
        return result

    @asynccontextmanager
    async def keepalive(self, message: Any) -> AsyncIterator[Any]:
        """``with message.keepalive()`` / ``async with``: TOUCHed for the block's length."""
        if not self.blocking:
            async with message.keepalive() as kept:
                yield kept
            return
        manager = message.keepalive()
        kept = await _in_thread(manager.__enter__)
        try:
            yield kept
        finally:
            with anyio.CancelScope(shield=True):
                await _in_thread(manager.__exit__, None, None, None)

    @asynccontextmanager
    async def consumer(self, *args: Any, **options: Any) -> AsyncIterator[ConsumerDriver]:
        """``with Consumer(*args, **options)`` / ``async with``; the driver stays usable after
        the block (a later ask of a failed consumer)."""
        if not self.blocking:
            async with transports.anyio.Consumer(*args, **options) as client:
                yield AnyioConsumer(client)
            return
        blocking = transports.sync.Consumer(*args, **options)
        async with _entered(blocking):
            yield BlockingConsumer(blocking)

    @asynccontextmanager
    async def producer(self, *args: Any, **options: Any) -> AsyncIterator[ProducerDriver]:
        if not self.blocking:
            async with transports.anyio.Producer(*args, **options) as client:
                yield AnyioProducer(client)
            return
        blocking = transports.sync.Producer(*args, **options)
        async with _entered(blocking):
            yield BlockingProducer(blocking)

    @asynccontextmanager
    async def http_producer(self, *args: Any, **options: Any) -> AsyncIterator[HTTPDriver]:
        """``HTTPProducer(*args, **options)``, closed after the block."""
        if not self.blocking:
            async with transports.anyio.HTTPProducer(*args, **options) as client:
                yield HTTPDriver(client, blocking=False)
            return
        blocking = transports.sync.HTTPProducer(*args, **options)
        async with _entered(blocking):
            yield HTTPDriver(blocking, blocking=True)


@asynccontextmanager
async def _entered(client: Any) -> AsyncIterator[None]:
    """A blocking client's ``with`` block, its enter and exit on a worker thread (shielded:
    a cancelled test still closes it, and an exception from ``__exit__`` propagates)."""
    with anyio.CancelScope(shield=True):
        await _in_thread(client.__enter__)
    try:
        yield
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            if not await _in_thread(client.__exit__, type(exc), exc, exc.__traceback__):
                raise
    else:
        with anyio.CancelScope(shield=True):
            await _in_thread(client.__exit__, None, None, None)


class ConsumerDriver:
    """The consumer calls a scenario makes, the same on every runtime."""

    client: Any

    def stats(self) -> Any:
        return self.client.stats()

    async def get(self, timeout: float) -> Any:
        """The next message, or None after ``timeout`` seconds."""
        raise NotImplementedError

    def messages(self) -> AsyncIterator[Any]:
        """The consumer's own iteration (``async for`` / ``for``)."""
        raise NotImplementedError

    async def finish(self, message: Any) -> bool:
        raise NotImplementedError

    async def run(self, handler: Callable[[Any], object], workers: int) -> None:
        """``run()`` with ``workers`` handlers at once; ``handler`` is a plain function (what
        it returns is what ``run()`` sees: FIN for None or True, REQ for False)."""
        raise NotImplementedError

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        raise NotImplementedError

    async def bodies(self, count: int, timeout: float) -> list[bytes]:
        """The bodies of the next ``count`` messages, in delivery order, each finished;
        TimeoutError when they do not all come within ``timeout`` seconds."""
        got: list[bytes] = []
        with anyio.fail_after(timeout):
            async for msg in self.messages():
                got.append(msg.body)
                await self.finish(msg)
                if len(got) == count:
                    break
        return got


class AnyioConsumer(ConsumerDriver):
    def __init__(self, client: transports.anyio.Consumer) -> None:
        self.client = client

    async def get(self, timeout: float) -> Any:
        with anyio.move_on_after(timeout):
            return await self.client.__anext__()
        return None

    def messages(self) -> AsyncIterator[Any]:
        return self.client

    async def finish(self, message: Any) -> bool:
        return bool(await message.finish())

    async def run(self, handler: Callable[[Any], object], workers: int) -> None:
        @functools.wraps(handler)  # the handler's name is what run() reports
        async def call(message: Any) -> object:
            return handler(message)

        await self.client.run(call, concurrency=workers)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        return await self.client.fetch(batch, timeout=timeout)


class BlockingConsumer(ConsumerDriver):
    def __init__(self, client: transports.sync.Consumer) -> None:
        self.client = client

    async def get(self, timeout: float) -> Any:
        return await _in_thread(self.client.get, timeout=timeout)

    def messages(self) -> AsyncIterator[Any]:
        return _ThreadIterator(iter(self.client))

    async def finish(self, message: Any) -> bool:
        return bool(await _in_thread(message.finish))

    async def run(self, handler: Callable[[Any], object], workers: int) -> None:
        await _in_thread(self.client.run, handler, concurrency=workers)

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        return list(await _in_thread(self.client.fetch, batch, timeout=timeout))


class _ThreadIterator:
    """A blocking iterator stepped on a worker thread."""

    def __init__(self, iterator: Iterator[Any]) -> None:
        self._iterator = iterator

    def __aiter__(self) -> _ThreadIterator:
        return self

    async def __anext__(self) -> Any:
        done = object()
        item = await _in_thread(next, self._iterator, done)
        if item is done:
            raise StopAsyncIteration
        return item


class ProducerDriver:
    """The producer calls a scenario makes, the same on every runtime. ``timeout`` is the
    call's own deadline (TimeoutError after it); None leaves the producer's."""

    client: Any

    def stats(self) -> Any:
        return self.client.stats()

    async def publish(self, topic: str, body: bytes, *, timeout: float | None = None) -> None:
        await self._call("publish", (topic, body), timeout)

    async def multi_publish(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> None:
        await self._call("multi_publish", (topic, bodies), timeout)

    async def deferred_publish(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> None:
        await self._call("deferred_publish", (topic, body, delay), timeout)

    async def _call(self, method: str, args: tuple[Any, ...], timeout: float | None) -> None:
        raise NotImplementedError

    async def concurrently(
        self, calls: Sequence[Call], timeout: float
    ) -> list[BaseException | None]:
        """Start every call at once (tasks / ``*_async`` futures) and return each one's
        outcome in order: None, or what it raised. All must end within ``timeout``."""
        raise NotImplementedError


class AnyioProducer(ProducerDriver):
    def __init__(self, client: transports.anyio.Producer) -> None:
        self.client = client

    async def _call(self, method: str, args: tuple[Any, ...], timeout: float | None) -> None:
        with anyio.fail_after(timeout):
            await getattr(self.client, method)(*args)

    async def concurrently(
        self, calls: Sequence[Call], timeout: float
    ) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = [None] * len(calls)

        async def one(index: int, method: str, args: tuple[Any, ...]) -> None:
            try:
                await getattr(self.client, method)(*args)
            except Exception as exc:
                outcomes[index] = exc

        with anyio.fail_after(timeout):
            async with anyio.create_task_group() as tg:
                for index, (method, args) in enumerate(calls):
                    tg.start_soon(one, index, method, args)
        return outcomes


class BlockingProducer(ProducerDriver):
    def __init__(self, client: transports.sync.Producer) -> None:
        self.client = client

    async def _call(self, method: str, args: tuple[Any, ...], timeout: float | None) -> None:
        await _in_thread(getattr(self.client, method), *args, timeout=timeout)

    async def concurrently(
        self, calls: Sequence[Call], timeout: float
    ) -> list[BaseException | None]:
        # started together on one thread (a burst, as tasks started in one loop pass are): a
        # ``*_async`` call waits there while no slot is free
        # (a call that fails while starting, e.g. no slot within its deadline, is its outcome)
        def start_all() -> list[Any]:
            started: list[Any] = []
            for method, args in calls:
                try:
                    started.append(getattr(self.client, f"{method}_async")(*args))
                except Exception as exc:
                    started.append(exc)
            return started

        futures = await _in_thread(start_all)
        deadline = time.monotonic() + timeout
        outcomes: list[BaseException | None] = []
        for future in futures:
            if isinstance(future, BaseException):
                outcomes.append(future)
                continue
            left = max(0.0, deadline - time.monotonic())
            outcomes.append(await _in_thread(future.exception, left))
        return outcomes


class HTTPDriver:
    """The HTTP producer's calls, the same on every runtime (the blocking ones on a thread)."""

    def __init__(self, client: Any, *, blocking: bool) -> None:
        self.client = client
        self._blocking = blocking

    async def _call(self, method: str, *args: Any) -> None:
        if self._blocking:
            await _in_thread(getattr(self.client, method), *args)
        else:
            await getattr(self.client, method)(*args)

    async def publish(self, topic: str, body: bytes) -> None:
        await self._call("publish", topic, body)

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        await self._call("multi_publish", topic, bodies)

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        await self._call("deferred_publish", topic, body, delay)


async def wait_until(predicate: Callable[[], Any], *, timeout: float = 10.0, what: str = "") -> Any:
    """Poll ``predicate`` (cheap, no IO) until it is truthy; returns its value. AssertionError
    after ``timeout`` seconds: the awaited state never came."""
    with anyio.move_on_after(timeout):
        while True:
            value = predicate()
            if value:
                return value
            await anyio.sleep(0.01)
    raise AssertionError(f"not reached in {timeout}s: {what or predicate}")


async def broker_channel(server: Any, topic: str, channel: str) -> dict[str, Any]:
    """The broker's own view of a channel (``/stats?format=json`` of an embedded nsqd or a
    real one), {} when it does not exist."""
    found = await anyio.to_thread.run_sync(http_channel_stats, server.http_url, topic, channel)
    return found or {}


async def wait_channel(
    server: Any,
    topic: str,
    channel: str,
    check: Callable[[dict[str, Any]], bool],
    *,
    timeout: float = 10.0,
    what: str = "",
) -> dict[str, Any]:
    """Poll the broker's view of a channel until ``check(stats)`` holds; returns those stats.

    A client's FIN/REQ/RDY is applied by the broker a little after the client sent it: read
    broker state through this, never once right after an action. A ``check`` that raises
    KeyError/IndexError counts as not yet."""
    last: dict[str, Any] = {}
    with anyio.move_on_after(timeout):
        while True:
            last = await broker_channel(server, topic, channel)
            try:
                if check(last):
                    return last
            except (KeyError, IndexError):
                pass
            await anyio.sleep(0.02)
    raise AssertionError(f"broker state not reached in {timeout}s ({what or check}): {last}")

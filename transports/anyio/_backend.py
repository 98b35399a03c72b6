"""The anyio producer's fast paths, one interface over the two event loops it runs on.

anyio's portable primitives cost a cancel scope or an :class:`anyio.Event` per wait; a publish
waits once per call, so the producer parks on what the running loop does cheapest instead: an
asyncio future, or trio's ``wait_task_rescheduled``. On asyncio the loop also watches a plain
TCP socket itself (``add_reader``: no reader task) and runs a flush at the end of the loop pass
(``call_soon``); on trio a reader task waits for the socket to be readable
(``wait_readable``), and a socket is announced before it closes (``notify_closing``).

:func:`current_backend` picks the running loop's :class:`Backend`; nothing else in the
producer imports asyncio or trio. Each capability a loop lacks is None.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import sniffio

__all__ = ["Backend", "Parked", "current_backend"]


class Parked(Protocol):
    """A wait a task parks on (the producer's ``Call``): ``waker`` is what :meth:`Backend.wake`
    needs (None: not parked), ``orphan`` is set when the parked task was cancelled (its answer
    still comes, and nobody takes it)."""

    waker: Any
    orphan: bool


class Backend:
    """What the producer uses of the running loop. Plain attributes, read once per use:
    ``call_soon(fn, *args)`` runs ``fn`` at the end of this loop pass, ``add_reader(fd, fn,
    *args)`` / ``remove_reader(fd)`` let the loop read a socket (asyncio; None on trio);
    ``wait_readable(sock)`` waits until ``sock`` is readable and ``notify_closing(sock)``
    wakes its waiters before it closes (trio; None on asyncio)."""

    __slots__ = ("add_reader", "call_soon", "notify_closing", "remove_reader", "wait_readable")

    call_soon: Callable[..., object] | None
    add_reader: Callable[..., None] | None
    remove_reader: Callable[[int], object] | None
    wait_readable: Callable[[socket.socket], Awaitable[None]] | None
    notify_closing: Callable[[socket.socket], None] | None

    def park(self, parked: Parked) -> Awaitable[BaseException | None]:
        """Park the current task on ``parked`` (sets its ``waker``); await what this returns:
        the error :meth:`wake` gives (None: success)."""
        raise NotImplementedError

    def unpark(self, parked: Parked) -> None:
        """The parked task was cancelled or failed while waiting: no wake-up is owed to it;
        an answer that comes later is an orphan's."""
        raise NotImplementedError

    def wake(self, waker: Any, error: BaseException | None) -> None:
        """Wake the task parked with ``waker``, handing it ``error``."""
        raise NotImplementedError


class _Asyncio(Backend):
    __slots__ = ("_create_future",)

    def __init__(self) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        self._create_future = loop.create_future
        self.call_soon = loop.call_soon
        self.add_reader = loop.add_reader
        self.remove_reader = loop.remove_reader
        self.wait_readable = None
        self.notify_closing = None

    def park(self, parked: Parked) -> Awaitable[BaseException | None]:
        future = self._create_future()
        parked.waker = future
        return future

    def unpark(self, parked: Parked) -> None:
        future = parked.waker
        parked.waker = None
        if future is None or future.cancelled() or not future.done():
            parked.orphan = True  # its answer still comes, matched to it

    def wake(self, waker: Any, error: BaseException | None) -> None:
        if not waker.done():
            waker.set_result(error)


class _Trio(Backend):
    __slots__ = ("_current_task", "_reschedule", "_succeeded", "_value", "_wait_rescheduled")

    def __init__(self) -> None:
        import outcome
        import trio

        lowlevel = trio.lowlevel
        self._current_task = lowlevel.current_task
        self._wait_rescheduled = lowlevel.wait_task_rescheduled
        self._reschedule = lowlevel.reschedule
        self._succeeded = lowlevel.Abort.SUCCEEDED
        self._value = outcome.Value
        self.call_soon = None
        self.add_reader = None
        self.remove_reader = None
        self.wait_readable = lowlevel.wait_readable
        self.notify_closing = lowlevel.notify_closing

    def park(self, parked: Parked) -> Awaitable[BaseException | None]:
        parked.waker = self._current_task()
        succeeded = self._succeeded

        def abort(_: object) -> Any:
            # trio: the parked task is cancelled. Its answer still comes, matched to it.
            parked.waker = None
            parked.orphan = True
            return succeeded

        return self._wait_rescheduled(abort)

    def unpark(self, parked: Parked) -> None:
        parked.waker = None  # abort() said it is an orphan, if it was cancelled

    def wake(self, waker: Any, error: BaseException | None) -> None:
        self._reschedule(waker, self._value(error))


def current_backend() -> Backend:
    """The running loop's :class:`Backend` (call it inside that loop)."""
    if sniffio.current_async_library() == "trio":
        return _Trio()
    return _Asyncio()

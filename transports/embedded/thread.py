"""Run an embedded server (any anyio async context manager) on a background thread.

For blocking code and pytest fixtures::

    with ServerThread(EmbeddedNSQD()) as nsqd:
        ...                     # nsqd.tcp_address etc. are ready here

The event loop lives in the thread (asyncio by default, or trio); :meth:`call` runs a
coroutine function or a plain function on that loop and returns its result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from types import TracebackType
from typing import Any, Generic, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

__all__ = ["ServerThread"]

T = TypeVar("T")
R = TypeVar("R")


class ServerThread(Generic[T]):
    """Start ``server`` (an async context manager) in a thread; stop it on exit."""

    def __init__(self, server: T, *, backend: str = "asyncio") -> None:
        if not hasattr(server, "__aenter__"):
            raise TypeError(f"{type(server).__name__} is not an async context manager")
        self.server = server
        self.backend = backend
        self._stack: ExitStack | None = None
        self._portal: BlockingPortal | None = None

    @property
    def portal(self) -> BlockingPortal:
        """The blocking portal into the server's event loop (to call its async methods from this
        thread)."""
        if self._portal is None:
            raise RuntimeError("ServerThread is not running")
        return self._portal

    def start(self) -> T:
        """Start the loop thread and enter the server; returns the running server."""
        stack = ExitStack()
        try:
            portal = stack.enter_context(start_blocking_portal(self.backend))
            cm: AbstractContextManager[Any] = portal.wrap_async_context_manager(
                self.server  # type: ignore[arg-type]
            )
            stack.enter_context(cm)
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._portal = portal
        return self.server

    def stop(self) -> None:
        """Leave the server's context (closing its sockets) and stop the loop thread."""
        stack, self._stack, self._portal = self._stack, None, None
        if stack is not None:
            stack.close()

    def call(self, func: Callable[..., Awaitable[R] | R], *args: Any) -> R:
        """Run ``func(*args)`` on the server's loop (sync or async) and return its result."""
        return self.portal.call(func, *args)  # type: ignore[return-value]

    def __enter__(self) -> T:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

"""What a blocking publish returns: :class:`PublishFuture` (or, when no nsqd took it,
raises :class:`~nsq_sansio.errors.NoNSQDAvailable`, the class every runtime raises).

A light ``concurrent.futures.Future`` look-alike set once by the producer's IO thread (or by a
caller reading its own answer); a lock to wait on is only made when someone waits.
"""

from __future__ import annotations

import logging
import threading
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable
from typing import Any

from nsq_sansio.errors import NoNSQDAvailable
from transports._common.arguments import check_seconds
from transports._common.publishing import PublishObserver

__all__ = ["FUTURE_LOCK", "NoNSQDAvailable", "PublishFuture", "PublishObserver"]

_log = logging.getLogger("nsq_sansio.sync.producer")


#: Guards the waiter lock and the callbacks of every future (held for a few lines only).
FUTURE_LOCK = threading.Lock()


class PublishFuture:
    """The answer to one publish: a light ``concurrent.futures.Future`` look-alike
    (``done()``, ``result(timeout)``, ``exception(timeout)``, ``add_done_callback(fn)``).

    Set once, by the producer's IO thread; a waiter lock is only made when someone waits for
    it before it is done, so the pipelined path costs a few attribute writes.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_waiter")

    def __init__(self) -> None:
        self._done = False
        self._error: BaseException | None = None
        #: A held lock, released when the future is done (cheaper than a threading.Event).
        self._waiter: Any = None
        self._callbacks: list[Callable[[PublishFuture], object]] | None = None

    def done(self) -> bool:
        """Whether nsqd answered (or the publish failed); never blocks."""
        return self._done

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        waiter = self._waiter
        if waiter is None:
            with FUTURE_LOCK:
                waiter = self._waiter
                if waiter is None:
                    waiter = _allocate_lock()
                    waiter.acquire()
                    self._waiter = waiter
        # The IO thread writes _done before it reads _waiter: one of us sees the other.
        if self._done:
            return
        if not waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError(f"no answer from nsqd within {timeout}s")
        waiter.release()  # let any other waiter through too

    def result(self, timeout: float | None = None) -> None:
        """None once nsqd said OK; raises nsqd's error, NoNSQDAvailable or TimeoutError."""
        if timeout is not None:
            _check_timeout(timeout)
        self._wait(timeout)
        if self._error is not None:
            raise self._error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The publish's error (None when it succeeded), waiting up to ``timeout`` for it."""
        if timeout is not None:
            _check_timeout(timeout)
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[PublishFuture], object]) -> None:
        """Call ``fn(future)`` when done (at once if it is; else on the IO thread)."""
        with FUTURE_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _set(self, error: BaseException | None) -> None:
        self._error = error
        if self._callbacks is None:
            self._done = True
            callbacks = None
        else:
            with FUTURE_LOCK:
                self._done = True
                callbacks = self._callbacks
        waiter = self._waiter  # read after _done is written: see _wait()
        if waiter is not None:
            waiter.release()
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    _log.exception("publish future callback failed")


def _check_timeout(timeout: object) -> None:
    """The seconds ``flush()`` and ``close()`` take: a bad one is LocalProtocolError whether
    the publish is done or not (not a ValueError, TypeError or OverflowError from a lock)."""
    check_seconds("PublishFuture timeout", timeout)

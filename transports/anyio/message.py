"""The anyio consumer's ``Message``: the shared :class:`~transports._common.message.MessageBase`
plus the answer calls of this runtime.

``finish``/``requeue`` go straight to the coordinator (no ``await`` on the socket: the FIN is
written with the next batch by the connection's writer task), ``touch`` too, and
``keepalive()`` runs a task that TOUCHes until the block ends. What the message needs of its
consumer is spelled out by :class:`MessageOwner`, so this module does not import the consumer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from nsq_sansio.consumer import ConsumerCoordinator, Deliver
from transports._common import ConnectionLogger
from transports._common.arguments import check_seconds
from transports._common.message import KeepaliveExpired, MessageBase

__all__ = ["Message", "MessageOwner"]


class _AnswerCounts(Protocol):
    """A connection's counters of answers (``_Conn``)."""

    finished: int
    requeued: int


class MessageOwner(Protocol):
    """What a :class:`Message` uses of the consumer that delivered it."""

    @property
    def _coord(self) -> ConsumerCoordinator: ...

    @property
    def _conns(self) -> Mapping[int, _AnswerCounts]: ...

    def _kick(self) -> None: ...

    def _spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

    def _log_for(self, address: object) -> ConnectionLogger: ...

    def _emit(self, event: object) -> None: ...


class Message(MessageBase):
    """A message handed to user code, and the way to answer it.

    What it is (``id``, ``body``, ``attempts``, ``address``...) is :class:`MessageBase`'s.
    ``finish()`` / ``requeue(delay=None, backoff=True)`` answer it once (later calls return
    False); ``touch()`` extends its timeout; ``keepalive()`` touches while a block runs.
    Answers return False when the message was no longer ours (its connection closed, or nsqd
    had already taken it back); that is also reported as a ``TakenBack`` event.
    """

    __slots__ = ()

    _consumer: MessageOwner

    if TYPE_CHECKING:  # MessageBase.__init__ at run time (no extra call per message)

        def __init__(self, consumer: MessageOwner, delivery: Deliver) -> None: ...

    @property
    def deadline(self) -> float | None:
        """When nsqd times the message out (monotonic seconds), None if no longer ours."""
        return self._consumer._coord.deadline(self._delivery)

    def finish_nowait(self) -> bool:
        """FIN without awaiting (it is queued and written with the next batch)."""
        if self.answered:
            return False
        consumer = self._consumer
        delivery = self._delivery
        ok = consumer._coord.finish(delivery, monotonic())
        self.answered = True
        consumer._kick()
        if ok:
            conn = consumer._conns.get(delivery.conn_id)
            if conn is not None:
                conn.finished += 1
        return ok

    async def finish(self) -> bool:
        """FIN: the message was handled."""
        return self.finish_nowait()

    def requeue_nowait(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """REQ without awaiting; see :meth:`requeue`. A bad ``delay`` raises
        LocalProtocolError and leaves the message unanswered (it can still be answered)."""
        if delay is not None:
            check_seconds("requeue delay", delay)
        if self.answered:
            return False
        consumer = self._consumer
        delivery = self._delivery
        ok = consumer._coord.requeue(delivery, monotonic(), delay, backoff=backoff)
        self.answered = True
        consumer._kick()
        if ok:
            conn = consumer._conns.get(delivery.conn_id)
            if conn is not None:
                conn.requeued += 1
        return ok

    async def requeue(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """REQ: deliver again after ``delay`` seconds (default: the config's delay times the
        attempts, capped). ``backoff=False`` does not slow the consumer down."""
        return self.requeue_nowait(delay, backoff=backoff)

    async def touch(self) -> float | None:
        """TOUCH: reset the message's timeout; returns the new deadline (None if gone)."""
        if self.answered:
            return None
        consumer = self._consumer
        deadline = consumer._coord.touch(self._delivery, monotonic())
        consumer._kick()
        return deadline

    @asynccontextmanager
    async def keepalive(self, fraction: float = 0.5) -> AsyncIterator[Message]:
        """TOUCH every ``fraction`` of the message timeout while the block runs (seeds/002).

        TOUCH cannot extend a message past the server's ``max_msg_timeout``; when that limit is
        reached a :class:`KeepaliveExpired` event is reported (and logged) before nsqd takes
        the message back. Nothing is touched outside such a block.
        """
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, int | float)
            or not 0 < fraction < 1
        ):
            raise ValueError(f"keepalive fraction must be between 0 and 1, got {fraction!r}")
        scope = anyio.CancelScope()
        self._consumer._spawn(self._keepalive, scope, fraction)
        try:
            yield self
        finally:
            scope.cancel()

    async def _keepalive(self, scope: anyio.CancelScope, fraction: float) -> None:
        consumer = self._consumer
        coord = consumer._coord
        delivery = self._delivery
        timeout = max(delivery.deadline - delivery.received_at, 0.01)
        with scope:
            while not self.answered:
                deadline = coord.deadline(delivery)
                limit = coord.max_deadline(delivery)
                if deadline is None or limit is None:
                    return
                # Touch when `fraction` of the timeout is left... of the window since the last
                # TOUCH: i.e. at deadline - (1 - fraction) * timeout.
                await anyio.sleep(max(deadline - (1 - fraction) * timeout - monotonic(), 0))
                if self.answered:
                    return
                new = coord.touch(delivery, monotonic())
                consumer._kick()
                if new is None:
                    return
                if new >= limit:
                    event = KeepaliveExpired(delivery.id, delivery.address, new)
                    consumer._log_for(delivery.address).warning(
                        "message %s: keepalive reached nsqd's max_msg_timeout; it will be taken "
                        "back in %.1fs unless answered",
                        delivery.id.decode(),
                        new - monotonic(),
                    )
                    consumer._emit(event)
                    return

"""The anyio consumer's ``Message``: the shared :class:`~transports._common.message.MessageBase`
plus the answer calls of this runtime.

``finish``/``requeue`` go straight to the coordinator (no ``await`` on the socket: the FIN is
written with the next batch by the connection's writer task), ``touch`` too, and
``keepalive()`` runs a task that TOUCHes when the core says (half-way to each deadline) until
the block ends. What the message needs of its
consumer is spelled out by :class:`MessageOwner`, so this module does not import the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from time import monotonic
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from nsq_sansio.consumer import ConsumerCoordinator, Deliver
from transports._common.arguments import check_seconds
from transports._common.message import DeliveryHook, KeepaliveExpired, MessageBase
from transports._common.reports import log_keepalive_expired

__all__ = ["Message", "MessageOwner"]


class MessageOwner(Protocol):
    """What a :class:`Message` uses of the consumer that delivered it."""

    topic: str
    channel: str
    _telemetry: DeliveryHook | None

    @property
    def _coord(self) -> ConsumerCoordinator: ...

    @property
    def _logger(self) -> logging.Logger: ...

    def _kick(self) -> None: ...

    def _spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None: ...

    def _emit(self, event: object) -> None: ...


class Message(MessageBase):
    """A message handed to user code, and the way to answer it.

    What it is (``id``, ``body``, ``attempts``, ``nsqd_address``...) is :class:`MessageBase`'s.
    Answer once with :meth:`finish` or :meth:`requeue`: they return True when this call
    answered it, False when it had been answered already (``*_nowait``: the same without
    awaiting). :meth:`touch` asks for more time and :meth:`keepalive` touches for you while a
    long job runs. An answer that comes too late (the connection closed, or nsqd timed the
    message out) is never raised: :attr:`taken_back` turns True and a ``TakenBack`` event is
    reported.
    """

    # Set only when they turn True (read with a default): no extra write per message.
    __slots__ = ("_expiring", "_late")

    _consumer: MessageOwner

    if TYPE_CHECKING:  # MessageBase.__init__ at run time (no extra call per message)

        def __init__(self, consumer: MessageOwner, delivery: Deliver) -> None: ...

    def finish_nowait(self) -> bool:
        """FIN without awaiting (it is queued and written with the next batch)."""
        if self.answered:
            return False
        self.answered = True
        consumer = self._consumer
        if not consumer._coord.finish(self._delivery, monotonic()):
            self._late = True
        consumer._kick()
        if consumer._telemetry is not None:
            consumer._telemetry.settled(self, "finish")
        return True

    async def finish(self) -> bool:
        """``FIN``: the message was handled and is forgotten by nsqd."""
        return self.finish_nowait()

    def requeue_nowait(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """REQ without awaiting; see :meth:`requeue`."""
        if delay is not None:
            check_seconds("requeue delay", delay)
        if self.answered:
            return False
        consumer = self._consumer
        if delay is not None:  # above nsqd's max_req_timeout: raised before anything changes
            consumer._coord.check_requeue_delay(self._delivery, delay)
        self.answered = True
        if not consumer._coord.requeue(self._delivery, monotonic(), delay, backoff=backoff):
            self._late = True
        consumer._kick()
        if consumer._telemetry is not None:
            consumer._telemetry.settled(self, "requeue")
        return True

    async def requeue(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """``REQ``: deliver it again after ``delay`` seconds (default: the config's delay
        times the attempts, capped). ``backoff=False`` keeps this failure from slowing the
        consumer down. A bad ``delay`` (negative, inf, nan, not a number) raises
        LocalProtocolError, one above nsqd's ``max_req_timeout`` when it is known
        (``Config.max_req_timeout``) DelayOutOfRange; either leaves the message unanswered."""
        return self.requeue_nowait(delay, backoff=backoff)

    async def touch(self) -> bool:
        """``TOUCH``: reset nsqd's timeout for this message (up to its max_msg_timeout).
        False when the message was answered already (nothing is sent)."""
        if self.answered:
            return False
        consumer = self._consumer
        if consumer._coord.touch(self._delivery, monotonic()) is None:
            self._late = True
        consumer._kick()
        return True

    @asynccontextmanager
    async def keepalive(self) -> AsyncIterator[Message]:
        """TOUCH the message half-way to each deadline while the block runs.

        nsqd never extends a message past its ``max_msg_timeout``: once TOUCH cannot extend
        it any more, a warning is logged, a :class:`KeepaliveExpired` event reported and
        :attr:`keepalive_expiring` turns True. Nothing is touched outside such a block."""
        if self.answered or self.taken_back:
            # nothing of ours to keep alive (answered, or taken back: by a close too): the block
            # runs and nothing is touched, as with any answer that comes too late
            yield self
            return
        scope = anyio.CancelScope()
        self._consumer._spawn(self._keepalive, scope)
        try:
            yield self
        finally:
            scope.cancel()

    @property
    def taken_back(self) -> bool:
        """nsqd no longer holds this copy for us (it timed out and was delivered again, the
        connection was lost, or an answer came too late): answering it now does nothing,
        another consumer may get the message."""
        late: bool = getattr(self, "_late", False)
        if late or self.answered:
            return late
        return self._consumer._coord.deadline(self._delivery) is None

    @property
    def keepalive_expiring(self) -> bool:
        """``keepalive()`` reached nsqd's max_msg_timeout: nsqd will take the message back."""
        return getattr(self, "_expiring", False)

    async def _keepalive(self, scope: anyio.CancelScope) -> None:
        consumer = self._consumer
        coord = consumer._coord
        delivery = self._delivery
        with scope:
            while not self.answered:
                limit = coord.max_deadline(delivery)
                if limit is None:
                    return  # no longer ours
                touch_at = coord.next_touch(delivery)
                if touch_at is None:
                    # TOUCH cannot extend it any more: say so now, while there is time.
                    if not getattr(self, "_expiring", False):
                        self._expiring = True
                        event = KeepaliveExpired(delivery.id, delivery.address, limit)
                        log_keepalive_expired(
                            consumer._logger,
                            event,
                            monotonic(),
                            topic=consumer.topic,
                            channel=consumer.channel,
                        )
                        consumer._emit(event)
                    return
                await anyio.sleep(max(touch_at - monotonic(), 0))
                if self.answered:
                    return
                if coord.touch(delivery, monotonic()) is None:
                    return
                consumer._kick()

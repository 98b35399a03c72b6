"""The blocking consumer's ``Message``: the shared
:class:`~transports._common.message.MessageBase` plus the answer calls of this runtime.

The answers are thread-safe and never block: each is appended to the consumer IO side's
``posted`` deque (a bare message is a FIN, the hot path; anything else an ``(op, message,
argument)`` tuple with one of the ``OP_*`` codes below) and the IO thread is woken to carry it
out (once the consumer drained or closed and the IO thread is gone, the answering thread
carries it out itself). What a message needs of its consumer is spelled out by
:class:`MessageOwner`, so this module does not import the consumer.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from nsq_sansio.consumer import ConsumerCoordinator, Deliver
from transports._common.arguments import check_seconds
from transports._common.message import DeliveryHook, MessageBase

from ._loop import IOLoop

__all__ = [
    "OP_FIN",
    "OP_KEEPALIVE_OFF",
    "OP_KEEPALIVE_ON",
    "OP_REQ",
    "OP_TOUCH",
    "Message",
    "MessageOwner",
]

#: What an ``(op, message, argument)`` answer asks of the IO thread.
OP_FIN = 0
OP_REQ = 1
OP_TOUCH = 2
OP_KEEPALIVE_ON = 3
OP_KEEPALIVE_OFF = 4


class MessageOwner(Protocol):
    """What a :class:`Message` uses of the consumer's IO side that delivered it."""

    topic: str
    channel: str
    posted: deque[Message | tuple[int, Message, Any]]
    loop: IOLoop
    coordinator: ConsumerCoordinator
    telemetry: DeliveryHook | None
    stopped: bool

    def post(self, op: int, message: Message, arg: Any) -> None: ...

    def answer_stopped(self) -> None: ...


class Message(MessageBase):
    """A message handed to user code, and the way to answer it.

    What it is (``id``, ``body``, ``timestamp``, ``attempts``, ``nsqd_address``...) is
    :class:`MessageBase`'s. Answer once with :meth:`finish` or :meth:`requeue`: they return
    True when this call answered it, False when it had been answered already. :meth:`touch`
    asks for more time and :meth:`keepalive` touches for you while a long job runs. Answers
    are thread-safe and never block: they are handed to the IO thread. An answer that comes
    too late (the connection closed, or nsqd timed the message out) is never raised: it sets
    :attr:`taken_back` (once the IO thread has carried it out) and is reported as a
    ``TakenBack`` event. After the consumer drained or closed (no IO thread left) an answer
    is carried out, and reported, in the thread that gives it.
    """

    __slots__ = ("_expiring", "_taken_back")

    _consumer: MessageOwner

    def __init__(self, consumer: MessageOwner, delivery: Deliver) -> None:
        self._consumer = consumer
        self._delivery = delivery
        self._trace = None
        self.answered = False
        self._expiring = False
        self._taken_back = False

    def finish(self) -> bool:
        """``FIN``: the message was handled and is forgotten by nsqd."""
        if self.answered:
            return False
        self.answered = True
        consumer = self._consumer
        consumer.posted.append(self)  # a bare message is a FIN (the hot path: no tuple)
        loop = consumer.loop
        if not loop._wake_pending:
            loop.wake()
        if consumer.stopped:  # no IO thread any more: carried out (and reported) here
            consumer.answer_stopped()
        if consumer.telemetry is not None:
            consumer.telemetry.settled(self, "finish")
        return True

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """``REQ``: deliver it again after ``delay`` seconds (default: the config's delay
        times the attempts, capped). ``backoff=False`` keeps this failure from slowing the
        consumer down. A bad ``delay`` (negative, inf, nan, not a number) raises
        LocalProtocolError, one above nsqd's ``max_req_timeout`` when it is known
        (``Config.max_req_timeout``) DelayOutOfRange; either leaves the message unanswered."""
        if delay is not None:
            check_seconds("requeue delay", delay)
        if self.answered:
            return False
        if delay is not None:  # above nsqd's max_req_timeout: raised here, in the caller
            self._consumer.coordinator.check_requeue_delay(self._delivery, delay)
        self.answered = True
        consumer = self._consumer
        consumer.post(OP_REQ, self, (delay, backoff))
        if consumer.telemetry is not None:
            consumer.telemetry.settled(self, "requeue")
        return True

    def touch(self) -> bool:
        """``TOUCH``: reset nsqd's timeout for this message (up to its max_msg_timeout).
        False when the message was answered already (nothing is sent)."""
        if self.answered:
            return False
        self._consumer.post(OP_TOUCH, self, None)
        return True

    @contextlib.contextmanager
    def keepalive(self) -> Iterator[Message]:
        """TOUCH the message half-way to each deadline while the block runs.

        nsqd never extends a message past its ``max_msg_timeout``: once TOUCH cannot extend
        it any more, a warning is logged, a :class:`KeepaliveExpired` event reported and
        :attr:`keepalive_expiring` turns True. Nothing is touched outside such a block."""
        self._consumer.post(OP_KEEPALIVE_ON, self, None)
        try:
            yield self
        finally:
            self._consumer.post(OP_KEEPALIVE_OFF, self, None)

    @property
    def taken_back(self) -> bool:
        """nsqd no longer holds this copy for us (it timed out and was delivered again, the
        connection was lost, or an answer came too late): answering it now does nothing,
        another consumer may get the message. Set by the IO thread, shortly after the fact (by
        the answering thread once the consumer drained or closed)."""
        return self._taken_back

    @property
    def keepalive_expiring(self) -> bool:
        """``keepalive()`` reached nsqd's max_msg_timeout: nsqd will take the message back."""
        return self._expiring

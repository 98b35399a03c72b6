"""The blocking consumer's ``Message``: the shared
:class:`~transports._common.message.MessageBase` plus the answer calls of this runtime.

The answers are thread-safe and never block: each is appended to the consumer's ``_posted``
deque (a bare message is a FIN, the hot path; anything else an ``(op, message, argument)``
tuple with one of the ``OP_*`` codes below) and the IO thread is woken to carry it out. What
a message needs of its consumer is spelled out by :class:`MessageOwner`, so this module does
not import the consumer.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

from nsq_sansio.consumer import Deliver
from transports._common.arguments import check_seconds
from transports._common.message import MessageBase

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
    """What a :class:`Message` uses of the consumer that delivered it."""

    @property
    def _posted(self) -> deque[Message | tuple[int, Message, Any]]: ...

    @property
    def _loop(self) -> IOLoop: ...

    def _post(self, op: int, message: Message, arg: Any) -> None: ...


class Message(MessageBase):
    """A message handed to user code, and the way to answer it.

    What it is (``id``, ``body``, ``timestamp``, ``attempts``, ``nsqd_address``...) is
    :class:`MessageBase`'s. Answer once with :meth:`finish` or :meth:`requeue` (they return
    True when this call answered it, False when it had been answered already); :meth:`touch`
    asks for more time and :meth:`keepalive` touches for you while a long job runs. Answers
    are thread-safe and never block: they are handed to the IO thread. An answer that comes
    too late (the connection closed, or nsqd timed the message out) sets :attr:`taken_back`
    and is reported as a
    ``TakenBack`` event, never raised.
    """

    __slots__ = ("_keepalive_warned", "taken_back")

    _consumer: MessageOwner

    def __init__(self, consumer: MessageOwner, delivery: Deliver) -> None:
        self._consumer = consumer
        self._delivery = delivery
        self.answered = False
        self._keepalive_warned = False
        #: Set when nsqd no longer holds this message for us (timed out, connection lost...):
        #: an answer sent now is useless, another consumer may get the message.
        self.taken_back = False

    def finish(self) -> bool:
        """``FIN``: the message was handled and is forgotten by nsqd."""
        if self.answered:
            return False
        self.answered = True
        consumer = self._consumer
        consumer._posted.append(self)  # a bare message is a FIN (the hot path: no tuple)
        loop = consumer._loop
        if not loop._wake_pending:
            loop.wake()
        return True

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """``REQ``: try again after ``delay`` seconds (default: grows with attempts).
        ``backoff=False`` keeps this failure from slowing the consumer down. A delay above
        nsqd's max_req_timeout is clamped to it. A bad ``delay`` (negative, inf, nan, not a
        number) raises LocalProtocolError here and leaves the message unanswered."""
        if delay is not None:
            check_seconds("requeue delay", delay)
        if self.answered:
            return False
        self.answered = True
        self._consumer._post(OP_REQ, self, (delay, backoff))
        return True

    def finish_nowait(self) -> bool:
        """Same as :meth:`finish` (which never blocks here); the async transport's name."""
        return self.finish()

    def requeue_nowait(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """Same as :meth:`requeue`; the async transport's name."""
        return self.requeue(delay, backoff=backoff)

    def touch(self) -> bool:
        """``TOUCH``: reset nsqd's timeout for this message (up to its max_msg_timeout).
        False when the message was answered already (nothing is sent)."""
        if self.answered:
            return False
        self._consumer._post(OP_TOUCH, self, None)
        return True

    @contextlib.contextmanager
    def keepalive(self) -> Iterator[Message]:
        """Keep the message alive while the block runs: TOUCH half-way to each deadline.

        nsqd never extends a message past its ``max_msg_timeout``; shortly before that, a
        warning is logged and :attr:`keepalive_expiring` turns True (nothing is touched
        automatically outside this block)."""
        self._consumer._post(OP_KEEPALIVE_ON, self, None)
        try:
            yield self
        finally:
            self._consumer._post(OP_KEEPALIVE_OFF, self, None)

    @property
    def keepalive_expiring(self) -> bool:
        """keepalive() reached the server's max_msg_timeout: the message will be taken back."""
        return self._keepalive_warned

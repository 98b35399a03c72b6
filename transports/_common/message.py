"""What a delivered message is, whatever the runtime: :class:`MessageBase` and
:class:`KeepaliveExpired`.

The anyio and the blocking ``Message`` are one shape: the read-only views of the core's
:class:`~nsq_sansio.consumer.Deliver` (``id``, ``body``, ``timestamp``, ``attempts``, where it
came from, when it arrived) and the ``answered`` flag are defined here once, and each runtime
adds only its answer calls (``finish``/``requeue``/``touch``/``keepalive``, awaited or not).
The properties read one slot and one tuple field, as fast as when each class had its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import filterfalse, repeat
from operator import attrgetter, is_
from typing import Any, Protocol, TypeVar

from nsq_sansio.consumer import Deliver
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.errors import LocalProtocolError

__all__ = ["DeliveryHook", "KeepaliveExpired", "MessageBase", "unanswered_of"]

M = TypeVar("M", bound="MessageBase")
_answered = attrgetter("answered")
_owner = attrgetter("_consumer")


@dataclass(frozen=True, slots=True)
class KeepaliveExpired:
    """``msg.keepalive()`` reached the server's ``max_msg_timeout``: TOUCH cannot extend the
    message any further and nsqd will take it back (give it to another consumer) at
    ``deadline`` (monotonic seconds). Reported to ``on_event`` and logged as a warning."""

    message_id: bytes
    address: NSQDAddress
    deadline: float


class DeliveryHook(Protocol):
    """What a consumer calls when telemetry is on (``transports.otel``); the consumer's hook
    attribute is None otherwise, so an uninstrumented consumer pays one ``is None`` test.

    ``received`` sees each message iteration hands to user code (before user code does) and
    may replace what :attr:`MessageBase.body` returns; ``settled`` sees each ``finish()`` /
    ``requeue()`` that answered a message (``operation`` is ``"finish"`` or ``"requeue"``).
    """

    def received(self, message: Any) -> None: ...

    def settled(self, message: Any, operation: str) -> None: ...


class MessageBase:
    """A message handed to user code: what it is, and whether it was answered.

    A runtime's ``Message`` subclasses this and adds the answer calls; one with more slots
    sets them all in its own ``__init__`` (no ``super()`` call per message). ``answered``
    turns True once ``finish()`` or ``requeue()`` answered it; later answers return False.
    ``_trace`` is telemetry's state for the message (``transports.otel``), None without it;
    when it has one, :attr:`body` is its ``body`` (what is left once a trace context
    envelope was taken off).
    """

    #: True once ``finish()`` or ``requeue()`` answered the message (pynsq's
    #: ``has_responded()``).
    answered: bool

    __slots__ = ("_consumer", "_delivery", "_trace", "answered")

    _consumer: Any
    _delivery: Deliver
    _trace: Any

    def __init__(self, consumer: Any, delivery: Deliver) -> None:
        self._consumer = consumer
        self._delivery = delivery
        self._trace = None
        self.answered = False

    @property
    def id(self) -> bytes:
        """16 ASCII hex bytes."""
        return self._delivery.id

    @property
    def body(self) -> bytes:
        trace = self._trace
        if trace is None:
            return self._delivery.body
        body: bytes = trace.body
        return body

    @property
    def timestamp(self) -> int:
        """When it was published, in nanoseconds since the epoch."""
        return self._delivery.timestamp

    @property
    def attempts(self) -> int:
        """1 on the first delivery."""
        return self._delivery.attempts

    @property
    def nsqd_address(self) -> str:
        """``host:port`` of the nsqd that sent the message (go-nsq's ``NSQDAddress``)."""
        return str(self._delivery.address)

    @property
    def delivery(self) -> Deliver:
        """The core's handle for this message (for the low-level API)."""
        return self._delivery

    @property
    def received_at(self) -> float:
        """``time.monotonic()`` when the message arrived."""
        return self._delivery.received_at

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id.decode(errors='replace')} attempts={self.attempts} "
            f"from={self.nsqd_address} body={len(self.body)}B>"
        )


def unanswered_of(consumer: Any, message_type: type[M], messages: Iterable[M]) -> list[M]:
    """``finish_many``'s selection: the messages not answered yet, in order, each once
    (messages hash by identity). Every one must be a ``message_type`` delivered by
    ``consumer``: else TypeError / LocalProtocolError, before anything is answered."""
    given = messages if type(messages) is list else list(messages)
    try:
        fresh = list(dict.fromkeys(filterfalse(_answered, given)))
        mine = all(map(is_, map(type, fresh), repeat(message_type))) and all(
            map(is_, map(_owner, fresh), repeat(consumer))
        )
    except AttributeError:
        mine = False
    if mine:
        return fresh
    for message in given:
        if not isinstance(message, message_type):
            raise TypeError(f"finish_many() takes Messages, got {message!r}")
        if message._consumer is not consumer:
            raise LocalProtocolError(
                f"finish_many(): {message!r} was delivered by another consumer, not by "
                f"this one ({consumer.topic}/{consumer.channel}); nothing was answered"
            )
    return list(dict.fromkeys(filterfalse(_answered, given)))  # a Message subclass

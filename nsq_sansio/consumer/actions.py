"""What the consumer coordinator tells its transport: the *actions*, all frozen values.

Connections (:class:`Connect`, :class:`StartTLS`, :class:`CloseConnection`), lookupd requests
(:class:`SendHTTPRequest`, :class:`CloseHTTPRequest`), messages for the user (:class:`Deliver`,
the handle they answer with, and :class:`FetchResult` in pull mode), and reports
(:class:`GiveUp`, :class:`TakenBack`, :class:`ConnectionUp`, :class:`Disconnected`,
:class:`LookupdFailed`, :class:`NodeRefused`, :class:`TopicNotFound`, :class:`BackoffChanged`,
:class:`DrainTimedOut`, :class:`DrainComplete`, :class:`ConsumerFailed`). :data:`Action` is
their union. This module decides nothing; it only defines the vocabulary.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NamedTuple

from ..backoff import BackoffPhase
from ..discovery import LookupdAddress, NSQDAddress
from ..errors import LookupdError, NSQError
from ..events import Message, ServerSettings

__all__ = [
    "DELIVER_ATTEMPTS",
    "DELIVER_CONN_ID",
    "DELIVER_DEADLINE",
    "DELIVER_ID",
    "Action",
    "BackoffChanged",
    "CloseConnection",
    "CloseHTTPRequest",
    "Connect",
    "ConnectionUp",
    "ConsumerFailed",
    "DeadLetter",
    "Deliver",
    "Disconnected",
    "DrainComplete",
    "DrainTimedOut",
    "FetchEnd",
    "FetchResult",
    "GiveUp",
    "LookupdFailed",
    "NodeRefused",
    "SendHTTPRequest",
    "StartTLS",
    "TakenBack",
    "TopicNotFound",
]

_new_tuple = tuple.__new__


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a TCP connection to ``address``; report connection_made / connection_failed."""

    conn_id: int
    address: NSQDAddress


@dataclass(frozen=True, slots=True)
class StartTLS:
    """Run the TLS handshake on ``conn_id`` now; ``trailing_data`` belongs to the TLS layer."""

    conn_id: int
    trailing_data: bytes


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Write ``final_data``, then close the socket of ``conn_id``; the coordinator forgot it."""

    conn_id: int
    final_data: bytes = b""


@dataclass(frozen=True, slots=True)
class SendHTTPRequest:
    """Connect to ``lookupd`` (HTTPS when ``lookupd.tls``), write ``data``, feed the answer to
    http_data (or http_response) under ``request_id``."""

    request_id: int
    lookupd: LookupdAddress
    data: bytes


@dataclass(frozen=True, slots=True)
class CloseHTTPRequest:
    """The exchange ``request_id`` is over (answered, failed or abandoned): close its socket."""

    request_id: int


#: Where :class:`Deliver`'s fields sit in the tuple, for the per-message paths that read them
#: by index (``itemgetter``, subscripts) rather than by name: the layout of ``_DeliverFields``.
DELIVER_CONN_ID: Final = 0
DELIVER_ID: Final = 1
DELIVER_ATTEMPTS: Final = 4
DELIVER_DEADLINE: Final = 7


class _DeliverFields(NamedTuple):
    conn_id: int
    id: bytes
    body: bytes
    timestamp: int
    attempts: int
    address: NSQDAddress
    received_at: float
    deadline: float


class Deliver(_DeliverFields):
    """A message for the user, and the handle to answer it with (finish/requeue/touch).

    ``Deliver(conn_id, message, address, received_at, deadline)``; the message's own fields
    (``id``, ``body``, ``timestamp``, ``attempts``) are fields of the handle, and
    :attr:`message` builds the :class:`~nsq_sansio.events.Message` when asked: one object per
    message on the hot path, built by the connection's decoder itself. Read the fields by
    name (the tuple's layout is not part of the API). ``deadline`` is when nsqd times it out
    if nothing is sent (``received_at + msg_timeout``); :meth:`ConsumerCoordinator.deadline`
    gives the current one after TOUCHes. A ``NamedTuple`` (immutable) rather than a frozen
    dataclass because one is built per message. Handles are compared by identity.
    """

    __slots__ = ()

    def __new__(
        cls,
        conn_id: int,
        message: Message,
        address: NSQDAddress,
        received_at: float,
        deadline: float,
    ) -> Deliver:
        return _new_tuple(cls, (conn_id, *message, address, received_at, deadline))

    def __getnewargs__(self) -> tuple[int, Message, NSQDAddress, float, float]:
        """The constructor's arguments (copy and pickle call ``__new__`` with them)."""
        return self[0], self.message, self[5], self[6], self[7]

    @property
    def message(self) -> Message:
        """The message as the connection reports it (a new, equal object on each access)."""
        return _new_tuple(Message, self[1:5])


@dataclass(frozen=True, slots=True)
class GiveUp:
    """The message went over ``max_attempts``: it was FIN'd; log it, store it, alert...

    ``dead_letter_topic`` is the topic it was published to first, when the consumer has a
    dead-letter destination (None: it was not published anywhere)."""

    conn_id: int
    address: NSQDAddress
    message: Message
    dead_letter_topic: str | None = None


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """The message went over ``max_attempts`` and the consumer has a dead-letter destination:
    publish it there, then report the outcome with ``dead_letter_published(delivery, now,
    topic)`` (it is FIN'd, and a :class:`GiveUp` says so) or ``dead_letter_failed(delivery,
    now)`` (it is requeued: never lost). Until then it is held like a message in user code
    (a drain waits for it; nsqd times it out after ``msg_timeout`` as any other)."""

    delivery: Deliver


@dataclass(frozen=True, slots=True)
class TakenBack:
    """A FIN/REQ/TOUCH came too late: the message was already taken back (by nsqd after its
    timeout, or because the connection closed). Not fatal; another consumer may have it.

    ``delivery`` is the handle the report is about, where it is known (nsqd may deliver the
    same id again, and the newer copy is still ours): always for ``TIMEOUT`` and for answers
    refused here, for a ``TOUCH`` nsqd refused; None for a FIN/REQ nsqd refused (the handle
    was already answered) or a close that lost the connection's messages."""

    conn_id: int
    address: NSQDAddress
    message_id: bytes | None
    command: str
    error: NSQError
    delivery: Deliver | None = None


@dataclass(frozen=True, slots=True)
class ConnectionUp:
    """``conn_id`` is subscribed; ``settings`` is nsqd's IDENTIFY answer."""

    conn_id: int
    address: NSQDAddress
    settings: ServerSettings


@dataclass(frozen=True, slots=True)
class Disconnected:
    """``conn_id`` is gone. ``unanswered`` messages will be requeued by nsqd; ``reconnect_at``
    is when a retry is planned (direct mode), None when it waits for lookupd or is draining."""

    conn_id: int
    address: NSQDAddress
    error: NSQError | None
    unanswered: tuple[bytes, ...]
    reconnect_at: float | None


@dataclass(frozen=True, slots=True)
class LookupdFailed:
    """A lookupd answered garbage, an error status or nothing; skipped until its next poll."""

    lookupd: LookupdAddress
    error: LookupdError


@dataclass(frozen=True, slots=True)
class NodeRefused:
    """A lookupd listed ``address`` and the consumer's ``nsqd_filter`` refused it: it is not
    connected to. Reported once per address."""

    lookupd: LookupdAddress
    address: NSQDAddress


@dataclass(frozen=True, slots=True)
class BackoffChanged:
    """The consumer's backoff moved: a window opened (``WAITING``, ``window`` seconds long),
    a window ended (``TESTING``: one message at a time is let in), a success while testing
    lowered the level (still ``TESTING``), or backoff is over (``NORMAL``). ``failures`` are
    those counted since the consumer last ran normally. Informational (logs, metrics): the
    coordinator already changed RDY."""

    phase: BackoffPhase
    level: int
    window: float
    failures: int


@dataclass(frozen=True, slots=True)
class TopicNotFound:
    """``lookupd`` lists no nsqd for the consumer's ``topic`` (it does not know the topic, or
    no nsqd has it now), and no other lookupd lists one: nothing to consume until an nsqd has
    the topic. Reported once, and again only after some lookupd listed a producer."""

    lookupd: LookupdAddress
    topic: str


@dataclass(frozen=True, slots=True)
class DrainTimedOut:
    """The drain's deadline passed while the user still held ``messages`` (handlers still
    running, messages not answered): each was requeued (``REQ 0``) just now, so nsqd delivers
    it again; answering one of them now gives a :class:`TakenBack`."""

    messages: tuple[Deliver, ...]


@dataclass(frozen=True, slots=True)
class DrainComplete:
    """Drain finished: every connection is closed and nothing is left in flight."""


@dataclass(frozen=True, slots=True)
class ConsumerFailed:
    """The consumer stopped for good (state ``FAILED``): ``error`` cannot be cured by
    reconnecting: an :class:`~nsq_sansio.errors.IncompatibleNSQD` (nsqd refused IDENTIFY, the
    address is nsqd's HTTP port, a TLS/compression/AUTH requirement not met). Every connection
    was closed (what was in flight requeued), lookupd polling stopped, waiting fetches answered
    ``FAILED``; nothing will follow. The transport raises ``error`` to the user."""

    error: NSQError


class FetchEnd(enum.Enum):
    """Why a fetch answered."""

    FILLED = "filled"  # the batch is complete
    EXPIRED = "expired"  # ``expires`` passed: what arrived so far (maybe nothing)
    NO_WAIT = "no_wait"  # no_wait fetch answered from the buffer (at least one message)
    NO_MESSAGES = "no_messages"  # no_wait fetch and nothing was buffered
    TOO_MANY_WAITING = "too_many_waiting"  # max_waiting_fetches requests already wait
    DRAINING = "draining"  # the consumer is draining or closed: what arrived so far
    AGED = "aged"  # before ``expires``: its oldest message had used half of its msg_timeout
    FAILED = "failed"  # the consumer failed (ConsumerFailed): nothing more will come


@dataclass(frozen=True, slots=True)
class FetchResult:
    """The answer to fetch ``request_id``: messages (already counted as handed to the user)."""

    request_id: int
    messages: tuple[Deliver, ...]
    reason: FetchEnd


Action = (
    Connect
    | StartTLS
    | CloseConnection
    | SendHTTPRequest
    | CloseHTTPRequest
    | Deliver
    | GiveUp
    | DeadLetter
    | TakenBack
    | ConnectionUp
    | Disconnected
    | LookupdFailed
    | TopicNotFound
    | NodeRefused
    | BackoffChanged
    | FetchResult
    | DrainTimedOut
    | DrainComplete
    | ConsumerFailed
)

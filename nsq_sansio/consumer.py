"""The consumer coordinator: many nsqd connections, one decision maker, no IO.

A transport drives one :class:`ConsumerCoordinator` and does exactly what it says::

    coordinator.start(now)                       # connect / ask lookupd
    loop:
        for action in coordinator.take_actions(): # Connect, CloseConnection, StartTLS,
            ...                                   # SendHTTPRequest, CloseHTTPRequest, Deliver,
                                                  # GiveUp, TakenBack, FetchResult, DrainComplete,
                                                  # ConsumerFailed
        for conn_id, data in coordinator.pending_data():
            write(conn_id, data)
        sleep until coordinator.next_deadline() or IO, then feed one of:
            connection_made(conn_id, now) / connection_failed(conn_id, error, now)
            receive_data(conn_id, data, now)  (b"" at EOF) / tls_established(conn_id, now)
            http_data(request_id, data, now) (b"" at EOF) / http_response(...) / http_failed(...)
            handle_timer(now)
        user code: finish(d, now) / requeue(d, now, delay=None, backoff=True) / touch(d, now)
                   set_max_in_flight(n, now) / fetch(...) / drain(now, unseen=queue)
        transport (optional): mark_delivered(d) when a Deliver reaches user code;
                   finish_many(ds, now) for FINs it collected (the cheapest way to answer)

What it decides (NSQ's client guide, every line of it; see docs/consumer.md):

* RDY: a new connection starts at RDY 1; ``max_in_flight`` is then spread evenly
  (``max_in_flight // n``, remainder given out, capped by each nsqd's ``max_rdy_count``). The
  messages held, over all connections, never exceed ``max_in_flight`` (not only the sum of
  RDY): a raise only uses budget not in flight elsewhere, counting what a lowered RDY may
  still bring (see the "max_in_flight bound" internals). RDY is re-sent when a connection's
  count left is 0 or under 25% of the last value. With fewer RDY than connections, RDY 1 goes
  to a random set and moves away from connections idle for ``low_rdy_idle_timeout``.
  ``set_max_in_flight`` (0 pauses) redistributes at once. :meth:`ConsumerCoordinator.is_starved`
  is the guide's.
* Messages: attempts over ``max_attempts`` are FIN'd and reported (:class:`GiveUp`); REQ without
  a delay waits ``default_requeue_delay * attempts`` capped; late FIN/REQ/TOUCH is reported as
  :class:`TakenBack`, never raised. Each :class:`Deliver` has a deadline; TOUCH extends it up to
  the server's ``max_msg_timeout``.
* Backoff (:mod:`nsq_sansio.backoff`): RDY 0 everywhere, wait, RDY 1 to test, one result per
  window.
* Discovery (:mod:`nsq_sansio.discovery`): lookupd mode connects to new nodes found by a poll
  and reconnects a lost node only when a later poll reports it; direct mode retries with capped,
  jittered exponential backoff.
* Drain: RDY 0 everywhere, requeue what the user has not seen, wait for what the user holds
  (up to a deadline, then requeue it), CLS, wait for CLOSE_WAIT, close.
* Pull mode (:mod:`nsq_sansio.pull`): RDY follows the outstanding fetches; connections that
  delivered recently get them, idle ones keep a probe of 1, a used-up share is topped up at once.
* Failure: nsqd refusing IDENTIFY (:class:`~nsq_sansio.errors.IdentifyRejected`, a bad
  configuration) stops the consumer for good: :class:`ConsumerFailed`, state ``FAILED``.

``CloseConnection.final_data`` must be written before the socket is closed (final REQ/FIN/CLS).
A :class:`Deliver` is the handle the user answers with; after its connection is gone, answering
it only produces a :class:`TakenBack` (nsqd requeues such messages itself).
"""

from __future__ import annotations

import enum
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import is_, itemgetter
from typing import NamedTuple, cast

from .backoff import Backoff, BackoffPhase, Outcome, reconnect_delay
from .config import Config
from .connection import MAX_COMMAND_DELAY, ClientConnection, ConnectionState
from .discovery import (
    LookupAnswer,
    LookupdAddress,
    LookupdPoller,
    LookupFailure,
    NSQDAddress,
)
from .errors import (
    ConfigError,
    ConnectionLost,
    IdentifyRejected,
    LocalProtocolError,
    LookupdError,
    MessageGone,
    NSQError,
)
from .events import (
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    Event,
    Message,
    MessageTakenBack,
    ServerSettings,
    Subscribed,
    TLSUpgradeRequired,
)
from .names import validate_channel, validate_topic
from .pull import FetchEnd, FetchQueue, FetchRequest, FetchResult
from .rdy import even_shares, is_starved, needs_refresh

__all__ = [
    "Action",
    "CloseConnection",
    "CloseHTTPRequest",
    "Connect",
    "ConnectionUp",
    "ConsumerCoordinator",
    "ConsumerFailed",
    "ConsumerState",
    "Deliver",
    "Disconnected",
    "DrainComplete",
    "FetchEnd",
    "FetchResult",
    "GiveUp",
    "LinkPhase",
    "LookupdFailed",
    "MessageGone",
    "SendHTTPRequest",
    "StartTLS",
    "TakenBack",
]

#: How long after the drain deadline a CLS may wait for CLOSE_WAIT before the socket is cut.
CLOSE_WAIT_GRACE = 5.0

#: After an RDY is lowered, nsqd may still have sent messages under the old one (on the wire,
#: or read but not yet handed over by the transport). That capacity is only given to another
#: connection once those messages have been answered, or this long after the lowered RDY was
#: decided (at least; 4x the connection's handshake time when that is longer).
RDY_SETTLE_MIN = 0.25


_new_tuple = tuple.__new__
_id: Callable[[Deliver], bytes] = itemgetter(1)  # Deliver.id
_attempts: Callable[[Deliver], int] = itemgetter(4)  # Deliver.attempts
_conn_id: Callable[[Deliver], int] = itemgetter(0)  # Deliver.conn_id
_deadline: Callable[[Deliver], float] = itemgetter(7)  # Deliver.deadline


def _no_fin(message_id: bytes) -> None:  # pragma: no cover - never called: no message yet
    raise LocalProtocolError("FIN on a connection that is not set up")


def _no_fin_many(message_ids: list[bytes]) -> None:  # pragma: no cover - as _no_fin
    raise LocalProtocolError("FIN on a connection that is not set up")


# --- actions: coordinator -> transport ---------------------------------------------------------


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
    """The message went over ``max_attempts``: it was FIN'd; log it, store it, alert..."""

    conn_id: int
    address: NSQDAddress
    message: Message


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
class DrainComplete:
    """Drain finished: every connection is closed and nothing is left in flight."""


@dataclass(frozen=True, slots=True)
class ConsumerFailed:
    """The consumer stopped for good (state ``FAILED``): ``error`` cannot be cured by
    reconnecting. Today that is :class:`~nsq_sansio.errors.IdentifyRejected`: nsqd refused the
    configuration (a value outside its limits). Every connection was closed (what was in
    flight requeued), lookupd polling stopped, waiting fetches answered ``FAILED``; nothing
    will follow. The transport raises ``error`` to the user."""

    error: NSQError


Action = (
    Connect
    | StartTLS
    | CloseConnection
    | SendHTTPRequest
    | CloseHTTPRequest
    | Deliver
    | GiveUp
    | TakenBack
    | ConnectionUp
    | Disconnected
    | LookupdFailed
    | FetchResult
    | DrainComplete
    | ConsumerFailed
)


class ConsumerState(enum.Enum):
    """The coordinator's lifecycle."""

    CREATED = "created"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"
    #: Stopped by an error reconnecting cannot cure (see :class:`ConsumerFailed`).
    FAILED = "failed"


class LinkPhase(enum.Enum):
    """Where one connection is, from the coordinator's point of view."""

    CONNECTING = "connecting"  # Connect emitted, TCP not up yet
    HANDSHAKING = "handshaking"  # IDENTIFY / TLS / AUTH / SUB under way
    SUBSCRIBED = "subscribed"  # messages may flow
    CLOSING = "closing"  # CLS sent, waiting for CLOSE_WAIT


class _Link:
    """One connection's bookkeeping (internal, mutable)."""

    __slots__ = (
        "accepting",
        "address",
        "alloc",
        "ceiling",
        "claim",
        "close_deadline",
        "close_wait",
        "conn_id",
        "connected_at",
        "dirty",
        "handshake_deadline",
        "head",
        "held",
        "last_message_at",
        "live_floor",
        "marks",
        "max_msg_timeout",
        "max_rdy",
        "max_req_timeout",
        "msg_timeout",
        "phase",
        "proto",
        "pull_seq",
        "queue",
        "rdy",
        "rdy_at",
        "rdy_refresh",
        "remaining",
        "seen",
        "send_fin",
        "send_fins",
        "settle_at",
        "settle_delay",
        "target",
        "touched",
        "warm",
        "wire_rdy",
    )

    def __init__(self, conn_id: int, address: NSQDAddress, deadline: float) -> None:
        self.conn_id = conn_id
        self.address = address
        self.phase = LinkPhase.CONNECTING
        self.proto: ClientConnection | None = None
        self.handshake_deadline: float | None = deadline
        self.close_deadline: float | None = None
        self.close_wait = False
        self.rdy = 0
        #: The last RDY handed to the connection (``rdy`` is decided at once, written at the
        #: next pending_data(), so a step that moves RDY away and back writes nothing).
        self.wire_rdy = 0
        #: The same RDY was asked again (the 25% refresh): write it even if unchanged.
        self.rdy_refresh = False
        #: The most messages this connection can still come to hold without a further raise:
        #: at least ``wire_rdy``; after a lowered RDY, what nsqd may have sent under the old
        #: one (see :meth:`ConsumerCoordinator._budget_left`). ``claim`` is
        #: ``max(ceiling, rdy)``, this connection's part of ``max_in_flight``.
        self.ceiling = 0
        self.claim = 0
        #: When the part of ``ceiling`` above ``max(wire_rdy, messages held)`` is released:
        #: by then nsqd has read the lowered RDY and what it sent before has arrived.
        self.settle_at: float | None = None
        self.settle_delay = RDY_SETTLE_MIN
        self.connected_at = deadline
        self.remaining = 0
        self.target = 0
        self.alloc = 0
        self.warm = False
        self.max_rdy = 1
        self.msg_timeout = 60.0
        self.max_msg_timeout = 900.0
        self.max_req_timeout: float | None = None
        self.last_message_at = -math.inf
        #: Pull mode: which link delivered last (ties of ``last_message_at`` in one read).
        self.pull_seq = 0
        #: No message held here reaches its deadline before this (a lower bound, lowered by
        #: each read, recomputed by a scan): until then every held message is live, so the
        #: pull budget needs no walk over them (see ``_live_count``). -inf: scan next time.
        self.live_floor = -math.inf
        self.rdy_at = -math.inf
        #: Messages in flight here, with the handle the user answers with: ``held`` by id,
        #: then ``queue[head:]``, the handles of the latest reads in delivery order, not put
        #: in ``held`` yet: answers in that order only move ``head`` (no dict work per
        #: message). :attr:`tracked` merges the two. ``head < len(queue)`` unless both are 0.
        self.held: dict[bytes, Deliver] = {}
        self.queue: list[Deliver] = []
        self.head = 0
        #: Deadlines moved by TOUCH (most messages are never touched).
        self.touched: dict[bytes, float] = {}
        #: Ids handed to user code, when the transport reports it (mark_delivered).
        self.seen: set[bytes] = set()
        #: True once ``touched`` or ``seen`` were used (spares the hot path two lookups).
        self.marks = False
        #: ``proto.finish``, bound once the connection exists.
        self.send_fin: Callable[[bytes], None] = _no_fin
        #: ``proto.finish_many``: FIN a list of ids, all or nothing.
        self.send_fins: Callable[[list[bytes]], None] = _no_fin_many
        #: Subscribed and the consumer running: messages go to the user (the hot-path test).
        self.accepting = False
        #: True only while conn_id is in the coordinator's ``_dirty`` (spares finish() a set
        #: insert per message); False does not mean it is not there.
        self.dirty = False

    @property
    def tracked(self) -> dict[bytes, Deliver]:
        """Every message in flight here, by id, in delivery order (the queue moves in)."""
        queue = self.queue
        if queue:
            rest = queue[self.head :] if self.head else queue
            self.held.update(zip(map(_id, rest), rest, strict=True))
            self.queue = []
            self.head = 0
        return self.held

    def held_count(self) -> int:
        """``len(self.tracked)``, without moving the queue."""
        return len(self.held) + len(self.queue) - self.head


class _Retry:
    __slots__ = ("failures", "retry_at")

    def __init__(self) -> None:
        self.failures = 0
        self.retry_at: float | None = None


class ConsumerCoordinator:
    """Decides, for one topic/channel, what every nsqd connection sends and when.

    ``nsqd`` are direct addresses (retried with backoff), ``lookupd`` are polled for producers.
    ``rng`` makes every random choice (jitter, which connection gets RDY) replayable. ``pull``
    selects pull mode: messages only flow for :meth:`fetch` requests.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        config: Config | None = None,
        *,
        rng: random.Random,
        nsqd: Iterable[str | NSQDAddress] = (),
        lookupd: Iterable[str | LookupdAddress] = (),
        pull: bool = False,
    ) -> None:
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        self._config = config if config is not None else Config()
        if self._config.heartbeat_interval is None:
            raise ConfigError(
                "heartbeat_interval=None: nsqd refuses SUB on a connection without heartbeats; "
                "allowed 1 <= heartbeat_interval <= 3600 (seconds) for a consumer"
            )
        self._rng = rng
        self._pull = pull
        self._identify = self._config.identify_body()
        self._state = ConsumerState.CREATED
        self._direct: dict[NSQDAddress, _Retry] = {}
        for address in nsqd:
            self._direct.setdefault(NSQDAddress.parse(address), _Retry())
        lookupds = [LookupdAddress.parse(a) for a in lookupd]
        self._poller: LookupdPoller | None = None
        if lookupds:
            self._poller = LookupdPoller(
                lookupds,
                self.topic,
                interval=self._config.lookupd_poll_interval,
                jitter=self._config.lookupd_poll_jitter,
                timeout=self._config.lookupd_poll_timeout,
                rng=rng,
                user_agent=self._config.user_agent,
            )
        if not self._direct and self._poller is None:
            raise LocalProtocolError("a consumer needs at least one nsqd or lookupd address")
        self._backoff = Backoff(
            self._config.backoff_multiplier,
            self._config.max_backoff_duration,
            enabled=self._config.backoff_enabled,
        )
        self._links: dict[int, _Link] = {}
        self._by_address: dict[NSQDAddress, _Link] = {}
        self._next_conn_id = 1
        self._next_fetch_id = 1
        self._actions: list[Action] = []
        self._dirty: set[int] = set()
        #: Connections with an RDY decided but not handed to the connection yet; written by
        #: pending_data(), decreases first, so that the sum of RDY nsqd sees never exceeds
        #: max_in_flight, not even between two writes.
        self._rdy_due: set[int] = set()
        self._total_rdy = 0
        #: Sum of every connection's ``claim`` (max of its RDY and its ceiling): what may end
        #: up held; a raise never takes it over max_in_flight.
        self._claimed = 0
        #: Connections whose ceiling is above their written RDY (a lowered RDY whose old
        #: capacity may still be in use): answers there return budget, so none is calm.
        self._settling: set[int] = set()
        self._alloc_total = 0
        self._fetches = FetchQueue()
        self._next_redistribute: float | None = None
        self._drain_deadline: float | None = None
        #: Pull mode: the next deadline of a held message (the budget grows when it passes).
        self._next_expiry: float | None = None
        #: Pull mode: counts messages, so the link that delivered last is known exactly.
        self._pull_seq = 0
        #: True while running in push mode outside backoff: answers need no bookkeeping
        #: beyond the FIN itself (the hot path's test).
        self._calm = False
        #: Set by the first mark_delivered(): from then on only marked deliveries count as
        #: handed to user code, and drain requeues the others at once.
        self._explicit_delivery = False
        self._max_attempts = self._config.max_attempts
        self._failure: NSQError | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        self.taken_back = 0

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages received, finished, requeued, given up, taken back."""
        return {
            "received": self.received,
            "finished": self.finished,
            "requeued": self.requeued,
            "given_up": self.given_up,
            "taken_back": self.taken_back,
        }

    # --- introspection -------------------------------------------------------------------------
    # These only read (containers are copied in one C-level step before they are walked), so
    # a transport may call them from another thread (a metrics scrape) while its own thread
    # drives the coordinator: they never raise for that; a figure may be a moment old.

    @property
    def state(self) -> ConsumerState:
        return self._state

    @property
    def config(self) -> Config:
        return self._config

    @property
    def failure(self) -> NSQError | None:
        """Why the consumer failed (state ``FAILED``), else None."""
        return self._failure

    @property
    def max_in_flight(self) -> int:
        return self._config.max_in_flight

    @property
    def total_rdy(self) -> int:
        """Sum of the last RDY sent on every connection (never above max_in_flight)."""
        return self._total_rdy

    @property
    def backoff_phase(self) -> BackoffPhase:
        return self._backoff.phase

    @property
    def backoff_level(self) -> int:
        return self._backoff.level

    def connection_ids(self) -> list[int]:
        return list(self._links)

    def link_info(self, conn_id: int) -> tuple[LinkPhase, int, int] | None:
        """``(phase, last RDY sent, messages in flight)`` of a connection, or None."""
        link = self._links.get(conn_id)
        if link is None:
            return None
        return link.phase, link.rdy, max(link.held_count(), 0)

    def in_flight_count(self) -> int:
        """Messages in flight on every connection (handed out, not answered yet)."""
        return sum(max(link.held_count(), 0) for link in list(self._links.values()))

    def known_nodes(self) -> frozenset[NSQDAddress]:
        """nsqd addresses known from configuration and from lookupd (union)."""
        nodes = set(self._direct)
        if self._poller is not None:
            nodes |= self._poller.known_nodes()
        return frozenset(nodes)

    def is_starved(self) -> bool:
        """The guide's is_starved: some connection holds >= 85% of its RDY in messages."""
        for link in self._links.values():
            if link.phase is LinkPhase.SUBSCRIBED and is_starved(link.held_count(), link.rdy):
                return True
        return False

    def deadline(self, delivery: Deliver) -> float | None:
        """When nsqd will time this message out (after TOUCHes), None if no longer ours."""
        link = self._current(delivery)
        if link is None:
            return None
        return link.touched.get(delivery.id, delivery.deadline)

    def max_deadline(self, delivery: Deliver) -> float | None:
        """The furthest TOUCH can push the deadline (received + the server's max_msg_timeout)."""
        link = self._current(delivery)
        if link is None:
            return None
        return delivery.received_at + link.max_msg_timeout

    def next_touch(self, delivery: Deliver) -> float | None:
        """For long jobs (seeds/002): when to TOUCH next to keep the message, half-way to its
        deadline; None when it is no longer ours or TOUCH cannot extend it any more (the
        server's max_msg_timeout is reached: finish before :meth:`max_deadline`). The
        coordinator never touches by itself."""
        link = self._current(delivery)
        if link is None:
            return None
        deadline = link.touched.get(delivery.id, delivery.deadline)
        if deadline >= delivery.received_at + link.max_msg_timeout:
            return None
        return deadline - link.msg_timeout / 2

    def requeue_delay(self, attempts: int, conn_id: int | None = None) -> float:
        """The automatic REQ delay: ``default_requeue_delay * attempts``, capped."""
        config = self._config
        delay = min(config.default_requeue_delay * max(attempts, 1), config.max_requeue_delay)
        link = self._links.get(conn_id) if conn_id is not None else None
        if link is not None and link.max_req_timeout is not None:
            delay = min(delay, link.max_req_timeout)
        return delay

    # --- output --------------------------------------------------------------------------------

    def take_actions(self) -> list[Action]:
        """Everything decided since the last call, in order."""
        actions = self._actions
        self._actions = []
        return actions

    def data_to_send(self, conn_id: int) -> bytes:
        """Bytes to write on ``conn_id``."""
        link = self._links.get(conn_id)
        self._dirty.discard(conn_id)
        if link is None or link.proto is None:
            return b""
        self._emit_rdy(link)
        link.dirty = False
        return link.proto.data_to_send()

    def pending_data(self) -> list[tuple[int, bytes]]:
        """``(conn_id, bytes)`` for every connection with something to write, connections
        whose RDY was lowered first (write them in this order)."""
        out: list[tuple[int, bytes]] = []
        dirty = self._dirty
        if not dirty:
            return out
        links = self._links
        order: Iterable[int] = dirty
        if self._rdy_due:
            due = [links[conn_id] for conn_id in self._rdy_due if conn_id in links]
            lowered = [each.conn_id for each in due if each.rdy < each.wire_rdy]
            for each in sorted(due, key=lambda each: each.rdy >= each.wire_rdy):
                self._emit_rdy(each)  # decreases first: the same order as the writes
            self._rdy_due.clear()
            if lowered:
                order = lowered + [conn_id for conn_id in dirty if conn_id not in lowered]
        for conn_id in order:
            link = links.get(conn_id)
            if link is not None and link.proto is not None:
                link.dirty = False
                data = link.proto.data_to_send()
                if data:
                    out.append((conn_id, data))
        dirty.clear()
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must be called next (None: only on IO)."""
        candidates: list[float] = []
        if self._state is ConsumerState.RUNNING:
            if self._backoff.deadline is not None:
                candidates.append(self._backoff.deadline)
            if self._next_redistribute is not None and self._links:
                candidates.append(self._next_redistribute)
            for conn_id in self._settling:
                settle_at = self._links[conn_id].settle_at
                if settle_at is not None:
                    candidates.append(settle_at)
            if self._poller is not None:
                poll = self._poller.next_deadline()
                if poll is not None:
                    candidates.append(poll)
            for retry in self._direct.values():
                if retry.retry_at is not None:
                    candidates.append(retry.retry_at)
            if self._pull:
                pull = self._fetches.next_deadline()
                if pull is not None:
                    candidates.append(pull)
                if self._next_expiry is not None and self._fetches.waiting:
                    candidates.append(self._next_expiry)
        elif self._state is ConsumerState.DRAINING and self._drain_deadline is not None:
            candidates.append(self._drain_deadline)
        for link in self._links.values():
            if link.handshake_deadline is not None:
                candidates.append(link.handshake_deadline)
            if link.close_deadline is not None:
                candidates.append(link.close_deadline)
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None:
                    candidates.append(beat)
        return min(candidates) if candidates else None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Connect to the configured nsqd and ask every lookupd (bootstrap)."""
        if self._state is not ConsumerState.CREATED:
            raise LocalProtocolError(f"start() in state {self._state.name}: call it once")
        self._state = ConsumerState.RUNNING
        self._recalm()
        self._next_redistribute = now + self._config.rdy_redistribute_interval
        for address in self._direct:
            self._connect(address, now)
        if self._poller is not None:
            for request in self._poller.start(now):
                self._actions.append(
                    SendHTTPRequest(request.request_id, request.lookupd, request.data)
                )

    def drain(
        self, now: float, timeout: float | None = None, *, unseen: Iterable[Deliver] = ()
    ) -> None:
        """Graceful shutdown (seeds/003): stop the flow, give back what the user has not seen,
        wait for what the user holds (until ``timeout``, default ``config.drain_timeout``),
        then CLS every connection, wait for CLOSE_WAIT and close. Ends with DrainComplete.

        ``unseen``: deliveries the transport received but never handed to user code (still in
        its queue); they are requeued at once (REQ 0) so other consumers take them. Pull mode's
        own buffer is requeued the same way."""
        if self._state in (ConsumerState.DRAINING, ConsumerState.CLOSED, ConsumerState.FAILED):
            return  # FAILED: already closed, ConsumerFailed said so (no DrainComplete)
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise LocalProtocolError(f"drain timeout must be >= 0 seconds, got {timeout!r}")
        if self._state is ConsumerState.CREATED:
            self._state = ConsumerState.CLOSED
            self._actions.append(DrainComplete())
            return
        self._state = ConsumerState.DRAINING
        self._calm = False
        self._drain_deadline = now + (self._config.drain_timeout if timeout is None else timeout)
        self._backoff.reset()
        if self._poller is not None:
            for request_id in self._poller.stop():
                self._actions.append(CloseHTTPRequest(request_id))
        for retry in self._direct.values():
            retry.retry_at = None
        if self._pull:
            for fetch in self._fetches.take_all():
                self._answer_fetch(fetch, FetchEnd.DRAINING)
        for link in list(self._links.values()):
            if link.phase is LinkPhase.CONNECTING or link.phase is LinkPhase.HANDSHAKING:
                self._drop(link, None, now, close=True)
                continue
            link.accepting = False
            if link.rdy:
                self._send_rdy(link, 0, now)  # before any REQ: nsqd must not resend them
            link.target = 0
        self._flush_buffer(None)
        for delivery in unseen:
            found = self._current(delivery)
            if found is not None:
                self._requeue_now(found, delivery)
        if self._explicit_delivery:
            for link in self._links.values():
                for delivery in list(link.tracked.values()):
                    if delivery.id not in link.seen:
                        self._requeue_now(link, delivery)
        for link in list(self._links.values()):
            self._maybe_close_drained(link, now)
        self._check_drained()

    # --- transport -> coordinator: connections ---------------------------------------------

    def connection_made(self, conn_id: int, now: float) -> None:
        """TCP is up for ``conn_id``: IDENTIFY is queued (see pending_data)."""
        link = self._links.get(conn_id)
        if link is None or link.phase is not LinkPhase.CONNECTING:
            return
        link.phase = LinkPhase.HANDSHAKING
        link.connected_at = now
        link.proto = ClientConnection(self._identify, auth_secret=self._config.auth_secret)
        link.send_fin = link.proto.finish
        link.send_fins = link.proto.finish_many
        self._dirty.add(conn_id)

    def connection_failed(
        self, conn_id: int, error: BaseException | str | None, now: float
    ) -> None:
        """Connecting failed, or the socket broke (reset, IO error, TLS failure)."""
        link = self._links.get(conn_id)
        if link is None:
            return
        if isinstance(error, NSQError):
            nsq_error: NSQError = error
        else:
            nsq_error = ConnectionLost(
                f"connection {conn_id} to {link.address} failed in phase {link.phase.name}: "
                f"{error or 'no reason given'}"
            )
        self._drop(link, nsq_error, now, close=False)

    def tls_established(self, conn_id: int, now: float) -> None:
        """The TLS handshake asked by :class:`StartTLS` succeeded."""
        link = self._links.get(conn_id)
        if link is None or link.proto is None:
            return
        link.proto.tls_established()
        self._dirty.add(conn_id)

    def receive_data(self, conn_id: int, data: bytes, now: float) -> None:
        """Bytes read from ``conn_id`` (``b""`` at EOF). Never raises on what nsqd sent."""
        link = self._links.get(conn_id)
        if link is None or link.proto is None:
            return
        proto = link.proto
        held = proto.in_flight_count
        # Message frames come as Deliver handles, built by the decoder.
        events = proto._receive_as(Deliver, conn_id, link.address, data, now, link.msg_timeout)
        self._dirty.add(conn_id)
        if not events:
            return
        if proto.state is ConnectionState.CLOSED:
            # The batch ends with ConnectionClosed: nothing before it can be answered any more
            # (nsqd requeues those messages), and no command may be sent.
            self._close_from_events(link, events, now)
            return
        if now + link.msg_timeout < link.live_floor:  # what this read brings expires then
            link.live_floor = now + link.msg_timeout
        if not (link.accepting and self._calm):
            if (
                self._pull
                and link.accepting
                and proto.in_flight_count - held == len(events)
                and (not self._max_attempts or max(map(_attempts, events)) <= self._max_attempts)
            ):
                # Pull mode's hot path: a read of messages only, each new to this connection
                # and under max_attempts (as push mode's below), handed on as one batch.
                self._pull_receive(link, cast("list[Deliver]", events), now)
                return
            for event in events:
                if type(event) is Deliver:
                    self._on_message(link, event, now)
                else:
                    self._on_event(link, event, now)
                    if link.conn_id not in self._links:
                        return
            return
        count = len(events)
        max_attempts = self._max_attempts
        deliveries = cast("list[Deliver]", events)  # if the test below passes
        if proto.in_flight_count - held == count and (
            not max_attempts or max(map(_attempts, deliveries)) <= max_attempts
        ):
            # The hot path: a subscribed push connection outside backoff and drain, and a read
            # of messages only. The connection's in-flight set grew by one per event, so every
            # event is a Deliver with an id new to this connection (none is held here: what is
            # tracked is in flight there), and none is over max_attempts. No per-message
            # Python loop: the decoder built the handles; the read's list is the actions and
            # the tracking.
            self._actions += deliveries
            queue = link.queue  # tracked from here, by position (see _Link)
            if not queue:
                link.queue = deliveries
            else:
                if link.head:
                    del queue[: link.head]
                    link.head = 0
                queue += deliveries
            self.received += count
            link.remaining -= count
            link.last_message_at = now
            self._after_messages(link, now)
            return
        # Mixed reads (a heartbeat, a message sent again, one over max_attempts), one by one.
        tracked = link.tracked
        append = self._actions.append
        attempts_limit = self._max_attempts or 0xFFFF
        setdefault = tracked.setdefault
        count = 0
        for event in events:
            if type(event) is Deliver:
                if event[4] > attempts_limit:
                    self._on_message(link, event, now)
                    continue
                if setdefault(event[1], event) is not event:  # nsqd resent a held id
                    self._on_message(link, event, now)
                    continue
                append(event)
                count += 1
            else:
                self._on_event(link, event, now)
                if link.conn_id not in self._links:
                    break
        if count:
            self.received += count
            link.remaining -= count
            link.last_message_at = now
            self._after_messages(link, now)

    # --- transport -> coordinator: lookupd -----------------------------------------------------

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Raw bytes of a lookupd answer (``b""`` at EOF), parsed with h11."""
        if self._poller is not None:
            self._on_lookup(request_id, self._poller.receive_data(request_id, data), now)

    def http_response(self, request_id: int, status: int, body: bytes, now: float) -> None:
        """A lookupd answer already parsed by the transport's own HTTP client."""
        if self._poller is not None:
            outcome = self._poller.receive_response(request_id, status, body)
            self._on_lookup(request_id, outcome, now)

    def http_failed(self, request_id: int, error: BaseException | str, now: float) -> None:
        """The lookupd request could not be made (connect refused, reset, TLS...)."""
        if self._poller is not None:
            self._on_lookup(request_id, self._poller.fail(request_id, error), now)

    # --- timers --------------------------------------------------------------------------------

    def handle_timer(self, now: float) -> None:
        """Do whatever is due at ``now``; call it when :meth:`next_deadline` passes."""
        for link in list(self._links.values()):
            if link.conn_id not in self._links:
                continue  # dropped while handling another one
            if link.handshake_deadline is not None and now >= link.handshake_deadline:
                self._drop(
                    link,
                    ConnectionLost(
                        f"connection {link.conn_id} to {link.address} not subscribed after "
                        f"{self._config.connect_timeout:g}s (phase {link.phase.name})"
                    ),
                    now,
                    close=True,
                )
                continue
            if link.close_deadline is not None and now >= link.close_deadline:
                self._drop(link, None, now, close=True)
                continue
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None and now >= beat:
                    events = link.proto.handle_timer(now)
                    if events:
                        self._close_from_events(link, events, now)
        if self._state is ConsumerState.DRAINING:
            if self._drain_deadline is not None and now >= self._drain_deadline:
                self._drain_deadline = None
                for link in list(self._links.values()):
                    for delivery in list(link.tracked.values()):
                        self._requeue_now(link, delivery)
                    self._maybe_close_drained(link, now)
            self._check_drained()
            return
        if self._state is not ConsumerState.RUNNING:
            return
        if self._backoff.handle_timer(now):
            self._recalm()
            self._rebalance(now)
        if self._settling:
            self._settle_due(now)
        if self._next_redistribute is not None and now >= self._next_redistribute:
            self._next_redistribute = now + self._config.rdy_redistribute_interval
            self._redistribute(now)
        if self._poller is not None:
            requests, failures = self._poller.poll_due(now)
            for request_id, failure in failures:
                self._on_lookup(request_id, failure, now)
            for request in requests:
                self._actions.append(
                    SendHTTPRequest(request.request_id, request.lookupd, request.data)
                )
        for address, retry in self._direct.items():
            if retry.retry_at is not None and now >= retry.retry_at:
                retry.retry_at = None
                if address not in self._by_address:
                    self._connect(address, now)
        if self._pull:
            for fetch in self._fetches.expired(now):
                expired = fetch.expires_at is not None and fetch.expires_at <= now
                self._answer_fetch(fetch, FetchEnd.EXPIRED if expired else FetchEnd.AGED)
            self._flush_buffer(now)
            self._rebalance(now)

    # --- user actions --------------------------------------------------------------------------

    def mark_delivered(self, delivery: Deliver) -> None:
        """The transport handed ``delivery`` to user code. Optional: a transport that calls it
        for every delivery lets drain requeue the unmarked ones at once (the alternative is
        ``drain(unseen=...)``); without it, every Deliver counts as handed over."""
        link = self._current(delivery)
        if link is not None:
            self._explicit_delivery = True
            link.marks = True
            link.seen.add(delivery.id)

    def finish(self, delivery: Deliver, now: float) -> bool:
        """FIN: the message was handled. False (and a TakenBack) if it was no longer ours."""
        try:
            link = self._links[delivery[0]]
        except KeyError:  # its connection is gone
            self._report_gone(delivery, "FIN")
            return False
        message_id = delivery[1]
        queue = link.queue
        head = link.head
        if queue and queue[head] is delivery:  # answered in delivery order
            head += 1
            if head == len(queue):
                queue.clear()
                head = 0
            link.head = head
        else:
            tracked = link.tracked
            current = tracked.pop(message_id, None)
            if current is not delivery:  # answered, taken back, or delivered again
                if current is not None:  # a newer delivery of that id: keep it
                    tracked[message_id] = current
                self._report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "FIN")
            return False
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += 1
        if link.marks:
            link.touched.pop(message_id, None)
            link.seen.discard(message_id)
        if not self._calm:
            self._after_answer(link, Outcome.SUCCESS, now, delivery)
        return True

    def finish_many(
        self,
        deliveries: Iterable[Deliver],
        now: float,
        *,
        refused: list[Deliver] | None = None,
    ) -> int:
        """FIN every delivery, in order: the same as :meth:`finish` on each, for a transport
        that collects its users' answers (one call, one lookup per run of deliveries from the
        same connection; deliveries answered in the order they arrived are checked by position,
        with no dict work). Returns how many were FIN'd; each of the others was no longer ours
        and gave a TakenBack, exactly as :meth:`finish` would, and is appended to ``refused``
        when given (so a transport can tell which of its handles came too late)."""
        finish = self.finish
        if not self._calm:  # backoff, drain, pull or settling: answers have consequences
            if self._state is ConsumerState.RUNNING and self._backoff.phase is BackoffPhase.NORMAL:
                # Pull mode, or a lowered RDY settling: each FIN frees budget, but none
                # changes backoff, so the budget is recounted once for the whole batch.
                return self._finish_many_running(deliveries, now, refused)
            if refused is None:
                return sum([finish(delivery, now) for delivery in deliveries])
            done = 0
            for delivery in deliveries:
                if finish(delivery, now):
                    done += 1
                else:
                    refused.append(delivery)
            return done
        # Outside backoff a FIN only forgets the message: no per-answer decision to make.
        # Deliveries answered in the order they came are checked against the link's queue.
        links = self._links
        bulk = 0
        if type(deliveries) is list and deliveries:
            used, bulk = self._finish_in_order(deliveries, refused)  # all, or a first part
            if used == len(deliveries):
                return bulk
            if used:
                deliveries = deliveries[used:]
        done = 0  # FIN'd here; finish() counts its own
        others = 0
        conn_id = 0  # connection ids start at 1
        link: _Link | None = None
        queue: list[Deliver] = []
        head = size = 0
        send_fin: Callable[[bytes], None] = _no_fin
        for delivery in deliveries:
            if delivery[0] != conn_id:
                if link is not None:
                    self._queue_answered(link, head)
                conn_id = delivery[0]
                link = links.get(conn_id)
                if link is not None and link.marks:
                    link = None  # touched/seen to clean up: one by one
                if link is None:
                    queue, head, size = [], 0, 0
                else:
                    queue = link.queue
                    head = link.head
                    size = len(queue)
                    send_fin = link.send_fin
                    if not link.dirty:
                        link.dirty = True
                        self._dirty.add(conn_id)
            if head < size and queue[head] is delivery:
                head += 1
                try:
                    send_fin(delivery[1])
                except LocalProtocolError:  # that id was already answered in the same read
                    self._report_gone(delivery, "FIN")
                    if refused is not None:
                        refused.append(delivery)
                    continue
                done += 1
                continue
            if link is not None:  # out of order: finish() looks it up (and moves the queue)
                self._queue_answered(link, head)
                link = None
            if finish(delivery, now):
                others += 1
            elif refused is not None:
                refused.append(delivery)
            conn_id = 0
        if link is not None:
            self._queue_answered(link, head)
        self.finished += done
        return bulk + done + others

    def _finish_many_running(
        self, deliveries: Iterable[Deliver], now: float, refused: list[Deliver] | None
    ) -> int:
        """finish_many while running outside backoff but not calm (pull mode, settling): the
        FINs as :meth:`finish` sends them (runs in delivery order by position), then what
        each answer would do to RDY, done once per connection (settling) and once overall
        (the budget), instead of once per message."""
        links = self._links
        settling = self._settling
        answered: dict[int, list[int]] = {}  # conn_id -> [FINs that count for settling]
        done = 0
        for conn_id, group in groupby(deliveries, _conn_id):
            run = list(group)
            link = links.get(conn_id)
            if link is None:  # its connection is gone
                for delivery in run:
                    self._report_gone(delivery, "FIN")
                if refused is not None:
                    refused += run
                continue
            used, fins = self._finish_in_order(run, refused)
            fin_list = run[:fins] if used else []
            for delivery in run[used:] if used else run:
                if self._fin_tracked(link, delivery):
                    fin_list.append(delivery)
                elif refused is not None:
                    refused.append(delivery)
            done += len(fin_list)
            counted = answered.setdefault(conn_id, [0])
            if conn_id in settling and fin_list:
                # As _answered_while_settling: not those nsqd may have timed out already.
                after = now + link.settle_delay
                counted[0] += sum(map(after.__lt__, map(_deadline, fin_list)))
        grant = False
        for conn_id, (count,) in answered.items():
            link = links[conn_id]
            if count and conn_id in settling:
                if link.ceiling > link.wire_rdy:
                    link.ceiling -= min(count, link.ceiling - link.wire_rdy)
                if link.ceiling <= link.wire_rdy:
                    self._settled(link)
                self._reclaim(link)
                grant = True
        if grant:
            self._grant(now)
        if self._pull:
            for conn_id in answered:
                link = links[conn_id]
                if link.alloc > 0:
                    count = self._live_in_flight(link, now) + link.alloc
                    self._send_rdy(link, min(count, self._budget_left(link)), now)
        return done

    def _fin_tracked(self, link: _Link, delivery: Deliver) -> bool:
        """:meth:`finish`'s FIN without what follows it (RDY, backoff): False, and a
        TakenBack, when ``delivery`` is no longer in flight on ``link``."""
        message_id = delivery[1]
        queue = link.queue
        head = link.head
        if queue and queue[head] is delivery:
            self._queue_answered(link, head + 1)
        else:
            tracked = link.tracked
            current = tracked.pop(message_id, None)
            if current is not delivery:  # answered, taken back, or delivered again
                if current is not None:  # a newer delivery of that id: keep it
                    tracked[message_id] = current
                self._report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "FIN")
            return False
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += 1
        if link.marks:
            link.touched.pop(message_id, None)
            link.seen.discard(message_id)
        return True

    def _finish_in_order(
        self, batch: list[Deliver], refused: list[Deliver] | None
    ) -> tuple[int, int]:
        """finish_many's common case without a Python loop: every delivery of ``batch`` is the
        next in its connection's queue (one read, answered in the order it came). Returns how
        many deliveries from the start of ``batch`` were answered, and how many of those were
        FIN'd (a FIN refused by the connection is reported, as finish() does); (0, 0) when it
        is not that case."""
        link = self._links.get(batch[0][0])
        if link is None:
            return 0, 0
        queue = link.queue
        head = link.head
        count = len(batch)
        if len(queue) - head < count:
            return 0, 0
        window = queue[head : head + count] if head or count < len(queue) else queue
        if not all(map(is_, batch, window)):
            return 0, 0
        ids = list(map(_id, batch))
        used = done = count
        try:
            link.send_fins(ids)  # all or nothing
        except LocalProtocolError:  # one id was already answered in the same read
            rest = iter(ids)
            try:
                deque(map(link.send_fin, rest), maxlen=0)
            except LocalProtocolError:
                done = count - len(list(rest)) - 1
                used = done + 1
                self._report_gone(batch[done], "FIN")
                if refused is not None:
                    refused.append(batch[done])
        self._queue_answered(link, head + used)
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += done
        if link.marks:  # TOUCHed or marked delivered: forget those marks too, as finish()
            fins = ids[:done] if done < count else ids
            if link.touched:
                deque(map(link.touched.pop, fins, repeat(None)), maxlen=0)
            if link.seen:
                link.seen.difference_update(fins)
        return used, done

    @staticmethod
    def _queue_answered(link: _Link, head: int) -> None:
        """``queue[:head]`` of ``link`` were answered."""
        if head >= len(link.queue):
            link.queue.clear()
            link.head = 0
        else:
            link.head = head

    def requeue(
        self,
        delivery: Deliver,
        now: float,
        delay: float | None = None,
        *,
        backoff: bool = True,
    ) -> bool:
        """REQ: hand the message back. Without ``delay``: ``default_requeue_delay * attempts``
        capped. ``backoff=False`` keeps this failure from slowing the consumer down."""
        if delay is not None and not (delay >= 0 and math.isfinite(delay)):
            raise LocalProtocolError(f"requeue delay must be >= 0 seconds, got {delay!r}")
        link = self._settle(delivery, "REQ")
        if link is None:
            return False
        assert link.proto is not None
        if delay is None:
            delay = self.requeue_delay(delivery.attempts, link.conn_id)
        else:
            # nsqd clamps REQ to its --max-req-timeout; we clamp to what the wire can carry.
            delay = min(delay, MAX_COMMAND_DELAY)
            if link.max_req_timeout is not None:
                delay = min(delay, link.max_req_timeout)
        self._emit_rdy(link)
        message_id = delivery.id
        if not link.proto.is_in_flight(message_id):  # already answered in the same read
            self._report_gone(delivery, "REQ")
            return False
        failed = backoff and self._config.backoff_active
        outcome = Outcome.FAILURE if failed else Outcome.NEUTRAL
        if self._state is ConsumerState.RUNNING and self._backoff.record(outcome, now):
            # Backoff starts (or a test ends): RDY 0 goes on the wire before the REQ, else
            # nsqd could hand the message straight back, in flight for the whole window.
            self._recalm()
            self._rebalance(now)
            self._emit_rdy(link)
            link.proto.requeue(message_id, delay)
            self.requeued += 1
            if link.conn_id in self._settling:
                self._answered_while_settling(link, delivery, now)
            return True
        link.proto.requeue(message_id, delay)
        self.requeued += 1
        self._after_answer(link, outcome, now, delivery, recorded=True)
        return True

    def touch(self, delivery: Deliver, now: float) -> float | None:
        """TOUCH: extend the message's timeout; returns the new deadline (None if not ours).
        The deadline never goes past received_at + the server's max_msg_timeout."""
        link = self._current(delivery)
        if link is None or link.proto is None:
            self._report_gone(delivery, "TOUCH")
            return None
        try:
            link.proto.touch(delivery.id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "TOUCH")
            return None
        self._dirty.add(link.conn_id)
        deadline = min(now + link.msg_timeout, delivery.received_at + link.max_msg_timeout)
        link.marks = True
        link.touched[delivery.id] = deadline
        return deadline

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once."""
        self._config = self._config.replace(max_in_flight=max_in_flight)
        if self._state is ConsumerState.RUNNING:
            self._rebalance(now)

    def fetch(
        self,
        batch: int,
        now: float,
        *,
        expires: float | None = None,
        no_wait: bool = False,
    ) -> int:
        """Pull mode: ask for up to ``batch`` messages; returns the request id its
        :class:`FetchResult` will carry. ``expires`` (seconds) ends the wait with what arrived;
        ``no_wait`` answers at once with what is buffered."""
        if not self._pull:
            raise LocalProtocolError("fetch() needs a coordinator created with pull=True")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if expires is not None and not (expires > 0 and math.isfinite(expires)):
            raise LocalProtocolError(f"fetch expires must be > 0 seconds or None, got {expires!r}")
        request_id = self._next_fetch_id
        self._next_fetch_id += 1
        request = FetchRequest(request_id, batch, None if expires is None else now + expires)
        if self._state is not ConsumerState.RUNNING:
            failed = self._state is ConsumerState.FAILED
            self._answer_fetch(request, FetchEnd.FAILED if failed else FetchEnd.DRAINING)
            return request_id
        if not no_wait and len(self._fetches.waiting) >= self._config.max_waiting_fetches:
            self._answer_fetch(request, FetchEnd.TOO_MANY_WAITING)
            return request_id
        buffer = self._fetches.buffer
        while buffer and request.remaining:
            _, delivery = buffer.popleft()
            link = self._current(delivery)
            if link is None:
                continue
            if link.touched.get(delivery.id, delivery.deadline) <= now:
                continue  # nsqd timed it out already: a stale copy, it will come again
            request.messages.append(delivery)
            request.remaining -= 1
        if no_wait:
            reason = FetchEnd.NO_WAIT if request.messages else FetchEnd.NO_MESSAGES
            self._answer_fetch(request, reason)
        elif request.remaining == 0:
            self._answer_fetch(request, FetchEnd.FILLED)
        else:
            self._fetches.add(request)
            self._rebalance(now)
        return request_id

    def cancel_fetch(self, request_id: int, now: float) -> None:
        """The caller gave up on fetch ``request_id`` (cancelled, timed out on its side).

        The request stops waiting, and whatever it had gathered (even an answer still queued
        in :meth:`take_actions`) goes back to the front of the hold buffer for the next fetch,
        so a cancelled fetch never swallows messages. Unknown or finished ids are ignored."""
        gathered: list[Deliver] = []
        for request in self._fetches.waiting:
            if request.request_id == request_id:
                self._fetches.remove(request)
                gathered = request.messages
                break
        else:
            for index, action in enumerate(self._actions):
                if isinstance(action, FetchResult) and action.request_id == request_id:
                    del self._actions[index]
                    gathered = list(action.messages)
                    for delivery in gathered:
                        link = self._links.get(delivery.conn_id)
                        if link is not None:
                            link.seen.discard(delivery.id)
                    break
        hold_until = now + self._config.pull_hold_timeout
        buffer = self._fetches.buffer
        for delivery in reversed(gathered):
            if self._current(delivery) is not None:
                buffer.appendleft((hold_until, delivery))
        if self._state is ConsumerState.RUNNING:
            self._rebalance(now)

    # --- internals: messages -------------------------------------------------------------------

    def _on_message(self, link: _Link, delivery: Deliver, now: float) -> None:
        """One message arrived on ``link`` (every case; the common one is inlined in
        :meth:`receive_data`)."""
        link.remaining -= 1
        link.last_message_at = now
        self.received += 1
        proto = link.proto
        assert proto is not None
        message_id = delivery.id
        if link.tracked:
            previous = link.tracked.pop(message_id, None)
            if previous is not None:  # sent again: the copy the user holds timed out on nsqd
                link.touched.pop(message_id, None)
                link.seen.discard(message_id)
                if self._pull:
                    self._forget_gathered(previous)
                self._report_gone(previous, "TIMEOUT")
        if not proto.is_in_flight(message_id):
            return  # a copy earlier in this read was already answered: nsqd has one copy only
        if not link.accepting:
            self._emit_rdy(link)  # RDY 0 goes before the REQ
            proto.requeue(message_id, 0.0)  # draining: give it to another consumer at once
            self.requeued += 1
            return
        max_attempts = self._max_attempts
        if max_attempts and delivery.attempts > max_attempts:
            proto.finish(message_id)
            self.given_up += 1
            self._actions.append(GiveUp(link.conn_id, link.address, delivery.message))
            if self._backoff.record(Outcome.NEUTRAL, now):
                self._recalm()
                self._rebalance(now)
            return
        link.tracked[message_id] = delivery
        if self._pull:
            self._on_pull_messages(link, [delivery], now)
            return
        self._actions.append(delivery)
        self._after_messages(link, now)

    def _after_messages(self, link: _Link, now: float) -> None:
        """After messages arrived: warm a new connection up, refresh RDY when it runs low."""
        if not link.warm:
            link.warm = True
            self._rebalance(now)
        if link.target and needs_refresh(link.remaining, link.rdy):
            self._send_rdy(link, min(link.target, self._budget_left(link)), now)

    def _pull_receive(self, link: _Link, deliveries: list[Deliver], now: float) -> None:
        """A read of fresh messages in pull mode (the checks are the caller's): tracked by
        position as in push mode, then handed to the waiting fetches as one batch."""
        count = len(deliveries)
        queue = link.queue
        if not queue:
            link.queue = deliveries  # a new list, the decoder's, not kept elsewhere
        else:
            if link.head:
                del queue[: link.head]
                link.head = 0
            queue += deliveries
        self.received += count
        link.remaining -= count
        link.last_message_at = now
        self._on_pull_messages(link, deliveries, now)

    def _on_pull_messages(self, link: _Link, deliveries: list[Deliver], now: float) -> None:
        """Messages (tracked already) arrived on ``link``, in order: use up its share, give
        them to the waiting fetches (oldest first), hold the rest for the next fetch."""
        count = len(deliveries)
        self._pull_seq += count
        link.pull_seq = self._pull_seq
        used_up = False
        alloc = link.alloc
        if alloc > 0:
            used = count if count < alloc else alloc
            link.alloc = alloc - used
            self._alloc_total -= used
            if used == alloc:
                used_up = True
                link.target = 0
                self._send_rdy(link, 0, now)
        fetches = self._fetches
        given = 0
        if fetches.waiting:
            filled, given = fetches.give_many(deliveries)
            for request in filled:
                self._answer_fetch(request, FetchEnd.FILLED)
        if given < count:
            hold_until = now + self._config.pull_hold_timeout
            fetches.buffer.extend(
                zip(repeat(hold_until), deliveries[given:] if given else deliveries)
            )
        if self._alloc_total > fetches.outstanding or (used_up and fetches.outstanding):
            # A link that used up its share while others may sit on empty nsqd: top it up
            # from theirs now (it is active; they keep a probe), not after an idle timeout.
            self._rebalance(now)

    def _current(self, delivery: Deliver) -> _Link | None:
        """The link of a delivery that is still in flight here, else None."""
        link = self._links.get(delivery.conn_id)
        if link is None or link.tracked.get(delivery.id) is not delivery:
            return None
        return link

    def _settle(self, delivery: Deliver, command: str) -> _Link | None:
        """Forget a delivery about to be answered; None (and a TakenBack) if not ours."""
        link = self._links.get(delivery.conn_id)
        if link is not None and link.tracked.get(delivery.id) is delivery:
            del link.tracked[delivery.id]
            if link.touched:
                link.touched.pop(delivery.id, None)
            if link.seen:
                link.seen.discard(delivery.id)
            self._dirty.add(link.conn_id)
            return link
        self._report_gone(delivery, command)
        return None

    def _report_gone(self, delivery: Deliver, command: str) -> None:
        self.taken_back += 1
        self._actions.append(
            TakenBack(
                delivery.conn_id,
                delivery.address,
                delivery.id,
                command,
                MessageGone(
                    f"{command} for message {delivery.id!r} from {delivery.address}: "
                    "it is no longer in flight on this consumer (connection closed, requeued "
                    "by drain, or delivered again after timing out)"
                ),
                delivery,
            )
        )

    def _after_answer(
        self,
        link: _Link,
        outcome: Outcome,
        now: float,
        delivery: Deliver,
        *,
        recorded: bool = False,
    ) -> None:
        """``delivery`` was answered on ``link``. ``recorded``: the outcome was already given
        to backoff (and changed nothing)."""
        if link.conn_id in self._settling:
            self._answered_while_settling(link, delivery, now)
        if self._state is ConsumerState.RUNNING:
            if not recorded and self._backoff.record(outcome, now):
                self._recalm()
                self._rebalance(now)
            elif self._pull and link.alloc > 0:
                count = self._live_in_flight(link, now) + link.alloc
                self._send_rdy(link, min(count, self._budget_left(link)), now)
        elif self._state is ConsumerState.DRAINING:
            self._maybe_close_drained(link, now)
            self._check_drained()

    def _requeue_now(self, link: _Link, delivery: Deliver) -> None:
        message_id = delivery.id
        del link.tracked[message_id]
        link.touched.pop(message_id, None)
        link.seen.discard(message_id)
        assert link.proto is not None
        if link.proto.is_in_flight(message_id):
            self._emit_rdy(link)  # drain's RDY 0 goes before the REQ
            link.proto.requeue(message_id, 0.0)
            self._dirty.add(link.conn_id)
            self.requeued += 1

    def _flush_buffer(self, now: float | None) -> None:
        """Requeue held pull messages whose hold ended (all of them when ``now`` is None)."""
        buffer = self._fetches.buffer
        while buffer and (now is None or buffer[0][0] <= now):
            _, delivery = buffer.popleft()
            link = self._current(delivery)
            if link is not None:
                self._requeue_now(link, delivery)

    def _answer_fetch(self, request: FetchRequest, reason: FetchEnd) -> None:
        # Every message a request gathered is still ours: those of a lost connection and
        # those nsqd delivered again leave the requests at once (_forget_pull_messages,
        # _forget_gathered), so the answer is the gathered list as is.
        messages = tuple(request.messages)
        if self._explicit_delivery:  # a fetch answer is in the user's hands
            for delivery in messages:
                self._links[delivery.conn_id].seen.add(delivery.id)
        self._actions.append(FetchResult(request.request_id, messages, reason))

    # --- internals: connection events ----------------------------------------------------------

    def _on_event(self, link: _Link, event: object, now: float) -> None:
        if isinstance(event, Deliver):
            self._on_message(link, event, now)
        elif isinstance(event, MessageTakenBack):
            # FIN/REQ: already forgotten here. TOUCH: the user still holds it; their FIN/REQ
            # goes out and nsqd answers E_*_FAILED again, harmlessly.
            self.taken_back += 1
            # A refused TOUCH is about the copy held now (nsqd had none in flight when it came,
            # so a newer copy comes after it); a refused FIN/REQ's handle is already forgotten.
            held = (
                link.tracked.get(event.message_id)
                if event.command == "TOUCH" and event.message_id is not None
                else None
            )
            self._actions.append(
                TakenBack(
                    link.conn_id,
                    link.address,
                    event.message_id,
                    event.command,
                    event.error,
                    held,
                )
            )
            if self._state is ConsumerState.DRAINING:
                self._maybe_close_drained(link, now)
                self._check_drained()
        elif isinstance(event, TLSUpgradeRequired):
            self._actions.append(StartTLS(link.conn_id, event.trailing_data))
        elif isinstance(event, ConnectionReady):
            assert link.proto is not None
            if self._state is not ConsumerState.RUNNING:
                self._drop(link, None, now, close=True)
                return
            link.proto.subscribe(self.topic, self.channel)
            self._dirty.add(link.conn_id)
        elif isinstance(event, Subscribed):
            self._on_subscribed(link, now)
        elif isinstance(event, CloseWait):
            link.close_wait = True
            self._maybe_close_drained(link, now)
            self._check_drained()
        elif isinstance(event, ConnectionClosed):
            self._drop(link, event.error, now, close=True)

    def _close_from_events(self, link: _Link, events: list[Event], now: float) -> None:
        error: NSQError | None = ConnectionLost(f"connection {link.conn_id} closed")
        for event in events:
            if isinstance(event, MessageTakenBack):
                self.taken_back += 1
                self._actions.append(
                    TakenBack(
                        link.conn_id, link.address, event.message_id, event.command, event.error
                    )
                )
            elif isinstance(event, ConnectionClosed):
                error = event.error
        self._drop(link, error, now, close=True)

    def _on_subscribed(self, link: _Link, now: float) -> None:
        proto = link.proto
        assert proto is not None
        settings = proto.settings or ServerSettings.default()
        link.phase = LinkPhase.SUBSCRIBED
        link.accepting = self._state is ConsumerState.RUNNING
        link.handshake_deadline = None
        link.settle_delay = max(RDY_SETTLE_MIN, 4 * (now - link.connected_at))
        link.max_rdy = max(1, settings.max_rdy_count)
        link.msg_timeout = settings.msg_timeout / 1000
        link.max_msg_timeout = max(settings.max_msg_timeout / 1000, link.msg_timeout)
        max_req = settings.raw.get("max_req_timeout") if settings.raw else None
        if isinstance(max_req, int) and not isinstance(max_req, bool) and max_req >= 0:
            link.max_req_timeout = max_req / 1000
        retry = self._direct.get(link.address)
        if retry is not None:
            retry.failures = 0
        self._actions.append(ConnectionUp(link.conn_id, link.address, settings))
        if self._state is not ConsumerState.RUNNING:
            self._maybe_close_drained(link, now)
            return
        self._rebalance(now)

    def _on_lookup(
        self, request_id: int, outcome: LookupAnswer | LookupFailure | None, now: float
    ) -> None:
        if outcome is None:
            return
        self._actions.append(CloseHTTPRequest(request_id))
        if isinstance(outcome, LookupFailure):
            self._actions.append(LookupdFailed(outcome.lookupd, outcome.error))
            return
        if self._state is not ConsumerState.RUNNING:
            return
        for address in outcome.producers:
            if address not in self._by_address:
                self._connect(address, now)

    def _connect(self, address: NSQDAddress, now: float) -> None:
        conn_id = self._next_conn_id
        self._next_conn_id += 1
        link = _Link(conn_id, address, now + self._config.connect_timeout)
        self._links[conn_id] = link
        self._by_address[address] = link
        self._actions.append(Connect(conn_id, address))

    def _drop(self, link: _Link, error: NSQError | None, now: float, *, close: bool) -> None:
        """Forget a connection: its RDY, its messages (nsqd requeues them), maybe reconnect."""
        conn_id = link.conn_id
        if self._links.pop(conn_id, None) is None:
            return
        if self._by_address.get(link.address) is link:
            del self._by_address[link.address]
        self._dirty.discard(conn_id)
        self._rdy_due.discard(conn_id)
        self._total_rdy -= link.rdy
        self._alloc_total -= link.alloc
        self._claimed -= link.claim
        link.rdy = link.alloc = link.target = link.claim = link.ceiling = 0
        if self._settling:
            self._settling.discard(conn_id)
            if not self._settling:
                self._recalm()
        final = b""
        if link.proto is not None:
            final = link.proto.data_to_send()
            link.proto.close()
        if close:
            self._actions.append(CloseConnection(conn_id, final))
        unanswered = tuple(link.tracked)
        link.tracked.clear()
        link.touched.clear()
        link.seen.clear()
        link.accepting = False
        if self._pull and unanswered:
            self._forget_pull_messages(conn_id)
        # nsqd refused the configuration: reconnecting cannot help, the consumer fails.
        refused = isinstance(error, IdentifyRejected) and self._state is ConsumerState.RUNNING
        reconnect_at: float | None = None
        retry = self._direct.get(link.address)
        if retry is not None and self._state is ConsumerState.RUNNING and not refused:
            retry.failures += 1
            config = self._config
            reconnect_at = now + reconnect_delay(
                retry.failures,
                config.reconnect_delay,
                config.max_reconnect_delay,
                config.reconnect_jitter,
                self._rng,
            )
            retry.retry_at = reconnect_at
        if link.phase is not LinkPhase.CONNECTING or error is not None:
            self._actions.append(
                Disconnected(conn_id, link.address, error, unanswered, reconnect_at)
            )
        if refused:
            assert error is not None
            self._fail(error, now)
        elif self._state is ConsumerState.RUNNING:
            self._rebalance(now)
        else:
            self._check_drained()

    def _fail(self, error: NSQError, now: float) -> None:
        """Stop for good (:class:`ConsumerFailed`): no reconnect, no lookupd poll; what is in
        flight is requeued at once (nobody can answer it any more) and every connection
        closed. One rule for every node: the configuration is the same for all of them, so
        one refusal fails the consumer rather than leaving that nsqd's messages unread."""
        self._state = ConsumerState.FAILED
        self._failure = error
        self._calm = False
        self._backoff.reset()
        if self._poller is not None:
            for request_id in self._poller.stop():
                self._actions.append(CloseHTTPRequest(request_id))
        for retry in self._direct.values():
            retry.retry_at = None
        for link in self._links.values():
            link.accepting = False
            if link.phase is LinkPhase.SUBSCRIBED:
                if link.rdy:
                    self._send_rdy(link, 0, now)  # before the REQs, as a drain does
                for delivery in list(link.tracked.values()):
                    self._requeue_now(link, delivery)
        if self._pull:  # what they gathered was just requeued: the answers are empty
            for fetch in self._fetches.take_all():
                fetch.messages = []
                self._answer_fetch(fetch, FetchEnd.FAILED)
            self._fetches.buffer.clear()
        for link in list(self._links.values()):
            self._drop(link, None, now, close=True)
        self._actions.append(ConsumerFailed(error))

    def _forget_pull_messages(self, conn_id: int) -> None:
        fetches = self._fetches
        kept = [(t, d) for t, d in fetches.buffer if d.conn_id != conn_id]
        fetches.buffer.clear()
        fetches.buffer.extend(kept)
        for request in fetches.waiting:
            lost = [d for d in request.messages if d.conn_id == conn_id]
            if lost:
                request.messages = [d for d in request.messages if d.conn_id != conn_id]
                request.remaining += len(lost)
                fetches.outstanding += len(lost)

    def _forget_gathered(self, delivery: Deliver) -> None:
        """nsqd delivered ``delivery``'s message again (it timed out there): a waiting request
        that gathered the old copy loses it and waits for one more message (rare: a request
        answers AGED long before its messages time out)."""
        fetches = self._fetches
        for request in fetches.waiting:
            messages = request.messages
            for index, gathered in enumerate(messages):
                if gathered is delivery:
                    del messages[index]
                    request.remaining += 1
                    fetches.outstanding += 1
                    return

    # --- internals: drain ----------------------------------------------------------------------

    def _maybe_close_drained(self, link: _Link, now: float) -> None:
        if self._state is ConsumerState.RUNNING or link.conn_id not in self._links:
            return
        if link.phase is LinkPhase.SUBSCRIBED and not link.tracked:
            assert link.proto is not None
            link.accepting = False
            self._emit_rdy(link)
            link.proto.close()  # CLS
            self._dirty.add(link.conn_id)
            link.phase = LinkPhase.CLOSING
            base = self._drain_deadline if self._drain_deadline is not None else now
            link.close_deadline = max(base, now) + CLOSE_WAIT_GRACE
        elif link.phase is LinkPhase.CLOSING and link.close_wait and not link.tracked:
            self._drop(link, None, now, close=True)

    def _check_drained(self) -> None:
        if self._state is ConsumerState.DRAINING and not self._links:
            self._state = ConsumerState.CLOSED
            self._drain_deadline = None
            self._actions.append(DrainComplete())

    def _recalm(self) -> None:
        self._calm = (
            self._state is ConsumerState.RUNNING
            and not self._pull
            and self._backoff.phase is BackoffPhase.NORMAL
            and not self._settling
        )

    # --- internals: RDY ------------------------------------------------------------------------

    def _send_rdy(self, link: _Link, count: int, now: float) -> None:
        proto = link.proto
        assert proto is not None
        count = max(0, min(count, link.max_rdy))
        if count == 0 and link.rdy == 0:
            return
        if count == link.rdy:
            link.rdy_refresh = True
        self._rdy_due.add(link.conn_id)
        self._dirty.add(link.conn_id)
        if count and not link.rdy:
            link.rdy_at = now
        elif count < link.rdy:
            link.settle_at = now + link.settle_delay
        self._total_rdy += count - link.rdy
        link.rdy = count
        link.remaining = count
        self._reclaim(link)

    def _emit_rdy(self, link: _Link) -> None:
        """Hand the RDY decided for ``link`` to its connection, unless nsqd has it already."""
        if link.conn_id not in self._rdy_due:
            return
        self._rdy_due.discard(link.conn_id)
        if link.rdy != link.wire_rdy or link.rdy_refresh:
            assert link.proto is not None
            link.proto.send_ready(link.rdy)
            link.wire_rdy = link.rdy
            if link.rdy > link.ceiling:
                link.ceiling = link.rdy
            elif link.ceiling > link.rdy and link.conn_id not in self._settling:
                # Lowered: nsqd may still send under the old RDY until it reads this one.
                self._settling.add(link.conn_id)
                self._calm = False
            self._reclaim(link)
        link.rdy_refresh = False

    # --- internals: the max_in_flight bound ----------------------------------------------------
    #
    # nsqd sends on a connection while its in-flight count is below the RDY it last read, so
    # the sum of RDY alone does not bound what the user holds: a lowered RDY leaves what is
    # already in flight there (and what nsqd sent before reading it) in the user's hands. Each
    # connection's *ceiling* bounds what it can still come to hold: raised with each RDY
    # written; after a lowered RDY, one less for every answer written after it (nsqd reads it
    # before those answers, so it can send again only under the new RDY), down to that RDY; and
    # at ``settle_at`` (the old RDY's messages have arrived by then) down to what is held. A
    # raise never takes the sum of ``max(ceiling, RDY)`` over max_in_flight, so the messages
    # held, everywhere, stay within it (not counting those whose deadline passed: nsqd took them
    # back and counts them no more).

    def _reclaim(self, link: _Link) -> None:
        """Recount ``link``'s claim after its RDY or ceiling changed."""
        claim = link.ceiling if link.ceiling > link.rdy else link.rdy
        self._claimed += claim - link.claim
        link.claim = claim

    def _budget_left(self, link: _Link) -> int:
        """The most RDY ``link`` may have: max_in_flight minus what the others may hold."""
        return self._config.max_in_flight - self._claimed + link.claim

    def _settled(self, link: _Link) -> None:
        """``link`` can hold no more than its written RDY again."""
        link.settle_at = None
        self._settling.discard(link.conn_id)
        if not self._settling:
            self._recalm()

    def _answered_while_settling(self, link: _Link, delivery: Deliver, now: float) -> None:
        """A FIN/REQ for ``delivery`` went out after ``link``'s lowered RDY: nsqd reads it after
        that RDY, so one slot of the old RDY is free for good and goes to whoever waits for it.
        Not so for a message nsqd may have timed out already (its slot was freed then, and
        maybe filled again): those are counted when the ceiling settles."""
        if delivery.deadline - now <= link.settle_delay:
            return
        if link.ceiling > link.wire_rdy:
            link.ceiling -= 1
        if link.ceiling <= link.wire_rdy:
            self._settled(link)
        self._reclaim(link)
        if self._state is ConsumerState.RUNNING:
            self._grant(now)

    def _settle_due(self, now: float) -> None:
        """Release the ceilings whose settle time came: what nsqd sent under an old RDY has
        arrived, so the ceiling falls to the RDY, or to the messages still held (unexpired)."""
        released = False
        for conn_id in list(self._settling):
            link = self._links[conn_id]
            if link.settle_at is None or now < link.settle_at:
                continue
            live, expiry = self._live_count(link, now)
            ceiling = max(link.wire_rdy, live)
            released = released or ceiling < link.ceiling
            link.ceiling = ceiling
            if ceiling > link.wire_rdy:
                link.settle_at = expiry  # the user holds more than the RDY: wait for answers
            else:
                self._settled(link)
            self._reclaim(link)
        if released and self._state is ConsumerState.RUNNING:
            self._grant(now)

    def _grant(self, now: float) -> None:
        """Budget came back: raise the connections still below their share."""
        if self._pull:
            self._rebalance(now)
        else:
            self._raise_to_targets(self._subscribed(), now)

    def _raise_to_targets(self, links: list[_Link], now: float) -> None:
        """Raise every link below its target as far as the bound allows. In push mode a link
        that has RDY is raised by at least a quarter of its target (or to it), so budget that
        comes back one answer at a time is not written as one RDY per answer."""
        for link in links:
            if link.rdy < link.target:
                count = min(link.target, self._budget_left(link))
                if count <= link.rdy:
                    continue
                if (
                    count < link.target
                    and link.rdy
                    and not self._pull
                    and (count - link.rdy) * 4 < link.target
                ):
                    continue
                self._send_rdy(link, count, now)

    def _budget(self) -> int:
        if self._state is not ConsumerState.RUNNING:
            return 0
        return self._backoff.rdy_budget(self._config.max_in_flight)

    def _subscribed(self) -> list[_Link]:
        return [link for link in self._links.values() if link.phase is LinkPhase.SUBSCRIBED]

    def _rebalance(self, now: float, exclude: frozenset[int] = frozenset()) -> None:
        """Recompute every connection's RDY target and send what changed (lower ones first)."""
        links = self._subscribed()
        if not links:
            self._next_expiry = None  # nothing in flight anywhere: no expiry to wake up for
            return
        budget = self._budget()
        if self._pull:
            # What nsqd counts in flight: messages past their deadline were taken back already
            # (a stuck handler must not hold the budget forever).
            self._next_expiry = None
            live = [self._live_in_flight(link, now) for link in links]
            wanted = max(0, min(self._fetches.outstanding, budget - sum(live)))
            caps = [max(0, link.max_rdy - n) for link, n in zip(links, live, strict=True)]
            allocs = self._pull_shares(links, wanted, now, exclude, caps)
            self._alloc_total = sum(allocs)
            targets = []
            for link, alloc, n in zip(links, allocs, live, strict=True):
                link.alloc = alloc
                targets.append(n + alloc if alloc else 0)
        elif budget >= len(links):
            targets = even_shares(budget, [link.max_rdy if link.warm else 1 for link in links])
        else:
            targets = self._pick_holders(links, budget, now, exclude, [1] * len(links))
        for link, target in zip(links, targets, strict=True):
            link.target = target
        for link in links:
            if link.rdy > link.target:
                self._send_rdy(link, link.target, now)
        if self._claimed > self._config.max_in_flight:
            # max_in_flight was lowered under what may be held: no connection takes a new
            # message (RDY 0) until enough is answered; then the shares come back.
            for link in links:
                if link.rdy:
                    self._send_rdy(link, 0, now)
            return
        self._raise_to_targets(links, now)

    def _live_in_flight(self, link: _Link, now: float) -> int:
        """Messages held here that nsqd still counts in flight (deadline not passed); notes the
        next deadline so the budget is recomputed when it passes (pull mode)."""
        live, expiry = self._live_count(link, now)
        if expiry is not None and (self._next_expiry is None or expiry < self._next_expiry):
            self._next_expiry = expiry
        return live

    @staticmethod
    def _live_count(link: _Link, now: float) -> tuple[int, float | None]:
        """How many messages held on ``link`` nsqd still counts in flight (deadline not
        passed), and the earliest of their deadlines (or an earlier time: a wake-up to look
        again). Before ``link.live_floor`` no held message can have expired, so that is one
        count, not a walk over them (the budget is recomputed after every fetch and answer)."""
        floor = link.live_floor
        if now < floor:
            held = link.held_count()
            return held, (floor if held > 0 else None)
        live = 0
        touched = link.touched
        expiry: float | None = None
        for message_id, delivery in link.tracked.items():
            deadline = touched.get(message_id, delivery.deadline) if touched else delivery.deadline
            if deadline > now:
                live += 1
                if expiry is None or deadline < expiry:
                    expiry = deadline
        # Held messages past their deadline count no more, but may still be answered (and
        # leave): until they are gone, every look walks again. Otherwise nothing held expires
        # before the earliest deadline; messages read later lower the floor (receive_data).
        if live == len(link.held):
            link.live_floor = math.inf if expiry is None else expiry
        return live, expiry

    def _pull_shares(
        self,
        links: list[_Link],
        wanted: int,
        now: float,
        exclude: frozenset[int],
        caps: list[int],
    ) -> list[int]:
        """Pull mode: spread the outstanding fetch budget (``wanted``) over ``links``.

        Links that delivered within ``low_rdy_idle_timeout`` are *active*: they get the
        budget, while every idle link keeps a probe of 1 (so messages that show up on any
        nsqd are still found; a probe that delivers makes its link active). With no active
        link (or all of them active) the budget is spread evenly. With fewer RDY than links,
        active links come first, most recent first. The caller rebalances as soon as a link
        has used up its share, so budget parked on an empty nsqd moves to the busy one at once.
        """
        n = len(links)
        usable = [i for i in range(n) if caps[i] > 0]
        if wanted <= 0 or not usable:
            return [0] * n
        recent_after = now - self._config.low_rdy_idle_timeout
        active = [
            i
            for i in usable
            if links[i].last_message_at > recent_after and links[i].conn_id not in exclude
        ]
        active.sort(key=lambda i: (links[i].last_message_at, links[i].pull_seq), reverse=True)
        if wanted < len(usable):
            return self._pick_holders(links, wanted, now, exclude, caps, active)
        if not active or len(active) == len(usable):
            return even_shares(wanted, caps)
        shares = [0] * n
        chosen = set(active)
        idle = [i for i in usable if i not in chosen]
        for i in idle:
            shares[i] = 1
        rest = wanted - len(idle)
        for i, share in zip(active, even_shares(rest, [caps[i] for i in active]), strict=True):
            shares[i] = share
            rest -= share
        if rest > 0:  # the active links are capped: the idle ones take the rest
            extra = even_shares(rest, [caps[i] - 1 for i in idle])
            for i, share in zip(idle, extra, strict=True):
                shares[i] += share
        return shares

    def _pick_holders(
        self,
        links: list[_Link],
        count: int,
        now: float,
        exclude: frozenset[int],
        caps: list[int],
        first: Sequence[int] = (),
    ) -> list[int]:
        """Fewer RDY than connections: 1 each to ``first`` (pull mode's active links), then
        the current holders, then at random."""
        shares = [0] * len(links)
        if count <= 0:
            return shares
        if first:
            for i in first[:count]:
                shares[i] = 1
            count -= min(count, len(first))
            if count == 0:
                return shares
            caps = [0 if shares[i] else cap for i, cap in enumerate(caps)]
        held = [i for i, link in enumerate(links) if link.target > 0 and caps[i] > 0]
        if len(held) > count:
            held.sort(key=lambda i: links[i].last_message_at, reverse=True)
            held = held[:count]
        free = [
            i
            for i, link in enumerate(links)
            if i not in held and caps[i] > 0 and link.conn_id not in exclude
        ]
        if len(held) + len(free) < count:  # not enough fresh ones: allow the excluded back
            free += [
                i for i, link in enumerate(links) if i not in held and i not in free and caps[i] > 0
            ]
        chosen = held + self._rng.sample(free, min(len(free), count - len(held)))
        for i in chosen:
            shares[i] = 1
        return shares

    def _redistribute(self, now: float) -> None:
        """Periodic check: warm up idle newcomers, and with fewer RDY than connections move
        RDY away from connections that received nothing for low_rdy_idle_timeout, or that
        held it for low_rdy_timeout (so a busy nsqd cannot keep it from the others)."""
        links = self._subscribed()
        if not links:
            return
        idle_after = self._config.low_rdy_idle_timeout
        held_too_long = self._config.low_rdy_timeout
        released: set[int] = set()
        scarce = self._budget() < len(links) or (self._pull and self._alloc_total < len(links))
        for link in links:
            if not link.warm and now - link.rdy_at >= self._config.rdy_redistribute_interval:
                link.warm = True
            if (
                scarce
                and link.target > 0
                and (
                    now - max(link.last_message_at, link.rdy_at) >= idle_after
                    or now - link.rdy_at >= held_too_long
                )
            ):
                released.add(link.conn_id)
                link.target = 0
                if self._pull:
                    self._alloc_total -= link.alloc
                    link.alloc = 0
                self._send_rdy(link, 0, now)
        self._rebalance(now, frozenset(released))

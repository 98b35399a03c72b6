"""One nsqd connection as the consumer coordinator sees it (:class:`Link`), and its phases.

A link holds what the coordinator's parts decide about one connection: its phase
(:class:`LinkPhase`), the RDY decided and the RDY written, the ceiling that bounds what it may
still come to hold (the max_in_flight bound), the messages in flight with the handles the user
answers with (by position for the latest reads, by id otherwise), TOUCHed deadlines and the
server's limits. It owns no policy: the coordinator's parts read and write its fields (the RDY
fields only through the ledger, :mod:`~nsq_sansio.consumer.ledger`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from operator import itemgetter

from ..connection import ClientConnection
from ..discovery import NSQDAddress
from ..errors import LocalProtocolError
from .actions import DELIVER_ID, Deliver

__all__ = ["RDY_SETTLE_MIN", "Link", "LinkPhase", "current_link"]

#: After an RDY is lowered, nsqd may still have sent messages under the old one (on the wire,
#: or read but not yet handed over by the transport). That capacity is only given to another
#: connection once those messages have been answered, or this long after the lowered RDY was
#: decided (at least; 4x the connection's handshake time when that is longer).
RDY_SETTLE_MIN = 0.25

_id: Callable[[Deliver], bytes] = itemgetter(DELIVER_ID)


def fin_before_setup(message_id: bytes) -> None:  # pragma: no cover - never called: no message yet
    raise LocalProtocolError("FIN on a connection that is not set up")


def fins_before_setup(message_ids: list[bytes]) -> None:  # pragma: no cover - as fin_before_setup
    raise LocalProtocolError("FIN on a connection that is not set up")


class LinkPhase(enum.Enum):
    """Where one connection is, from the coordinator's point of view."""

    CONNECTING = "connecting"  # Connect emitted, TCP not up yet
    HANDSHAKING = "handshaking"  # IDENTIFY / TLS / AUTH / SUB under way
    SUBSCRIBED = "subscribed"  # messages may flow
    CLOSING = "closing"  # CLS sent, waiting for CLOSE_WAIT


class Link:
    """One connection as the coordinator sees it: phase, RDY and its bound, the messages in
    flight with their handles, the server's limits (mutable; the coordinator's parts share it)."""

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
        "dry_at",
        "handshake_deadline",
        "head",
        "held",
        "last_message_at",
        "live_floor",
        "lowered_at",
        "marks",
        "max_msg_timeout",
        "max_rdy",
        "max_req_timeout",
        "msg_timeout",
        "phase",
        "proto",
        "pull_seq",
        "queue",
        "raised_at",
        "rdy",
        "rdy_at",
        "rdy_refresh",
        "remaining",
        "seen",
        "send_fin",
        "send_fins",
        "settle_at",
        "settle_delay",
        "share_at",
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
        #: one (see :mod:`~nsq_sansio.consumer.ledger`). ``claim`` is
        #: ``max(ceiling, rdy)``, this connection's part of ``max_in_flight``.
        self.ceiling = 0
        self.claim = 0
        #: When the part of ``ceiling`` above ``max(wire_rdy, messages held)`` is released:
        #: by then nsqd has read the lowered RDY and what it sent before has arrived.
        self.settle_at: float | None = None
        self.settle_delay = RDY_SETTLE_MIN
        #: When RDY was last decided lower (its settle time starts when it is written).
        self.lowered_at = -math.inf
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
        #: Pull mode: when this link last passed its scarce RDY on because it delivered
        #: nothing while a fetch waited (not active again until it delivers; the links that
        #: ran dry longest ago are tried first). -inf: never.
        self.dry_at = -math.inf
        #: When RDY was last raised (pull mode: RDY left unused a settle time after this and
        #: after the last message means nsqd has nothing more to send).
        self.raised_at = -math.inf
        #: Pull mode: since when this link has held a share without delivering or passing it
        #: on. A share given back between two fetches and given again does not restart it
        #: (each fetch that expires lowers RDY to 0 for a moment): a holder whose nsqd has
        #: nothing must still run dry and pass its RDY on.
        self.share_at = -math.inf
        #: Pull mode: which link delivered last (ties of ``last_message_at`` in one read).
        self.pull_seq = 0
        #: No message held here reaches its deadline before this (a lower bound, lowered by
        #: each read, recomputed by a scan): until then every held message is live, so the
        #: pull budget needs no walk over them (see :meth:`live_count`). -inf: scan next time.
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
        self.send_fin: Callable[[bytes], None] = fin_before_setup
        #: ``proto.finish_many``: FIN a list of ids, all or nothing.
        self.send_fins: Callable[[list[bytes]], None] = fins_before_setup
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

    def track_read(self, deliveries: list[Deliver], now: float) -> None:
        """A read of fresh messages (the decoder's new list, kept as is when the queue is
        empty): tracked by position, counted against RDY, noted as the last delivery."""
        queue = self.queue
        if not queue:
            self.queue = deliveries
        else:
            if self.head:
                del queue[: self.head]
                self.head = 0
            queue += deliveries
        self.remaining -= len(deliveries)
        self.last_message_at = now

    def held_count(self) -> int:
        """``len(self.tracked)``, without moving the queue."""
        return len(self.held) + len(self.queue) - self.head

    def live_count(self, now: float) -> tuple[int, float | None]:
        """How many messages held here nsqd still counts in flight (deadline not passed), and
        the earliest of their deadlines (or an earlier time: a wake-up to look again). Before
        ``live_floor`` no held message can have expired, so that is one count, not a walk over
        them (the pull budget is recomputed after every fetch and answer)."""
        floor = self.live_floor
        if now < floor:
            held = self.held_count()
            return held, (floor if held > 0 else None)
        live = 0
        touched = self.touched
        expiry: float | None = None
        for message_id, delivery in self.tracked.items():
            deadline = touched.get(message_id, delivery.deadline) if touched else delivery.deadline
            if deadline > now:
                live += 1
                if expiry is None or deadline < expiry:
                    expiry = deadline
        # Held messages past their deadline count no more, but may still be answered (and
        # leave): until they are gone, every look walks again. Otherwise nothing held expires
        # before the earliest deadline; messages read later lower the floor (receive_data).
        if live == len(self.held):
            self.live_floor = math.inf if expiry is None else expiry
        return live, expiry


def current_link(links: dict[int, Link], delivery: Deliver) -> Link | None:
    """The link of a delivery that is still in flight there, else None."""
    link = links.get(delivery.conn_id)
    if link is None or link.tracked.get(delivery.id) is not delivery:
        return None
    return link

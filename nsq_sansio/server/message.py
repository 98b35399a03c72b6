"""One message as nsqd keeps it, and the ids it is given (nsqd's ``message.go`` and ``guid.go``).

A :class:`Message` is one message on one topic or channel: each channel gets its own copy,
sharing the id and body, and the copy carries that channel's delivery bookkeeping (attempts, the
client it is in flight to, its live timer). :class:`MessageIds` hands out 16-hex-digit ids from
a node id and a counter that starts at a random point, so ids from before a restart (still in a
durable backend) are very unlikely to come back. The conversion to and from a backend record is
here too, so the queues that spill to a backend need not know the record's layout.
"""

from __future__ import annotations

import random

from .backend import BackendRecord, encode_record

__all__ = ["MAX_ATTEMPTS", "Message", "MessageIds", "from_record", "to_record"]

#: The attempts counter is a uint16 on the wire: it stops there.
MAX_ATTEMPTS = 0xFFFF
_ID_COUNTER_BITS = 54
_ID_COUNTER_MASK = (1 << _ID_COUNTER_BITS) - 1


class Message:
    """One message on one channel (each channel gets its own copy, sharing id and body)."""

    __slots__ = (
        "attempts",
        "body",
        "deferred",
        "delivered_at",
        "id",
        "owner",
        "timer",
        "timestamp",
    )

    def __init__(
        self,
        message_id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int = 0,
        deferred: float = 0.0,
    ) -> None:
        self.id = message_id
        self.body = body
        self.timestamp = timestamp
        self.attempts = attempts
        self.deferred = deferred  # seconds to hold back when it reaches a channel (DPUB)
        self.owner = 0  # connection id it is in flight to
        self.delivered_at = 0.0
        self.timer = -1  # sequence number of its live in-flight heap entry, -1 when none


def from_record(record: BackendRecord) -> Message:
    """A message read back from a backend."""
    return Message(record.message_id, record.body, record.timestamp_ns, record.attempts)


def to_record(msg: Message) -> bytes:
    """A message as a backend stores it."""
    return encode_record(msg.id, msg.timestamp, msg.attempts, msg.body)


class MessageIds:
    """nsqd's message ids: the node id in the top bits, a counter below (``guid.go``)."""

    __slots__ = ("_base", "_counter")

    def __init__(self, node_id: int, rng: random.Random) -> None:
        self._base = node_id << _ID_COUNTER_BITS
        # Start the counter at a random point so ids from before a restart (still in a durable
        # backend) are very unlikely to be handed out again.
        self._counter = rng.getrandbits(_ID_COUNTER_BITS - 2)

    def new_id(self) -> bytes:
        """The next id: 16 lowercase hex digits."""
        counter = self._counter
        self._counter = counter + 1
        return b"%016x" % (self._base | (counter & _ID_COUNTER_MASK))

"""A topic: where published messages go, and how they reach its channels (nsqd's ``topic.go``).

A message published to a topic with channels (not paused) is copied into each of them at once.
Messages wait in the topic itself only while it has no channel, is paused, or is being restored
after a restart: ``mem_queue_size`` in memory, the rest in its backend. That backlog moves into
the channels in bounded steps (:meth:`Topic.move_backlog`), one where the move starts and one
per ``handle_timer`` call, so the transport serves its other clients between steps as nsqd's
per-topic ``messagePump`` goroutine would let it.
"""

from __future__ import annotations

from collections import deque

from ..names import is_ephemeral
from .backend import RECORD_HEADER_SIZE, Backend, decode_record
from .channel import Channel
from .client import Client
from .context import INF
from .message import Message, from_record, to_record

__all__ = ["BACKLOG_STEP_BYTES", "BACKLOG_STEP_MESSAGES", "ChannelLookup", "Topic"]

# A topic's backlog (what waited while it had no channel, was paused, or before a restart)
# moves into its channels in steps of at most this many messages and bytes: one step where
# the move starts, then one per handle_timer call, so a transport serves every other client
# and the HTTP API between steps (nsqd moves it in the topic's own messagePump goroutine).
# 256 keeps a step well under a millisecond: with 1024, /ping answered 3x slower meanwhile
# (bench/bench_backlog.py), for the same total.
BACKLOG_STEP_MESSAGES = 256
BACKLOG_STEP_BYTES = 256 * 1024


class ChannelLookup:
    """nsqd asking its nsqlookupds for the channels of a topic it just created (nsqd's
    ``GetTopic``): the topic holds its messages, and the clients whose command created it
    wait (``waiters``), until every nsqlookupd answered or ``alarm_at`` (the request
    timeout) passed. ``channels`` gathers the answers, ``pending`` the addresses not heard
    from; ``claimed`` once the command that created the topic has taken it."""

    __slots__ = (
        "addresses",
        "alarm_at",
        "channels",
        "claimed",
        "id",
        "pending",
        "topic",
        "waiters",
    )

    def __init__(self, lookup_id: int, topic: Topic, addresses: tuple[str, ...]) -> None:
        self.id = lookup_id
        self.topic = topic
        self.addresses = addresses
        self.pending = set(addresses)
        self.channels: dict[str, None] = {}
        self.waiters: list[Client] = []
        self.claimed = False
        self.alarm_at = INF


class Topic:
    """A topic: messages wait here only while it has no channel or is paused."""

    __slots__ = (
        "backend",
        "channels",
        "deleted",
        "ephemeral",
        "lookup",
        "mem",
        "mem_limit",
        "message_bytes",
        "message_count",
        "name",
        "paused",
        "spilled",
        "starting",
    )

    def __init__(self, name: str, backend: Backend, mem_limit: int) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.deleted = False
        self.starting = False  # its channels are being restored: hold messages until done
        # nsqlookupd is being asked for its channels (starting is set too until it answers)
        self.lookup: ChannelLookup | None = None
        self.mem: deque[Message] = deque()
        self.mem_limit = mem_limit
        self.backend = backend
        self.spilled = backend.depth > 0
        self.channels: dict[str, Channel[Client]] = {}
        self.message_count = 0
        self.message_bytes = 0

    def depth(self) -> int:
        """Messages waiting in the topic itself (memory and backend)."""
        return len(self.mem) + self.backend.depth

    def put(self, msg: Message, now: float) -> None:
        """Publish to the topic: straight to its channels, or queued while it has none or is
        paused. Raises BackendError only when the message could not be kept at all."""
        if (
            self.channels
            and not self.paused
            and not self.starting
            and (msg.deferred or not (self.mem or self.spilled))
        ):
            # Straight to the channels, unless a backlog is still being moved into them:
            # then the message waits behind it (a DPUB's copies are held back anyway).
            self._distribute(msg, now)
        elif len(self.mem) < self.mem_limit and not self.spilled:
            self.mem.append(msg)
        else:
            self.backend.put(to_record(msg))
            self.spilled = True
        self.message_count += 1
        self.message_bytes += len(msg.body)

    def pump(self, now: float) -> None:
        """Deliver what the last puts queued (once per command, not once per message)."""
        for channel in self.channels.values():
            if channel.ready:
                channel.pump(now)

    def move_backlog(self, now: float) -> bool:
        """Move one bounded step of the backlog into the channels and deliver what it allows.
        True while more is left to move (the node calls again from ``handle_timer``)."""
        if (
            not self.channels
            or self.paused
            or self.starting
            or self.deleted
            or not (self.mem or self.spilled)
        ):
            return False
        mem = self.mem
        moved = 0
        size = 0
        while mem and moved < BACKLOG_STEP_MESSAGES and size < BACKLOG_STEP_BYTES:
            msg = mem.popleft()
            self._distribute(msg, now)
            moved += 1
            size += len(msg.body)
        if not mem and self.spilled:
            backend = self.backend
            channels = list(self.channels.values())
            while moved < BACKLOG_STEP_MESSAGES and size < BACKLOG_STEP_BYTES:
                record = backend.get()
                if record is None:
                    break
                moved += 1
                size += len(record)
                if len(record) >= RECORD_HEADER_SIZE:  # else corrupt: dropped, as nsqd does
                    self._distribute_record(record, channels, now)
            self.spilled = backend.depth > 0
        more = bool(mem or self.spilled)
        self.pump(now)
        return more

    def _distribute(self, msg: Message, now: float) -> None:
        """A copy of the message into each channel (held back in each when deferred)."""
        first = True
        delay = msg.deferred  # read once: every channel's copy is held back (DPUB)
        if delay > 0:
            msg.deferred = 0.0
        for channel in self.channels.values():
            copy = msg if first else Message(msg.id, msg.body, msg.timestamp, msg.attempts)
            first = False
            channel.message_count += 1
            if delay > 0:
                channel.defer(copy, now + delay)
                continue
            if channel.ready and len(channel.mem) >= self.mem_limit:
                channel.pump(now)  # make room rather than spill to the backend
            channel.put(copy)

    def _distribute_record(
        self, record: bytes, channels: list[Channel[Client]], now: float
    ) -> None:
        """A record from the topic's backend into each channel: a channel whose queue has
        spilled to its backend (the common case for a big backlog) takes the record as it
        is, without decoding and encoding it again; the others get a message."""
        msg: Message | None = None
        limit = self.mem_limit
        for channel in channels:
            channel.message_count += 1
            if not channel.spilled:
                if channel.ready and len(channel.mem) >= limit:
                    channel.pump(now)  # make room rather than spill to the backend
                if len(channel.mem) < limit:
                    if msg is None:
                        decoded = decode_record(record)
                        assert decoded is not None  # its length was checked
                        msg = from_record(decoded)
                        channel.mem.append(msg)
                    else:
                        channel.mem.append(Message(msg.id, msg.body, msg.timestamp, msg.attempts))
                    continue
            channel.put_record(record)

    def empty(self) -> None:
        """``/topic/empty``: drop what waits in the topic (not in its channels)."""
        self.mem.clear()
        self.backend.empty()
        self.spilled = self.backend.depth > 0

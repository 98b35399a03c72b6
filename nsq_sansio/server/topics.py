"""The node's topics by name, and how topics, channels and client connections come and go
(the lifecycle half of nsqd's ``nsqd.go``, ``topic.go`` and ``channel.go``).

:class:`Topics` creates a topic or channel on first use with its backend (ephemeral ones get a
discarding one), deletes them with their clients disconnected, and records each change as a
:class:`~nsq_sansio.server.events.RegistryEvent` for a lookupd registrar. A client leaving is
here too, because the last client leaving an ``#ephemeral`` channel deletes the channel, and
the last channel of an ephemeral topic the topic. It also tracks which topics still have a
backlog to move into their channels, a step per ``handle_timer`` call, and which new topics
wait for nsqlookupd to say what channels they have (:meth:`Topics.start_lookup`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..errors import InvalidName, ServerError
from ..names import is_ephemeral, validate_channel
from .backend import Backend, BackendFactory, DiscardBackend, backend_name
from .channel import Channel
from .client import Client
from .context import INF, NodeContext
from .events import (
    ChannelCreated,
    ChannelDeleted,
    CloseConnection,
    RegistryEvent,
    ServerEvent,
    TopicCreated,
    TopicDeleted,
)
from .quantile import LatencyWindow
from .states import ClientState
from .topic import ChannelLookup, Topic

__all__ = ["Topics"]

_MAX_REGISTRY_EVENTS = 100_000


class Topics:
    """The node's topics and their lifecycle (see the module docstring)."""

    def __init__(
        self,
        context: NodeContext,
        backend_factory: BackendFactory,
        *,
        requeue_in_flight_on_close: bool,
    ) -> None:
        self.context = context
        self.by_name: dict[str, Topic] = {}
        # Bounded so a node nobody drains (no lookupd) cannot grow without end.
        self.registry: deque[RegistryEvent] = deque(maxlen=_MAX_REGISTRY_EVENTS)
        # Topics whose backlog is being moved into their channels, a step per handle_timer.
        self.moving: dict[Topic, None] = {}
        # Asking nsqlookupd for a new topic's channels: the HTTP host:port of each (set by
        # the transport as they answer IDENTIFY), how long to wait, the lookups under way
        # and those started since the node last emitted them.
        self.lookupd_http_addresses: tuple[str, ...] = ()
        self.lookup_timeout = 5.0
        self.lookups: dict[int, ChannelLookup] = {}
        self.started: list[ChannelLookup] = []
        self.lookup_seq = 0
        # nsqd's e2e processing latency percentiles (none: not tracked) and their window.
        self.e2e_percentiles: tuple[float, ...] = ()
        self.e2e_window = 600.0
        self._backend_factory = backend_factory
        self._requeue_in_flight_on_close = requeue_in_flight_on_close

    def _make_backend(self, topic: str, channel: str | None) -> Backend:
        if is_ephemeral(channel if channel is not None else topic):
            return DiscardBackend()
        return self._backend_factory(backend_name(topic, channel))

    def get_topic(self, name: str, now: float, *, lookup: bool = True) -> Topic:
        """The topic, created (with its backend) if it does not exist yet. A topic created
        while the node knows nsqlookupds (and ``lookup``: not while loading the metadata)
        asks them for its channels first, as nsqd's ``GetTopic`` does: see
        :meth:`start_lookup`."""
        topic = self.by_name.get(name)
        if topic is None:
            topic = Topic(name, self._make_backend(name, None), self.context.mem_limit)
            self.by_name[name] = topic
            self.registry.append(TopicCreated(name))
            if lookup and self.lookupd_http_addresses:
                self.start_lookup(topic, now)
        return topic

    # ------------------------------------------------------------------ channels from lookupd

    def start_lookup(self, topic: Topic, now: float) -> None:
        """Hold a new topic's messages while its nsqlookupds are asked for its channels
        (``started`` gets the lookup, for the node to emit and the protocol to make the
        creating client wait); at ``lookup_timeout`` it goes on with what was answered."""
        self.lookup_seq += 1
        found = ChannelLookup(self.lookup_seq, topic, self.lookupd_http_addresses)
        topic.lookup = found
        topic.starting = True
        self.lookups[found.id] = found
        self.started.append(found)
        self.context.arm(found, now + self.lookup_timeout)

    def lookup_answer(
        self, lookup_id: int, address: str, channels: Sequence[str] | None, now: float
    ) -> list[Client]:
        """One nsqlookupd's answer (``None``: it could not be asked). Once every one has
        answered, the lookup ends (see :meth:`end_lookup`); returns the clients to release
        then (none before, or for an unknown or finished lookup)."""
        found = self.lookups.get(lookup_id)
        if found is None or address not in found.pending:
            return []
        found.pending.discard(address)
        if channels is not None:
            for name in channels:
                found.channels[name] = None
        if found.pending:
            return []
        return self.end_lookup(found, now)

    def end_lookup(self, found: ChannelLookup, now: float) -> list[Client]:
        """The lookup is over (all answered, or its timeout): create the channels found
        (``#ephemeral`` ones and invalid names skipped, as nsqd does), let the topic's
        messages flow into them and return the clients that waited."""
        if self.lookups.pop(found.id, None) is None:
            return []
        found.alarm_at = INF
        topic = found.topic
        if topic.lookup is found:
            topic.lookup = None
            if not topic.deleted:
                for name in found.channels:
                    if is_ephemeral(name):
                        continue
                    try:
                        valid = validate_channel(name)
                    except InvalidName:
                        continue
                    self.get_channel(topic, valid, now)
                topic.starting = False
                self.flow(topic, now)
        waiters, found.waiters = found.waiters, []
        return waiters

    def get_channel(self, topic: Topic, name: str, now: float) -> Channel[Client]:
        """The topic's channel, created if it does not exist yet (the topic's backlog then
        starts moving into it)."""
        channel = topic.channels.get(name)
        if channel is None:
            backend = self._make_backend(topic.name, name)
            channel = Channel(topic.name, name, backend, self.context)
            if self.e2e_percentiles:
                channel.latency = LatencyWindow(self.e2e_percentiles, self.e2e_window, now)
            topic.channels[name] = channel
            self.registry.append(ChannelCreated(topic.name, name))
            self.flow(topic, now)
        return channel

    # ------------------------------------------------------------------ backlogs

    def flow(self, topic: Topic, now: float) -> None:
        """Start moving what waits in a topic into its channels (after SUB, unpause, restart):
        the first step now, the rest in :meth:`step_backlog` calls."""
        if topic.move_backlog(now):
            self.moving[topic] = None
        else:
            self.moving.pop(topic, None)

    def step_backlog(self, now: float) -> None:
        """One step of one topic's backlog; topics with more take turns."""
        moving = self.moving
        if moving:
            topic = next(iter(moving))
            del moving[topic]  # back at the end of the line if it has more
            self.flow(topic, now)

    # ------------------------------------------------------------------ going away

    def delete_channel(
        self, channel: Channel[Client], now: float, events: list[ServerEvent]
    ) -> None:
        """Delete a channel: its clients are disconnected, its messages and backend go."""
        if channel.deleted:
            return
        channel.deleted = True
        topic = self.by_name[channel.topic_name]  # a live channel's topic is still listed
        for conn in list(channel.clients.values()):
            self.close_client(
                conn, f"channel {topic.name}:{channel.name} was deleted", None, now, events
            )
        channel.discard()
        if topic.channels.get(channel.name) is channel:
            del topic.channels[channel.name]
        self.registry.append(ChannelDeleted(topic.name, channel.name))
        if topic.ephemeral and not topic.channels and not topic.deleted:
            self.delete_topic(topic, now, events)

    def delete_topic(self, topic: Topic, now: float, events: list[ServerEvent]) -> None:
        """Delete a topic and its channels."""
        if topic.deleted:
            return
        topic.deleted = True
        self.moving.pop(topic, None)
        for channel in list(topic.channels.values()):
            self.delete_channel(channel, now, events)
        topic.mem.clear()
        topic.backend.delete()
        if self.by_name.get(topic.name) is topic:
            del self.by_name[topic.name]
        self.registry.append(TopicDeleted(topic.name))

    def close_client(
        self,
        conn: Client,
        reason: str,
        error: ServerError | None,
        now: float,
        events: list[ServerEvent],
    ) -> None:
        """The node is done with a connection: it leaves its channel (an ephemeral channel
        goes with its last client) and the transport is told to close it."""
        if conn.state is ClientState.CLOSED:
            return
        conn.state = ClientState.CLOSED
        conn.alarm_at = INF
        conn.inbuf.clear()
        conn.compressed.clear()
        conn.compressed_len = 0
        conn.pieces = None
        conn.more_input = False
        conn.pending_verb = None
        channel = conn.channel
        if channel is not None and channel.clients.get(conn.id) is conn:
            del channel.clients[conn.id]
            if self._requeue_in_flight_on_close and conn.in_flight:
                channel.requeue_all_of(conn, now)
            if channel.ephemeral and not channel.clients and not channel.deleted:
                self.delete_channel(channel, now, events)
        events.append(CloseConnection(conn.id, reason, error))
        self.context.dirty[conn.id] = None

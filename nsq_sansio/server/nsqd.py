"""nsqd's side of protocol V2 as a pure state machine: one :class:`NSQD` node, many clients.

Built for the embedded broker and the cluster simulator: no IO, no clock, no threads. Time comes
in as ``now`` (monotonic seconds), randomness (``sample_rate``, the id counter's start) from the
injected ``random.Random``, so a run replays exactly. Behaviour, error codes and texts follow
nsqd 1.3 (``nsqd/protocol_v2.go``, ``channel.go``, ``topic.go``); where this differs, it is a bug.

How a transport drives it (the h11 shape, for many connections at once)::

    node = NSQD(NSQDOptions(tcp_port=4150), random.Random(seed), epoch_offset=wall - mono)
    cid = node.connect(now, "127.0.0.1:53122")            # a client connected
    events = node.receive_data(cid, data, now)             # bytes read; b"" means EOF
    for conn_id in node.connections_with_output():         # a PUB here may feed consumers there
        write(conn_id, node.data_to_send(conn_id, now))     # when the last write is done
    for event in events:                                    # StartTLS / CloseConnection
        ...
    sleep_until(node.next_deadline()); events = node.handle_timer(now)
    node.connection_lost(cid, now)                          # the socket is gone (idempotent)

``CloseConnection``: write ``data_to_send`` (the error frame) and close. ``StartTLS``: write
``data_to_send`` in plaintext, run the server TLS handshake fed first with ``trailing_data``,
then call :meth:`NSQD.tls_established`; from then on bytes in and out go through TLS as usual.
Snappy and deflate are done here: ``receive_data`` takes and ``data_to_send`` gives wire bytes.

The HTTP API is pure methods (``publish``, ``create_topic``, ``pause_channel``, ``stats`` ...)
raising :class:`AdminError` with nsqd's HTTP status and code. Topic and channel lifecycle, for a
lookupd registrar, is drained with :meth:`NSQD.take_registry_events`.

Channels from nsqlookupd: once the transport says where its nsqlookupds' HTTP APIs are
(:meth:`NSQD.set_lookupd_http_addresses`, from their answers to IDENTIFY), a topic the node
creates (not while loading metadata) asks them for its channels first, as nsqd's ``GetTopic``
does: the call that created it returns a :class:`LookupChannels`, the transport asks each
nsqlookupd and passes each answer to :meth:`NSQD.lookupd_channels`. Meanwhile the topic keeps
its messages and the client whose command created it waits (its answer and its further input
are held; ``input_pending`` is true); at ``http_client_request_timeout`` the node goes on with
what was answered. An HTTP call that created a topic returns the event too: answer the
request once that lookup is over.

Storage: each non-ephemeral topic and channel keeps ``mem_queue_size`` messages in memory and
the rest in a :class:`~nsq_sansio.server.backend.Backend` made by ``backend_factory`` (memory by
default, a durable file backend lives in ``transports/embedded/file_backend.py``); ``#ephemeral``
ones drop their overflow, as nsqd does. :meth:`NSQD.close` writes what is in memory, in flight
and deferred to the backends; :meth:`NSQD.metadata` / :meth:`NSQD.load_metadata` carry the
topic and channel list (nsqd's ``nsqd.dat``) across a restart.

Output back-pressure: call :meth:`NSQD.data_to_send` only once the previous write to that
connection has finished. Deliveries to a client stop while its untaken output is at a
high-water mark (its ``output_buffer_size``, at least 64 KiB, at least one message) and resume
when the output is taken, so a client that reads nothing holds a few messages, not its whole
RDY, and the rest stays in the channel (memory, then the backend). The resumed deliveries are
queued by ``data_to_send`` itself: check :meth:`NSQD.connections_with_output` (or
``output_pending``) after it, not only after the other calls.

What the transport still owns: write timeouts (nsqd drops a client whose writes stall for a
heartbeat interval; ``output_pending`` tells how much is queued), reading back-pressure, and
sockets. Known, deliberate differences from nsqd: deliveries a command allows are made when
the whole input chunk has been processed (one batch, same call); IDENTIFY's output buffer
timeout is negotiated and reported but output is never held back to batch it; an MPUB body must
hold exactly its messages (nsqd reads them off the stream); the AUTH check is a synchronous
callable (``NSQDOptions.auth_check``) or a transport's answer to ``AuthRequested``
(``auth_by_transport``), which re-checks when the TTL ends rather than at the next command;
``requeue_in_flight_on_close`` (off by default) can put a vanished client's messages back at
once instead of after their timeouts.

Where things are (the modules follow nsqd's own files): :mod:`.protocol_v2` parses and answers
the commands, :mod:`.identify` decodes IDENTIFY; :mod:`.client` is the record of a connection;
:mod:`.topic` and :mod:`.channel` are the queues (the channel with its in-flight and deferred
heaps); :mod:`.topics` creates and deletes them; :mod:`.message` is a message and its id;
:mod:`.context` is what they all share (the alarm heap, output bookkeeping, health);
:mod:`.wire` is the frame vocabulary. This module is the :class:`NSQD` the transport talks to:
it composes those parts and answers the HTTP API's calls.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from heapq import heappop
from typing import Any

from ..errors import InvalidName, LocalProtocolError
from ..names import is_ephemeral, validate_channel, validate_topic
from .backend import BackendError, BackendFactory, memory_backend_factory
from .channel import Channel
from .client import Client, client_stats
from .context import INF, NodeContext
from .events import AdminError, LookupChannels, RegistryEvent, ServerEvent
from .message import Message
from .options import AuthState, NSQDOptions
from .protocol_v2 import ProtocolV2
from .quantile import merged_result
from .states import ClientState, NSQDState
from .topic import ChannelLookup, Topic
from .topics import Topics
from .wire import nanoseconds

__all__ = ["NSQD", "ClientState", "ConnectionId", "NSQDState"]

#: A connection's handle: a positive int, never reused by one node.
ConnectionId = int


class NSQD:
    """One nsqd node: its topics and channels and every client connected to it (pure, sans-IO).

    ``epoch_offset`` is added to ``now`` to stamp messages and stats with wall-clock time (the
    transport passes wall-clock seconds minus monotonic seconds); ``backend_factory`` makes the
    overflow queue of each non-ephemeral topic and channel from its name (``topic`` or
    ``topic:channel``).
    """

    def __init__(
        self,
        options: NSQDOptions | None = None,
        rng: random.Random | None = None,
        *,
        backend_factory: BackendFactory | None = None,
        epoch_offset: float = 0.0,
        now: float = 0.0,
    ) -> None:
        self.options = options = options if options is not None else NSQDOptions()
        self.state = NSQDState.RUNNING
        self._start_time = now
        self._conns: dict[int, Client] = {}
        self._next_conn_id = 1
        self._context = NodeContext(
            rng if rng is not None else random.Random(0),
            node_id=options.node_id,
            mem_limit=options.mem_queue_size,
            epoch_offset=epoch_offset,
            now=now,
        )
        self._topics = Topics(
            self._context,
            backend_factory if backend_factory is not None else memory_backend_factory,
            requeue_in_flight_on_close=options.requeue_in_flight_on_close,
        )
        self._topics.lookup_timeout = options.http_client_request_timeout
        self._topics.e2e_percentiles = options.e2e_processing_latency_percentiles
        self._topics.e2e_window = options.e2e_processing_latency_window_time
        self._protocol = ProtocolV2(options, self._context, self._topics)

    # ------------------------------------------------------------------ connections

    def connect(self, now: float, remote_address: str = "") -> ConnectionId:
        """A client connected; returns its id. ``remote_address`` is ``host:port``."""
        self._check_running()
        conn_id = self._next_conn_id
        self._next_conn_id += 1
        conn = Client(conn_id, remote_address, now, self.options)
        self._conns[conn_id] = conn
        self._context.arm(conn, now + self.options.client_timeout)
        return conn_id

    def receive_data(self, conn_id: ConnectionId, data: bytes, now: float) -> list[ServerEvent]:
        """Feed bytes read from a connection (``b""`` = EOF); returns what the transport must do.

        Replies go to this connection's output; messages a PUB releases go to other
        connections' outputs (see :meth:`connections_with_output`).
        """
        conn = self._live_conn(conn_id)
        events: list[ServerEvent] = []
        if conn is None:
            return events
        self._context.now = now
        self._protocol.receive(conn, data, now, events)
        if self._topics.started:
            self._emit_lookups(events)
        return events

    def auth_result(
        self, conn_id: ConnectionId, state: AuthState | None, now: float
    ) -> list[ServerEvent]:
        """The answer to an :class:`AuthRequested`: the auth server's :class:`AuthState`, or
        ``None`` when it could not be asked (the client gets ``E_AUTH_FAILED``)."""
        conn = self._live_conn(conn_id)
        events: list[ServerEvent] = []
        if conn is not None:
            self._protocol.auth_result(conn, state, now, events)
            self._emit_lookups(events)
        return events

    def tls_established(self, conn_id: ConnectionId, now: float) -> list[ServerEvent]:
        """The TLS handshake a :class:`StartTLS` asked for is done: answer ``OK`` and go on."""
        conn = self._live_conn(conn_id)
        events: list[ServerEvent] = []
        if conn is not None:
            self._protocol.tls_established(conn, now, events)
            self._emit_lookups(events)
        return events

    def connection_lost(self, conn_id: ConnectionId, now: float) -> list[ServerEvent]:
        """The socket is gone (or the transport closed it): forget the connection. Idempotent."""
        conn = self._conns.get(conn_id)
        events: list[ServerEvent] = []
        if conn is None:
            return events
        if conn.state is not ClientState.CLOSED:
            self._topics.close_client(conn, "connection lost", None, now, events)
        self._conns.pop(conn_id, None)
        self._context.dirty.pop(conn_id, None)
        return events

    def data_to_send(self, conn_id: ConnectionId, now: float | None = None) -> bytes:
        """Bytes to write to this connection now (compressed if negotiated; may be ``b""``).

        Call it when the previous write to this connection has finished: this is the node's
        output back-pressure. Deliveries to a subscriber stop while its unsent output is at
        its high-water mark (its ``output_buffer_size``, at least 64 KiB, and at least one
        message), so a client that reads nothing holds only a few messages and the rest stay
        in the channel. Taking the output resumes them: this call may queue more messages for
        the connection (it is then in :meth:`connections_with_output` again), timed from
        ``now`` (default: the latest time the node was given).

        Once a connection is closed, the call that returns its last bytes also forgets it.
        """
        conn = self._conns.get(conn_id)
        if conn is None:
            if 0 < conn_id < self._next_conn_id:
                return b""
            raise LocalProtocolError(f"unknown connection id {conn_id}")
        self._context.dirty.pop(conn_id, None)
        data = b""
        if conn.out:
            conn.took = True
            data = b"".join(conn.out)
            conn.out.clear()
            conn.out_len = 0
            if conn.encoder is not None:
                data = conn.encoder.compress(data)
        if conn.raw_prefix:
            data = conn.raw_prefix + data
            conn.raw_prefix = b""
        if conn.blocked:
            conn.blocked = False
            channel = conn.channel
            if channel is not None and conn.in_flight < conn.ready_count:
                channel.enqueue_ready(conn)
                channel.pump(self._context.now if now is None else now)
        if conn.state is ClientState.CLOSED:
            del self._conns[conn_id]
        return data

    def connections_with_output(self) -> list[ConnectionId]:
        """Connections that got output since this was last called (then take ``data_to_send``)."""
        dirty = self._context.dirty
        found = list(dirty)
        dirty.clear()
        return found

    def output_pending(self, conn_id: ConnectionId) -> int:
        """Bytes waiting in this connection's output (before compression): stop reading from a
        client whose output grows past ``max_output_buffer_size`` until it drains (deliveries
        already pause at the connection's high-water mark; answers to commands do not)."""
        conn = self._conns.get(conn_id)
        return 0 if conn is None else conn.out_len + len(conn.raw_prefix)

    def connection_state(self, conn_id: ConnectionId) -> ClientState:
        """The protocol state of a connection (``CLOSED`` once forgotten)."""
        conn = self._conns.get(conn_id)
        return ClientState.CLOSED if conn is None else conn.state

    def connection_ids(self) -> list[ConnectionId]:
        """Every connection the node still holds."""
        return list(self._conns)

    def _live_conn(self, conn_id: int) -> Client | None:
        conn = self._conns.get(conn_id)
        if conn is None:
            if 0 < conn_id < self._next_conn_id:
                return None
            raise LocalProtocolError(f"unknown connection id {conn_id}")
        if conn.state is ClientState.CLOSED:
            return None
        return conn

    # ------------------------------------------------------------------ timers

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` next has work (heartbeats, timeouts, deferred messages).

        While a backlog is being moved into channels (see :meth:`backlog_pending`) or a
        client's input is not all processed (:meth:`input_pending`) this is the latest ``now``
        the node was given: work is due at once, one bounded step per :meth:`handle_timer`
        call, and the transport serves its other IO between calls.
        """
        if self._topics.moving or self._protocol.input_pending:
            return self._context.now
        return self._context.next_alarm()

    def handle_timer(self, now: float) -> list[ServerEvent]:
        """Do what is due at ``now``: heartbeats, client timeouts, message timeouts, deferred
        messages becoming ready (and the deliveries they allow), one step of a client's
        pending input and one step of moving a topic's backlog into its channels. Each call
        does a bounded amount of work: when more is due, :meth:`next_deadline` says so and
        the transport calls again."""
        events: list[ServerEvent] = []
        context = self._context
        context.now = now
        alarms = context.alarms
        # What this call arms for "now" (more of a channel's timeouts) waits for the next one.
        last_seq = context.seq
        while alarms and alarms[0][0] <= now and alarms[0][1] <= last_seq:
            deadline, _, owner = heappop(alarms)
            if owner.alarm_at != deadline:
                continue  # re-armed since: a later entry is the live one
            owner.alarm_at = INF
            if isinstance(owner, Client):
                self._protocol.client_timer(owner, now, events)
            elif isinstance(owner, Channel):
                owner.process_timers(now)
            elif isinstance(owner, ChannelLookup):  # nsqlookupd did not answer in time
                self._release(self._topics.end_lookup(owner, now), now, events)
        if self._protocol.input_pending:
            self._protocol.step_pending_input(now, events)
        if self._topics.moving:
            self._topics.step_backlog(now)
        if self._topics.started:
            self._emit_lookups(events)
        return events

    def input_pending(self, conn_id: ConnectionId) -> bool:
        """True while the node holds input of this connection it has not processed yet.

        Input is processed in bounded steps (a compressed read can stand for millions of
        commands): one in :meth:`receive_data`, the rest one per :meth:`handle_timer` call,
        clients taking turns. A transport stops reading a connection while this is true, so
        its input stays small and whatever a client sent before closing is processed before
        the EOF is read; EOF (``receive_data(b"")``) drops what is still pending. It is true
        as well while the client waits for nsqlookupd (see :class:`LookupChannels`).
        """
        conn = self._conns.get(conn_id)
        return conn is not None and (conn.more_input or conn.lookup_id != 0)

    def backlog_pending(self) -> bool:
        """True while some topic's backlog is still being moved into its channels."""
        return bool(self._topics.moving)

    # ------------------------------------------------------------------ HTTP API (pure)

    def publish(
        self, topic: str, body: bytes, now: float, *, defer_ms: int = 0
    ) -> list[ServerEvent]:
        """``POST /pub``: publish one message; raises :class:`AdminError` as nsqd answers.

        Returns a :class:`LookupChannels` when this created the topic and the node knows
        nsqlookupds: nsqd answers the request once that lookup is over (the message is in
        the topic, held until then)."""
        self._check_running()
        if not body:
            raise AdminError(400, "MSG_EMPTY")
        if len(body) > self.options.max_msg_size:
            raise AdminError(413, "MSG_TOO_BIG")
        return self._publish_many(topic, [bytes(body)], now, defer_ms)

    def multi_publish(
        self, topic: str, bodies: Sequence[bytes], now: float, *, defer_ms: int = 0
    ) -> list[ServerEvent]:
        """``POST /mpub``: publish several messages in order; all are checked before any is
        put. Returns what :meth:`publish` does."""
        self._check_running()
        checked: list[bytes] = []
        total = 0
        for body in bodies:
            if not body:
                raise AdminError(400, "MSG_EMPTY")
            if len(body) > self.options.max_msg_size:
                raise AdminError(413, "MSG_TOO_BIG")
            total += len(body)
            checked.append(bytes(body))
        if total > self.options.max_body_size:
            raise AdminError(413, "BODY_TOO_BIG")
        return self._publish_many(topic, checked, now, defer_ms)

    def create_topic(self, topic: str, now: float) -> list[ServerEvent]:
        """``POST /topic/create``; returns what :meth:`publish` does."""
        self._check_running()
        self._topics.get_topic(self._admin_topic(topic, "INVALID_TOPIC"), now)
        events: list[ServerEvent] = []
        self._emit_lookups(events)
        return events

    # ------------------------------------------------------------------ channels from lookupd

    def set_lookupd_http_addresses(self, addresses: Sequence[str]) -> None:
        """The nsqlookupds to ask for a new topic's channels: the HTTP ``host:port`` each
        gave in its answer to IDENTIFY (nsqd keeps asking one it lost the connection to).
        While there are none, a new topic starts at once with no channel."""
        self._topics.lookupd_http_addresses = tuple(dict.fromkeys(addresses))

    @property
    def lookupd_http_addresses(self) -> tuple[str, ...]:
        """What :meth:`set_lookupd_http_addresses` was given."""
        return self._topics.lookupd_http_addresses

    def lookupd_channels(
        self, lookup_id: int, address: str, channels: Sequence[str] | None, now: float
    ) -> list[ServerEvent]:
        """One nsqlookupd's answer to a :class:`LookupChannels` (its ``channels`` list, or
        ``None`` when it could not be asked). Once each has answered the topic gets those
        channels and its messages, and the clients that waited go on. A late answer (the
        lookup timed out) or an unknown id is ignored."""
        events: list[ServerEvent] = []
        if self.state is not NSQDState.RUNNING:
            return events
        self._context.now = now
        waiters = self._topics.lookup_answer(lookup_id, address, channels, now)
        self._release(waiters, now, events)
        self._emit_lookups(events)
        return events

    def lookups_pending(self) -> int:
        """How many new topics still wait for nsqlookupd's answer."""
        return len(self._topics.lookups)

    def _release(self, waiters: list[Client], now: float, events: list[ServerEvent]) -> None:
        for conn in waiters:
            self._protocol.release_from_lookup(conn, now, events)

    def _emit_lookups(self, events: list[ServerEvent]) -> None:
        """A :class:`LookupChannels` for each lookup started since the last call."""
        started = self._topics.started
        if started:
            for found in started:
                events.append(LookupChannels(found.id, found.topic.name, found.addresses))
            started.clear()

    def delete_topic(self, topic: str, now: float) -> list[ServerEvent]:
        """``POST /topic/delete``: the topic, its channels and their clients' connections go."""
        self._check_running()
        found = self._topics.by_name.get(topic)
        if found is None:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        events: list[ServerEvent] = []
        self._topics.delete_topic(found, now, events)
        return events

    def empty_topic(self, topic: str, now: float) -> None:
        """``POST /topic/empty``: drop what waits in the topic (not in its channels)."""
        self._check_running()
        self._existing_topic(self._admin_topic(topic, "INVALID_TOPIC")).empty()

    def pause_topic(self, topic: str, now: float) -> None:
        """``POST /topic/pause``: messages wait in the topic until unpaused."""
        self._check_running()
        self._existing_topic(topic).paused = True

    def unpause_topic(self, topic: str, now: float) -> None:
        """``POST /topic/unpause``."""
        self._check_running()
        found = self._existing_topic(topic)
        found.paused = False
        self._topics.flow(found, now)

    def create_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/create`` (the topic must exist)."""
        self._check_running()
        found = self._existing_topic(self._admin_topic(topic, "INVALID_ARG_TOPIC"))
        self._topics.get_channel(found, self._admin_channel(channel), now)

    def delete_channel(self, topic: str, channel: str, now: float) -> list[ServerEvent]:
        """``POST /channel/delete``: its messages go and its clients are disconnected."""
        self._check_running()
        found = self._existing_channel(topic, channel)
        events: list[ServerEvent] = []
        self._topics.delete_channel(found, now, events)
        return events

    def empty_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/empty``: drop queued, in-flight and deferred messages."""
        self._check_running()
        self._existing_channel(topic, channel).empty()

    def pause_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/pause``: no deliveries to its clients until unpaused."""
        self._check_running()
        self._existing_channel(topic, channel).paused = True

    def unpause_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/unpause``."""
        self._check_running()
        found = self._existing_channel(topic, channel)
        found.paused = False
        found.pump(now)

    def topic_names(self) -> list[str]:
        """Topics on this node, sorted."""
        return sorted(self._topics.by_name)

    def channel_names(self, topic: str) -> list[str]:
        """Channels of a topic, sorted (empty if the topic does not exist)."""
        found = self._topics.by_name.get(topic)
        return [] if found is None else sorted(found.channels)

    def info(self) -> dict[str, Any]:
        """``GET /info`` (durations in nanoseconds, as Go's ``time.Duration`` marshals)."""
        options = self.options
        return {
            "version": options.version,
            "broadcast_address": options.broadcast_address,
            "hostname": options.hostname,
            "http_port": options.http_port,
            "tcp_port": options.tcp_port,
            "start_time": int(self._start_time + self._context.epoch_offset),
            "max_heartbeat_interval": nanoseconds(options.max_heartbeat_interval),
            "max_output_buffer_size": options.max_output_buffer_size,
            "max_output_buffer_timeout": nanoseconds(options.max_output_buffer_timeout),
            "max_deflate_level": options.max_deflate_level,
        }

    def uptime(self, now: float) -> float:
        """Seconds since the node started (``now`` in the node's clock)."""
        return max(0.0, now - self._start_time)

    @property
    def health(self) -> str:
        """``"OK"``, or the last backend failure (``GET /ping`` answers 500 with it)."""
        return self._context.health

    def stats(
        self,
        now: float,
        *,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool = True,
    ) -> dict[str, Any]:
        """``GET /stats?format=json`` without ``memory`` (the transport's to add), with lists
        where nsqd's JSON has null for Go's nil slices (an HTTP layer converts them).

        ``topic`` keeps that topic only (none when it does not exist); ``channel`` keeps
        that channel only and leaves out the topics without it, as nsqd does. With a
        ``topic``, each producer's ``pub_counts`` has that topic's count only (left out when
        it has none); without ``include_clients``, no clients and no producers."""
        stats: dict[str, Any] = {
            "version": self.options.version,
            "health": self._context.health,
            "start_time": int(self._start_time + self._context.epoch_offset),
            "topics": [],
            "producers": [],
        }
        if topic:
            if topic not in self._topics.by_name:
                return stats
            names = [topic]
        else:
            names = sorted(self._topics.by_name)
        topics: list[dict[str, Any]] = []
        percentiles = self.options.e2e_processing_latency_percentiles
        for name in names:
            found = self._topics.by_name[name]
            if channel:
                chosen = [found.channels[channel]] if channel in found.channels else []
                if not chosen:
                    continue
            else:
                chosen = [found.channels[key] for key in sorted(found.channels)]
            channels: list[dict[str, Any]] = []
            for chan in chosen:
                clients = (
                    [
                        client_stats(conn, self._context.epoch_offset)
                        for conn in chan.clients.values()
                    ]
                    if include_clients
                    else []
                )
                channels.append(
                    {
                        "channel_name": chan.name,
                        "depth": chan.depth(),
                        "backend_depth": chan.backend.depth,
                        "in_flight_count": len(chan.in_flight),
                        "deferred_count": len(chan.deferred_heap),
                        "message_count": chan.message_count,
                        "requeue_count": chan.requeue_count,
                        "timeout_count": chan.timeout_count,
                        "client_count": len(chan.clients),
                        "clients": clients,
                        "paused": chan.paused,
                        "e2e_processing_latency": merged_result(
                            percentiles, [] if chan.latency is None else [chan.latency], now
                        ),
                    }
                )
            topics.append(
                {
                    "topic_name": name,
                    "channels": channels,
                    "depth": found.depth(),
                    "backend_depth": found.backend.depth,
                    "message_count": found.message_count,
                    "message_bytes": found.message_bytes,
                    "paused": found.paused,
                    # merged over all its channels, also when one channel was asked for
                    "e2e_processing_latency": merged_result(
                        percentiles,
                        [c.latency for c in found.channels.values() if c.latency is not None],
                        now,
                    ),
                }
            )
        stats["topics"] = topics
        if include_clients:
            stats["producers"] = [
                client_stats(conn, self._context.epoch_offset, topic or None)
                for conn in self._conns.values()
                if conn.pub_counts and conn.state is not ClientState.CLOSED
            ]
        return stats

    def take_registry_events(self) -> list[RegistryEvent]:
        """Topic/channel creations and deletions since the last call, in order (for lookupd).

        At most the last 100 000 are kept between calls; a registrar that falls further
        behind should resynchronise from :meth:`topic_names` / :meth:`channel_names`.
        """
        events = list(self._topics.registry)
        self._topics.registry.clear()
        return events

    def metadata(self) -> dict[str, Any]:
        """nsqd's ``nsqd.dat``: non-ephemeral topics and channels with their paused flags."""
        topics = []
        for name in sorted(self._topics.by_name):
            found = self._topics.by_name[name]
            if found.ephemeral:
                continue
            topics.append(
                {
                    "name": name,
                    "paused": found.paused,
                    "channels": [
                        {"name": chan.name, "paused": chan.paused}
                        for chan in sorted(found.channels.values(), key=lambda c: c.name)
                        if not chan.ephemeral
                    ],
                }
            )
        return {"topics": topics, "version": self.options.version}

    def load_metadata(self, metadata: dict[str, Any], now: float) -> None:
        """Recreate topics and channels from :meth:`metadata` (after a restart): their backends
        are reopened through ``backend_factory`` and every channel of a topic gets what the
        topic held. Invalid entries are skipped."""
        self._check_running()
        entries = metadata.get("topics") if isinstance(metadata, dict) else None
        if not isinstance(entries, list):
            return
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                continue
            try:
                name = validate_topic(entry["name"])
            except InvalidName:
                continue
            if is_ephemeral(name):
                continue
            found = self._topics.get_topic(name, now, lookup=False)  # as nsqd while loading
            found.paused = bool(entry.get("paused", False))
            found.starting = True
            channels = entry.get("channels")
            for chan_entry in channels if isinstance(channels, list) else []:
                if not isinstance(chan_entry, dict) or not isinstance(chan_entry.get("name"), str):
                    continue
                try:
                    chan_name = validate_channel(chan_entry["name"])
                except InvalidName:
                    continue
                if is_ephemeral(chan_name):
                    continue
                chan = self._topics.get_channel(found, chan_name, now)
                chan.paused = bool(chan_entry.get("paused", False))
            found.starting = False
            self._topics.flow(found, now)

    def close(self, now: float) -> list[ServerEvent]:
        """Shut down: disconnect everyone, write memory, in-flight and deferred messages of
        non-ephemeral topics and channels to their backends, close the backends."""
        events: list[ServerEvent] = []
        if self.state is NSQDState.CLOSED:
            return events
        for conn in list(self._conns.values()):
            self._topics.close_client(conn, "nsqd is shutting down", None, now, events)
        for found in self._topics.by_name.values():
            for chan in found.channels.values():
                chan.persist()
            if not found.ephemeral:
                for msg in found.mem:
                    self._context.backend_put(found.backend, msg)
            found.mem.clear()
            found.backend.close()
        self._context.alarms.clear()
        self._topics.moving.clear()
        self._topics.lookups.clear()
        self._topics.started.clear()
        self._protocol.input_pending.clear()
        self.state = NSQDState.CLOSED
        return events

    # ------------------------------------------------------------------ admin helpers

    def _check_running(self) -> None:
        if self.state is not NSQDState.RUNNING:
            raise LocalProtocolError(f"nsqd is {self.state.value}: no more calls are accepted")

    @staticmethod
    def _admin_topic(topic: str, code: str) -> str:
        try:
            return validate_topic(topic)
        except InvalidName:
            raise AdminError(400, code) from None

    @staticmethod
    def _admin_channel(channel: str) -> str:
        try:
            return validate_channel(channel)
        except InvalidName:
            raise AdminError(400, "INVALID_ARG_CHANNEL") from None

    def _existing_topic(self, topic: str) -> Topic:
        found = self._topics.by_name.get(topic)
        if found is None:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        return found

    def _existing_channel(self, topic: str, channel: str) -> Channel[Client]:
        found = self._existing_topic(self._admin_topic(topic, "INVALID_ARG_TOPIC"))
        chan = found.channels.get(self._admin_channel(channel))
        if chan is None:
            raise AdminError(404, "CHANNEL_NOT_FOUND")
        return chan

    def _publish_many(
        self, topic: str, bodies: Iterable[bytes], now: float, defer_ms: int
    ) -> list[ServerEvent]:
        name = self._admin_topic(topic, "INVALID_TOPIC")
        if (
            isinstance(defer_ms, bool)
            or not isinstance(defer_ms, int)
            or not 0 <= defer_ms <= self.options.effective_max_defer_timeout * 1000
        ):
            raise AdminError(400, "INVALID_DEFER")
        found = self._topics.get_topic(name, now)
        timestamp = self._context.timestamp(now)
        try:
            for body in bodies:
                msg = Message(self._context.ids.new_id(), body, timestamp, 0, defer_ms / 1000)
                found.put(msg, now)
        except BackendError as exc:
            raise AdminError(503, "EXITING", str(exc)) from None
        finally:
            found.pump(now)
        events: list[ServerEvent] = []
        self._emit_lookups(events)
        return events

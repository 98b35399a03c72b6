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
end-to-end latency percentiles are not computed;
``requeue_in_flight_on_close`` (off by default) can put a vanished client's messages back at
once instead of after their timeouts.
"""

from __future__ import annotations

import enum
import json
import math
import random
import struct
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from heapq import heapify, heappop, heappush
from typing import Any

from ..errors import CompressionError, InvalidName, LocalProtocolError, ServerError
from ..names import is_ephemeral, validate_channel, validate_topic
from .backend import (
    Backend,
    BackendError,
    BackendFactory,
    BackendRecord,
    DiscardBackend,
    backend_name,
    decode_record,
    encode_record,
    memory_backend_factory,
)
from .events import (
    AdminError,
    AuthRequested,
    ChannelCreated,
    ChannelDeleted,
    CloseConnection,
    RegistryEvent,
    ServerEvent,
    StartTLS,
    TopicCreated,
    TopicDeleted,
)
from .options import AuthRequest, AuthState, NSQDOptions

__all__ = ["NSQD", "ClientState", "ConnectionId", "NSQDState"]

#: A connection's handle: a positive int, never reused by one node.
ConnectionId = int

_INF = math.inf
_MAGIC_V2 = b"  V2"
_HEARTBEAT = b"_heartbeat_"
_OK = b"OK"
_CLOSE_WAIT = b"CLOSE_WAIT"
_FRAME_RESPONSE = 0
_FRAME_ERROR = 1
_FRAME_MESSAGE = 2
_FRAME_HEADER = struct.Struct(">ii")
_MESSAGE_FRAME_HEADER = struct.Struct(">iiqH")
_I32 = struct.Struct(">i")
_MAX_ATTEMPTS = 0xFFFF
_ID_COUNTER_BITS = 54
_ID_COUNTER_MASK = (1 << _ID_COUNTER_BITS) - 1
_DEFAULT_OUTPUT_BUFFER_SIZE = 16 * 1024
# The least unsent output at which deliveries to a client pause (its output_buffer_size when
# larger): nsqd's messagePump blocks in its write once bufio (16 KiB) and the kernel's socket
# buffer are full; below this much the transport would write in chunks too small to be fast.
_MIN_HIGH_WATER = 64 * 1024
# While a client is held back, its timer comes due this often (doubling while nothing is taken,
# up to the cap), so a transport that looks at connections_with_output only after its other
# calls still comes back for the output data_to_send queued when it resumed deliveries.
_RESUME_POLL = 0.001
_RESUME_POLL_MAX = 0.25
# Requeue of a message whose id is already in flight on the channel (only possible when a
# restored backend holds an id handed out again): it waits this long instead of spinning.
_DUPLICATE_ID_RETRY = 1.0
_MAX_REGISTRY_EVENTS = 100_000
# A topic's backlog (what waited while it had no channel, was paused, or before a restart)
# moves into its channels in steps of at most this many messages and bytes: one step where
# the move starts, then one per handle_timer call, so a transport serves every other client
# and the HTTP API between steps (nsqd moves it in the topic's own messagePump goroutine).
# 256 keeps a step well under a millisecond: with 1024, /ping answered 3x slower meanwhile
# (bench/bench_backlog.py), for the same total.
_BACKLOG_STEP_MESSAGES = 256
_BACKLOG_STEP_BYTES = 256 * 1024
# At most this many timed-out or deferred messages of one channel go back to its queue per
# handle_timer call; the rest are due at once and handled by the next call.
_TIMER_STEP = 1024


class ClientState(enum.Enum):
    """Where one client connection is in protocol V2."""

    AWAITING_MAGIC = "awaiting_magic"  # connected; the 4-byte "  V2" has not arrived yet
    INIT = "init"  # may IDENTIFY, AUTH, PUB, SUB
    TLS_HANDSHAKE = "tls_handshake"  # IDENTIFY negotiated TLS; waiting for tls_established()
    AUTHENTICATING = "authenticating"  # AUTH asked of the transport; waiting for auth_result()
    SUBSCRIBED = "subscribed"  # SUB done: RDY/FIN/REQ/TOUCH/CLS
    CLOSING = "closing"  # CLS received: no more messages, FIN/REQ/TOUCH still allowed
    CLOSED = "closed"  # the core is done with it; the transport closes the socket


# nsqd's numbers for client states, as /stats reports them.
_STATS_STATE = {
    ClientState.AWAITING_MAGIC: 0,
    ClientState.INIT: 0,
    ClientState.TLS_HANDSHAKE: 0,
    ClientState.AUTHENTICATING: 0,
    ClientState.SUBSCRIBED: 3,
    ClientState.CLOSING: 4,
    ClientState.CLOSED: 1,
}


class NSQDState(enum.Enum):
    """The node's own lifecycle."""

    RUNNING = "running"
    CLOSED = "closed"


class _ClientError(Exception):
    """An ``E_*`` answer to a command (internal control flow, never escapes the node)."""

    __slots__ = ("code", "fatal", "text")

    def __init__(self, code: str, text: str, *, fatal: bool = True) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text
        self.fatal = fatal


def _go_quote(value: bytes | str) -> str:
    """Approximate Go's ``%q``: a double-quoted string with escapes."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    return json.dumps(value, ensure_ascii=False)


def _nanoseconds(seconds: float) -> int:
    """A duration as Go's ``time.Duration`` (integer nanoseconds) for JSON answers."""
    return round(seconds * 1_000_000_000)


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _base10(value: bytes) -> int | None:
    """nsqd's ``ByteToBase10``: digits only (empty is 0), anything else is an error."""
    if not value:
        return 0
    if not value.isdigit():
        return None
    if len(value) > 19:
        return 1 << 63
    return int(value)


class _Msg:
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


def _high_water(output_buffer_size: int) -> int:
    return max(output_buffer_size, _MIN_HIGH_WATER)


def _record_msg(record: BackendRecord) -> _Msg:
    return _Msg(record.message_id, record.body, record.timestamp_ns, record.attempts)


class _Conn:
    """The node's record of one client connection."""

    __slots__ = (
        "alarm_at",
        "auth",
        "auth_expires",
        "auth_refreshing",
        "auth_secret",
        "blocked",
        "channel",
        "client_id",
        "connected_at",
        "decoder",
        "deflate",
        "deflate_level",
        "encoder",
        "finish_count",
        "heartbeat_interval",
        "high_water",
        "hostname",
        "id",
        "in_flight",
        "inbuf",
        "last_read",
        "message_count",
        "msg_timeout",
        "next_heartbeat",
        "out",
        "out_len",
        "output_buffer_size",
        "output_buffer_timeout",
        "pending_compression",
        "pending_params",
        "pending_size",
        "pending_verb",
        "poll_delay",
        "pub_counts",
        "queued",
        "raw_prefix",
        "ready_count",
        "remote_address",
        "requeue_count",
        "sample_rate",
        "snappy",
        "state",
        "switch_input",
        "tls",
        "took",
        "user_agent",
    )

    def __init__(self, conn_id: int, remote_address: str, now: float, options: NSQDOptions) -> None:
        self.id = conn_id
        self.remote_address = remote_address
        host = remote_address.rsplit(":", 1)[0] if ":" in remote_address else remote_address
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.state = ClientState.AWAITING_MAGIC
        self.connected_at = now
        self.last_read = now
        self.heartbeat_interval = options.client_timeout / 2
        self.next_heartbeat = now + self.heartbeat_interval
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        self.output_buffer_size = _DEFAULT_OUTPUT_BUFFER_SIZE
        # Deliveries stop while this many bytes wait unsent (see NSQD.data_to_send).
        self.high_water = _high_water(_DEFAULT_OUTPUT_BUFFER_SIZE)
        # True when deliveries stopped at high_water with RDY left: data_to_send resumes them.
        self.blocked = False
        self.took = False  # data_to_send took output since the last back-pressure poll
        self.poll_delay = 0.0  # > 0 while back-pressure polls run (see NSQD._conn_timer)
        self.output_buffer_timeout = options.output_buffer_timeout
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.deflate_level = 0
        self.encoder: Any = None
        self.decoder: Any = None
        self.pending_compression: tuple[str, int] | None = None
        self.switch_input = False
        self.auth: AuthState | None = None
        self.auth_secret = ""
        self.auth_expires = 0.0
        self.auth_refreshing = False
        self.channel: _Channel | None = None
        self.ready_count = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.queued = False
        self.inbuf = bytearray()
        self.out: list[bytes] = []
        self.out_len = 0
        self.raw_prefix = b""
        self.pending_verb: bytes | None = None
        self.pending_params: list[bytes] = []
        self.pending_size = -1
        self.alarm_at = _INF


class _Channel:
    """A channel: its queue (memory then backend), in-flight and deferred messages, clients."""

    __slots__ = (
        "alarm_at",
        "backend",
        "clients",
        "deferred_heap",
        "deleted",
        "ephemeral",
        "in_flight",
        "in_flight_heap",
        "mem",
        "message_count",
        "name",
        "paused",
        "ready",
        "requeue_count",
        "spilled",
        "timeout_count",
        "topic",
    )

    def __init__(self, topic: _Topic, name: str, backend: Backend) -> None:
        self.topic = topic
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.deleted = False
        self.mem: deque[_Msg] = deque()
        self.backend = backend
        # False only when the backend is known to be empty: spares a call per message.
        self.spilled = backend.depth > 0
        self.in_flight: dict[bytes, _Msg] = {}
        self.in_flight_heap: list[tuple[float, int, _Msg]] = []
        self.deferred_heap: list[tuple[float, int, _Msg]] = []
        self.clients: dict[int, _Conn] = {}
        self.ready: deque[_Conn] = deque()
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.alarm_at = _INF

    def depth(self) -> int:
        return len(self.mem) + self.backend.depth


class _Topic:
    """A topic: messages wait here only while it has no channel or is paused."""

    __slots__ = (
        "backend",
        "channels",
        "deleted",
        "ephemeral",
        "mem",
        "message_bytes",
        "message_count",
        "name",
        "paused",
        "spilled",
        "starting",
    )

    def __init__(self, name: str, backend: Backend) -> None:
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.deleted = False
        self.starting = False
        self.mem: deque[_Msg] = deque()
        self.backend = backend
        self.spilled = backend.depth > 0
        self.channels: dict[str, _Channel] = {}
        self.message_count = 0
        self.message_bytes = 0

    def depth(self) -> int:
        return len(self.mem) + self.backend.depth


_Timed = _Conn | _Channel

_BODY_COMMANDS = frozenset({b"IDENTIFY", b"AUTH", b"PUB", b"MPUB", b"DPUB"})


@dataclass(frozen=True, slots=True)
class _Identify:
    """IDENTIFY's fields after type checking (nsqd's ``identifyDataV2``)."""

    client_id: str
    hostname: str
    user_agent: str
    heartbeat_interval: int
    output_buffer_size: int
    output_buffer_timeout: int
    feature_negotiation: bool
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    sample_rate: int
    msg_timeout: int


def _parse_identify(body: bytes) -> _Identify:
    failed = _ClientError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise failed from None
    if not isinstance(data, dict):
        raise failed

    def text(key: str, fallback: str = "") -> str:
        value = data.get(key)
        if value is None:
            return fallback
        if not isinstance(value, str):
            raise failed
        return value

    def integer(key: str) -> int:
        value = data.get(key)
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise failed
        if not -(1 << 63) <= value < (1 << 63):
            raise failed
        return value

    def flag(key: str) -> bool:
        value = data.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise failed
        return value

    client_id = text("client_id") or text("short_id")
    hostname = text("hostname") or text("long_id")
    return _Identify(
        client_id=client_id,
        hostname=hostname,
        user_agent=text("user_agent"),
        heartbeat_interval=integer("heartbeat_interval"),
        output_buffer_size=integer("output_buffer_size"),
        output_buffer_timeout=integer("output_buffer_timeout"),
        feature_negotiation=flag("feature_negotiation"),
        tls_v1=flag("tls_v1"),
        snappy=flag("snappy"),
        deflate=flag("deflate"),
        deflate_level=integer("deflate_level"),
        sample_rate=integer("sample_rate"),
        msg_timeout=integer("msg_timeout"),
    )


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
        self.options = options if options is not None else NSQDOptions()
        self._rng = rng if rng is not None else random.Random(0)
        self._backend_factory: BackendFactory = (
            backend_factory if backend_factory is not None else memory_backend_factory
        )
        self._epoch_offset = epoch_offset
        self._start_time = now
        self.state = NSQDState.RUNNING
        self._conns: dict[int, _Conn] = {}
        self._next_conn_id = 1
        self._topics: dict[str, _Topic] = {}
        self._alarms: list[tuple[float, int, _Timed]] = []
        self._seq = 0
        self._dirty: dict[int, None] = {}
        # Bounded so a node nobody drains (no lookupd) cannot grow without end.
        self._registry: deque[RegistryEvent] = deque(maxlen=_MAX_REGISTRY_EVENTS)
        self._id_base = self.options.node_id << _ID_COUNTER_BITS
        # The latest ``now`` seen: the time of deliveries data_to_send resumes without one.
        self._now = now
        # Start the counter at a random point so ids from before a restart (still in a durable
        # backend) are very unlikely to be handed out again.
        self._id_counter = self._rng.getrandbits(_ID_COUNTER_BITS - 2)
        self._health = "OK"
        self._mem_limit = self.options.mem_queue_size
        # Topics that got messages from the input being processed: pumped once at its end.
        self._touched: dict[_Topic, None] = {}
        # Channels where a FIN freed room for more: pumped once at the end of the input.
        self._freed: dict[_Channel, None] = {}
        # Topics whose backlog is being moved into their channels, a step per handle_timer.
        self._moving: dict[_Topic, None] = {}
        self._fast_path = not self.options.tls_required and not self.options.auth_enabled
        self._heartbeat_frame = (
            _FRAME_HEADER.pack(4 + len(_HEARTBEAT), _FRAME_RESPONSE) + _HEARTBEAT
        )
        self._ok_frame = _FRAME_HEADER.pack(4 + len(_OK), _FRAME_RESPONSE) + _OK
        self._handlers: dict[bytes, Callable[[_Conn, list[bytes], float, list[ServerEvent]], None]]
        self._handlers = {
            b"FIN": self._cmd_fin,
            b"RDY": self._cmd_rdy,
            b"REQ": self._cmd_req,
            b"NOP": self._cmd_nop,
            b"TOUCH": self._cmd_touch,
            b"SUB": self._cmd_sub,
            b"CLS": self._cmd_cls,
        }

    # ------------------------------------------------------------------ connections

    def connect(self, now: float, remote_address: str = "") -> ConnectionId:
        """A client connected; returns its id. ``remote_address`` is ``host:port``."""
        self._check_running()
        conn_id = self._next_conn_id
        self._next_conn_id += 1
        conn = _Conn(conn_id, remote_address, now, self.options)
        self._conns[conn_id] = conn
        self._arm(conn, now + self.options.client_timeout)
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
        self._now = now
        if not data:
            self._close(conn, "client closed the connection", None, now, events)
            return events
        if conn.state is ClientState.TLS_HANDSHAKE:
            raise LocalProtocolError(
                f"connection {conn_id} is in the TLS handshake: feed bytes to TLS, "
                "then call tls_established()"
            )
        if conn.decoder is not None:
            if not self._decompress_into(conn, data, now, events):
                return events
        else:
            conn.inbuf += data
        if conn.state is ClientState.AUTHENTICATING:
            # Input waits for the auth answer, within the bound of one command.
            limit = self.options.max_body_size + self.options.max_command_line + 8
            if len(conn.inbuf) > limit:
                self._close(conn, "too much input while waiting for AUTH", None, now, events)
            return events
        self._process(conn, now, events)
        return events

    def auth_result(
        self, conn_id: ConnectionId, state: AuthState | None, now: float
    ) -> list[ServerEvent]:
        """The answer to an :class:`AuthRequested`: the auth server's :class:`AuthState`, or
        ``None`` when it could not be asked (the client gets ``E_AUTH_FAILED``)."""
        conn = self._live_conn(conn_id)
        events: list[ServerEvent] = []
        if conn is None:
            return events
        if conn.state is ClientState.AUTHENTICATING:
            conn.state = ClientState.INIT
            try:
                self._apply_auth(conn, state, now)
            except _ClientError as err:
                self._client_error(conn, err, now, events)
                return events
            self._process(conn, now, events)
        elif conn.auth_refreshing:
            conn.auth_refreshing = False
            if state is None:
                self._client_error(conn, _ClientError("E_AUTH_FAILED", "AUTH failed"), now, events)
            else:
                conn.auth = state
                conn.auth_expires = now + state.ttl
                self._arm(conn, conn.auth_expires)
        else:
            raise LocalProtocolError(
                f"auth_result() for connection {conn_id} in state {conn.state.value}, "
                "which has no AUTH waiting"
            )
        return events

    def tls_established(self, conn_id: ConnectionId, now: float) -> list[ServerEvent]:
        """The TLS handshake a :class:`StartTLS` asked for is done: answer ``OK`` and go on."""
        conn = self._live_conn(conn_id)
        events: list[ServerEvent] = []
        if conn is None:
            return events
        if conn.state is not ClientState.TLS_HANDSHAKE:
            raise LocalProtocolError(
                f"tls_established() for connection {conn_id} in state {conn.state.value}, "
                "which is not waiting for a TLS handshake"
            )
        conn.state = ClientState.INIT
        conn.tls = True
        conn.last_read = now
        self._write(conn, self._ok_frame)
        pending = conn.pending_compression
        if pending is not None:
            conn.pending_compression = None
            self._enable_compression(conn, pending[0], pending[1])
        if conn.inbuf:
            self._process(conn, now, events)
        return events

    def connection_lost(self, conn_id: ConnectionId, now: float) -> list[ServerEvent]:
        """The socket is gone (or the transport closed it): forget the connection. Idempotent."""
        conn = self._conns.get(conn_id)
        events: list[ServerEvent] = []
        if conn is None:
            return events
        if conn.state is not ClientState.CLOSED:
            self._close(conn, "connection lost", None, now, events)
        self._conns.pop(conn_id, None)
        self._dirty.pop(conn_id, None)
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
        self._dirty.pop(conn_id, None)
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
                self._enqueue_ready(channel, conn)
                self._pump(channel, self._now if now is None else now)
        if conn.state is ClientState.CLOSED:
            del self._conns[conn_id]
        return data

    def connections_with_output(self) -> list[ConnectionId]:
        """Connections that got output since this was last called (then take ``data_to_send``)."""
        dirty = list(self._dirty)
        self._dirty.clear()
        return dirty

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

    # ------------------------------------------------------------------ timers

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` next has work (heartbeats, timeouts, deferred messages).

        While a backlog is being moved into channels (see :meth:`backlog_pending`) this is
        the latest ``now`` the node was given: work is due at once, one bounded step per
        :meth:`handle_timer` call, and the transport serves its other IO between calls.
        """
        if self._moving:
            return self._now
        alarms = self._alarms
        while alarms:
            deadline, _, owner = alarms[0]
            if owner.alarm_at != deadline:
                heappop(alarms)
                continue
            return deadline
        return None

    def handle_timer(self, now: float) -> list[ServerEvent]:
        """Do what is due at ``now``: heartbeats, client timeouts, message timeouts, deferred
        messages becoming ready (and the deliveries they allow), and one step of moving a
        topic's backlog into its channels. Each call does a bounded amount of work: when
        more is due, :meth:`next_deadline` says so and the transport calls again."""
        events: list[ServerEvent] = []
        self._now = now
        alarms = self._alarms
        # What this call arms for "now" (more of a channel's timeouts) waits for the next one.
        last_seq = self._seq
        while alarms and alarms[0][0] <= now and alarms[0][1] <= last_seq:
            deadline, _, owner = heappop(alarms)
            if owner.alarm_at != deadline:
                continue
            owner.alarm_at = _INF
            if isinstance(owner, _Conn):
                self._conn_timer(owner, now, events)
            else:
                self._channel_timer(owner, now, events)
        moving = self._moving
        if moving:
            topic = next(iter(moving))
            del moving[topic]  # back at the end of the line if it has more: topics take turns
            self._move_backlog(topic, now)
        return events

    def backlog_pending(self) -> bool:
        """True while some topic's backlog is still being moved into its channels."""
        return bool(self._moving)

    # ------------------------------------------------------------------ HTTP API (pure)

    def publish(self, topic: str, body: bytes, now: float, *, defer_ms: int = 0) -> None:
        """``POST /pub``: publish one message; raises :class:`AdminError` as nsqd answers."""
        self._check_running()
        if not body:
            raise AdminError(400, "MSG_EMPTY")
        if len(body) > self.options.max_msg_size:
            raise AdminError(413, "MSG_TOO_BIG")
        self._publish_many(topic, [bytes(body)], now, defer_ms)

    def multi_publish(
        self, topic: str, bodies: Sequence[bytes], now: float, *, defer_ms: int = 0
    ) -> None:
        """``POST /mpub``: publish several messages in order; all are checked before any is put."""
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
        self._publish_many(topic, checked, now, defer_ms)

    def create_topic(self, topic: str, now: float) -> None:
        """``POST /topic/create``."""
        self._check_running()
        self._get_topic(self._admin_topic(topic, "INVALID_TOPIC"), now)

    def delete_topic(self, topic: str, now: float) -> list[ServerEvent]:
        """``POST /topic/delete``: the topic, its channels and their clients' connections go."""
        self._check_running()
        found = self._topics.get(topic)
        if found is None:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        events: list[ServerEvent] = []
        self._delete_topic(found, now, events)
        return events

    def empty_topic(self, topic: str, now: float) -> None:
        """``POST /topic/empty``: drop what waits in the topic (not in its channels)."""
        self._check_running()
        found = self._existing_topic(self._admin_topic(topic, "INVALID_TOPIC"))
        found.mem.clear()
        found.backend.empty()
        found.spilled = found.backend.depth > 0

    def pause_topic(self, topic: str, now: float) -> None:
        """``POST /topic/pause``: messages wait in the topic until unpaused."""
        self._check_running()
        self._existing_topic(topic).paused = True

    def unpause_topic(self, topic: str, now: float) -> None:
        """``POST /topic/unpause``."""
        self._check_running()
        found = self._existing_topic(topic)
        found.paused = False
        self._topic_flow(found, now)

    def create_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/create`` (the topic must exist)."""
        self._check_running()
        found = self._existing_topic(self._admin_topic(topic, "INVALID_ARG_TOPIC"))
        self._get_channel(found, self._admin_channel(channel), now)

    def delete_channel(self, topic: str, channel: str, now: float) -> list[ServerEvent]:
        """``POST /channel/delete``: its messages go and its clients are disconnected."""
        self._check_running()
        found = self._existing_channel(topic, channel)
        events: list[ServerEvent] = []
        self._delete_channel(found, now, events)
        return events

    def empty_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/empty``: drop queued, in-flight and deferred messages."""
        self._check_running()
        found = self._existing_channel(topic, channel)
        found.mem.clear()
        found.backend.empty()
        found.spilled = found.backend.depth > 0
        for msg in found.in_flight.values():
            msg.timer = -1
        found.in_flight.clear()
        found.in_flight_heap.clear()
        found.deferred_heap.clear()
        for conn in found.clients.values():
            conn.in_flight = 0
            self._enqueue_ready(found, conn)

    def pause_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/pause``: no deliveries to its clients until unpaused."""
        self._check_running()
        self._existing_channel(topic, channel).paused = True

    def unpause_channel(self, topic: str, channel: str, now: float) -> None:
        """``POST /channel/unpause``."""
        self._check_running()
        found = self._existing_channel(topic, channel)
        found.paused = False
        self._pump(found, now)

    def topic_names(self) -> list[str]:
        """Topics on this node, sorted."""
        return sorted(self._topics)

    def channel_names(self, topic: str) -> list[str]:
        """Channels of a topic, sorted (empty if the topic does not exist)."""
        found = self._topics.get(topic)
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
            "start_time": int(self._start_time + self._epoch_offset),
            "max_heartbeat_interval": _nanoseconds(options.max_heartbeat_interval),
            "max_output_buffer_size": options.max_output_buffer_size,
            "max_output_buffer_timeout": _nanoseconds(options.max_output_buffer_timeout),
            "max_deflate_level": options.max_deflate_level,
        }

    def uptime(self, now: float) -> float:
        """Seconds since the node started (``now`` in the node's clock)."""
        return max(0.0, now - self._start_time)

    @property
    def health(self) -> str:
        """``"OK"``, or the last backend failure (``GET /ping`` answers 500 with it)."""
        return self._health

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
            "health": self._health,
            "start_time": int(self._start_time + self._epoch_offset),
            "topics": [],
            "producers": [],
        }
        if topic:
            if topic not in self._topics:
                return stats
            names = [topic]
        else:
            names = sorted(self._topics)
        topics: list[dict[str, Any]] = []
        for name in names:
            found = self._topics[name]
            if channel:
                chosen = [found.channels[channel]] if channel in found.channels else []
                if not chosen:
                    continue
            else:
                chosen = [found.channels[key] for key in sorted(found.channels)]
            channels: list[dict[str, Any]] = []
            for chan in chosen:
                clients = (
                    [self._client_stats(conn) for conn in chan.clients.values()]
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
                        "e2e_processing_latency": {"count": 0, "percentiles": None},
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
                    "e2e_processing_latency": {"count": 0, "percentiles": None},
                }
            )
        stats["topics"] = topics
        if include_clients:
            stats["producers"] = [
                self._client_stats(conn, topic or None)
                for conn in self._conns.values()
                if conn.pub_counts and conn.state is not ClientState.CLOSED
            ]
        return stats

    def take_registry_events(self) -> list[RegistryEvent]:
        """Topic/channel creations and deletions since the last call, in order (for lookupd).

        At most the last 100 000 are kept between calls; a registrar that falls further
        behind should resynchronise from :meth:`topic_names` / :meth:`channel_names`.
        """
        events = list(self._registry)
        self._registry.clear()
        return events

    def metadata(self) -> dict[str, Any]:
        """nsqd's ``nsqd.dat``: non-ephemeral topics and channels with their paused flags."""
        topics = []
        for name in sorted(self._topics):
            found = self._topics[name]
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
            found = self._get_topic(name, now)
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
                chan = self._get_channel(found, chan_name, now)
                chan.paused = bool(chan_entry.get("paused", False))
            found.starting = False
            self._topic_flow(found, now)

    def close(self, now: float) -> list[ServerEvent]:
        """Shut down: disconnect everyone, write memory, in-flight and deferred messages of
        non-ephemeral topics and channels to their backends, close the backends."""
        events: list[ServerEvent] = []
        if self.state is NSQDState.CLOSED:
            return events
        for conn in list(self._conns.values()):
            self._close(conn, "nsqd is shutting down", None, now, events)
        for found in self._topics.values():
            for chan in found.channels.values():
                if not chan.ephemeral:
                    pending = list(chan.mem)
                    pending.extend(chan.in_flight.values())
                    pending.extend(entry[2] for entry in sorted(chan.deferred_heap))
                    for msg in pending:
                        self._backend_put(chan.backend, msg)
                chan.mem.clear()
                chan.in_flight.clear()
                chan.in_flight_heap.clear()
                chan.deferred_heap.clear()
                chan.backend.close()
            if not found.ephemeral:
                for msg in found.mem:
                    self._backend_put(found.backend, msg)
            found.mem.clear()
            found.backend.close()
        self._alarms.clear()
        self._moving.clear()
        self.state = NSQDState.CLOSED
        return events

    # ------------------------------------------------------------------ input processing

    def _live_conn(self, conn_id: int) -> _Conn | None:
        conn = self._conns.get(conn_id)
        if conn is None:
            if 0 < conn_id < self._next_conn_id:
                return None
            raise LocalProtocolError(f"unknown connection id {conn_id}")
        if conn.state is ClientState.CLOSED:
            return None
        return conn

    def _decompress_into(
        self, conn: _Conn, data: bytes, now: float, events: list[ServerEvent]
    ) -> bool:
        try:
            for piece in conn.decoder.decompress_iter(data):
                conn.inbuf += piece
        except CompressionError as exc:
            self._close(conn, f"bad compressed stream from client: {exc}", None, now, events)
            return False
        return True

    def _process(self, conn: _Conn, now: float, events: list[ServerEvent]) -> None:
        """Run every complete command in ``conn.inbuf``."""
        buf = conn.inbuf
        pos = 0
        max_line = self.options.max_command_line
        fast_path = self._fast_path
        max_msg_size = self.options.max_msg_size
        topics = self._topics
        touched = self._touched
        freed = self._freed
        subscribed = ClientState.SUBSCRIBED
        try:
            while True:
                state = conn.state
                if (
                    state is ClientState.CLOSED
                    or state is ClientState.TLS_HANDSHAKE
                    or state is ClientState.AUTHENTICATING
                ):
                    break
                end = len(buf)
                if state is ClientState.AWAITING_MAGIC:
                    if end - pos < 4:
                        break
                    magic = bytes(buf[pos : pos + 4])
                    pos += 4
                    if magic != _MAGIC_V2:
                        error = ServerError("E_BAD_PROTOCOL", "")
                        self._write_frame(conn, _FRAME_ERROR, b"E_BAD_PROTOCOL")
                        self._close(conn, f"bad protocol magic {magic!r}", error, now, events)
                        break
                    conn.state = ClientState.INIT
                    conn.last_read = now
                    self._arm_conn(conn)
                    continue
                try:
                    verb = conn.pending_verb
                    if verb is None:
                        newline = buf.find(b"\n", pos)
                        if newline < 0 or newline - pos > max_line:
                            if newline >= 0 or end - pos > max_line:
                                self._close(
                                    conn,
                                    f"command line longer than {max_line} bytes",
                                    None,
                                    now,
                                    events,
                                )
                            break
                        line = bytes(buf[pos:newline])
                        pos = newline + 1
                        if line[-1:] == b"\r":
                            line = line[:-1]
                        conn.last_read = now
                        if fast_path and line[:4] == b"PUB " and end - pos >= 4:
                            # The common case in one step: a PUB to an existing topic whose
                            # body is all here (anything else takes the general path).
                            topic = topics.get(line[4:].decode("ascii", "replace"))
                            size = _I32.unpack_from(buf, pos)[0]
                            if topic is not None and 0 < size <= max_msg_size:
                                start = pos + 4
                                if end - start >= size:
                                    pos = start + size
                                    self._publish_one(conn, topic, bytes(buf[start:pos]), now)
                                    continue
                        elif (
                            line[:4] == b"FIN "
                            and len(line) == 20
                            and conn.state is subscribed
                            and fast_path
                        ):
                            channel = conn.channel
                            msg = None if channel is None else channel.in_flight.get(line[4:])
                            if channel is not None and msg is not None and msg.owner == conn.id:
                                self._finish(channel, conn, msg)
                                continue
                        self._command(conn, line.split(b" "), now, events)
                        continue
                    if conn.pending_size < 0:
                        if end - pos < 4:
                            break
                        size = _I32.unpack_from(buf, pos)[0]
                        pos += 4
                        self._check_body_size(verb, size)
                        conn.pending_size = size
                    size = conn.pending_size
                    if end - pos < size:
                        break
                    body = bytes(buf[pos : pos + size])
                    pos += size
                    params = conn.pending_params
                    conn.pending_verb = None
                    conn.pending_params = []
                    conn.pending_size = -1
                    self._body_command(conn, verb, params, body, now, events)
                except _ClientError as err:
                    conn.pending_verb = None
                    conn.pending_params = []
                    conn.pending_size = -1
                    self._client_error(conn, err, now, events)
                    continue
                if conn.switch_input:
                    # Compression starts right after IDENTIFY: what follows is compressed.
                    conn.switch_input = False
                    rest = bytes(buf[pos:])
                    del buf[:]
                    pos = 0
                    if rest and not self._decompress_into(conn, rest, now, events):
                        break
                if conn.state is ClientState.TLS_HANDSHAKE:
                    trailing = bytes(buf[pos:])
                    pos = len(buf)
                    events.append(StartTLS(conn.id, trailing))
                    break
        finally:
            del buf[:pos]
            if touched:
                for topic in list(touched):
                    self._pump_topic(topic, now)
                touched.clear()
            if freed:
                for channel in list(freed):
                    self._pump(channel, now)
                freed.clear()

    def _client_error(
        self, conn: _Conn, err: _ClientError, now: float, events: list[ServerEvent]
    ) -> None:
        text = f"{err.code} {err.text}".encode()
        self._write_frame(conn, _FRAME_ERROR, text)
        if err.fatal:
            self._close(
                conn,
                f"fatal error: {err.code} {err.text}",
                ServerError(err.code, err.text),
                now,
                events,
            )

    def _command(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        verb = params[0]
        if verb != b"IDENTIFY" and self.options.tls_required and not conn.tls:
            raise _ClientError("E_INVALID", f"cannot {_text(verb)} in current state (TLS required)")
        handler = self._handlers.get(verb)
        if handler is not None:
            handler(conn, params, now, events)
            return
        if verb in _BODY_COMMANDS:
            self._before_body(conn, verb, params, now)
            conn.pending_verb = verb
            conn.pending_params = params
            conn.pending_size = -1
            return
        raise _ClientError("E_INVALID", f"invalid command {_text(verb)}")

    def _before_body(self, conn: _Conn, verb: bytes, params: list[bytes], now: float) -> None:
        """nsqd's checks that come before it reads a command's body."""
        if verb == b"PUB":
            if len(params) < 2:
                raise _ClientError("E_INVALID", "PUB insufficient number of parameters")
            self._topic_param("PUB", params[1])
        elif verb == b"MPUB":
            if len(params) < 2:
                raise _ClientError("E_INVALID", "MPUB insufficient number of parameters")
            topic = self._topic_param("MPUB", params[1])
            self._check_auth(conn, "MPUB", topic, "", now)
        elif verb == b"DPUB":
            if len(params) < 3:
                raise _ClientError("E_INVALID", "DPUB insufficient number of parameters")
            self._topic_param("DPUB", params[1])
            timeout_ms = _base10(params[2])
            if timeout_ms is None:
                raise _ClientError("E_INVALID", f"DPUB could not parse timeout {_text(params[2])}")
            max_ms = int(self.options.effective_max_defer_timeout * 1000)
            if timeout_ms > max_ms:
                raise _ClientError(
                    "E_INVALID", f"DPUB timeout {timeout_ms} out of range 0-{max_ms}"
                )
        elif verb == b"IDENTIFY":
            if conn.state is not ClientState.INIT:
                raise _ClientError("E_INVALID", "cannot IDENTIFY in current state")
        elif verb == b"AUTH":
            if conn.state is not ClientState.INIT:
                raise _ClientError("E_INVALID", "cannot AUTH in current state")
            if len(params) != 1:
                raise _ClientError("E_INVALID", "AUTH invalid number of parameters")

    def _check_body_size(self, verb: bytes, size: int) -> None:
        options = self.options
        if verb == b"PUB" or verb == b"DPUB":
            name = verb.decode()
            if size <= 0:
                raise _ClientError("E_BAD_MESSAGE", f"{name} invalid message body size {size}")
            if size > options.max_msg_size:
                raise _ClientError(
                    "E_BAD_MESSAGE", f"{name} message too big {size} > {options.max_msg_size}"
                )
        elif verb == b"MPUB":
            if size <= 0:
                raise _ClientError("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > options.max_body_size:
                raise _ClientError(
                    "E_BAD_BODY", f"MPUB body too big {size} > {options.max_body_size}"
                )
        else:  # IDENTIFY, AUTH
            name = verb.decode()
            if size > options.max_body_size:
                raise _ClientError(
                    "E_BAD_BODY", f"{name} body too big {size} > {options.max_body_size}"
                )
            if size <= 0:
                raise _ClientError("E_BAD_BODY", f"{name} invalid body size {size}")

    def _body_command(
        self,
        conn: _Conn,
        verb: bytes,
        params: list[bytes],
        body: bytes,
        now: float,
        events: list[ServerEvent],
    ) -> None:
        if verb == b"PUB":
            self._cmd_pub(conn, params, body, now)
        elif verb == b"MPUB":
            self._cmd_mpub(conn, params, body, now)
        elif verb == b"DPUB":
            self._cmd_dpub(conn, params, body, now)
        elif verb == b"IDENTIFY":
            self._cmd_identify(conn, body, now)
        else:
            self._cmd_auth(conn, body, now, events)

    def _topic_param(self, command: str, raw: bytes) -> str:
        try:
            name = raw.decode("ascii")
        except UnicodeDecodeError:
            name = ""
        if name in self._topics:
            return name
        try:
            return validate_topic(name)
        except InvalidName:
            raise _ClientError(
                "E_BAD_TOPIC",
                f"{'E_BAD_TOPIC ' if command == 'MPUB' else ''}{command} topic name "
                f"{_go_quote(raw)} is not valid",
            ) from None

    # ------------------------------------------------------------------ commands

    def _cmd_identify(self, conn: _Conn, body: bytes, now: float) -> None:
        options = self.options
        data = _parse_identify(body)

        def invalid(what: str, value: int) -> _ClientError:
            return _ClientError("E_BAD_BODY", f"IDENTIFY {what} ({value}) is invalid")

        heartbeat = conn.heartbeat_interval
        if data.heartbeat_interval == -1:
            heartbeat = 0.0
        elif data.heartbeat_interval != 0:
            if not 1000 <= data.heartbeat_interval <= options.max_heartbeat_interval * 1000:
                raise invalid("heartbeat interval", data.heartbeat_interval)
            heartbeat = data.heartbeat_interval / 1000
        buffer_timeout = conn.output_buffer_timeout
        if data.output_buffer_timeout == -1:
            buffer_timeout = 0.0
        elif data.output_buffer_timeout != 0:
            low = options.min_output_buffer_timeout * 1000
            high = options.max_output_buffer_timeout * 1000
            if not low <= data.output_buffer_timeout <= high:
                raise invalid("output buffer timeout", data.output_buffer_timeout)
            buffer_timeout = data.output_buffer_timeout / 1000
        buffer_size = conn.output_buffer_size
        if data.output_buffer_size == -1:
            buffer_size = 1
            buffer_timeout = 0.0
        elif data.output_buffer_size != 0:
            if not 64 <= data.output_buffer_size <= options.max_output_buffer_size:
                raise invalid("output buffer size", data.output_buffer_size)
            buffer_size = data.output_buffer_size
        if not 0 <= data.sample_rate <= 99:
            raise invalid("sample rate", data.sample_rate)
        msg_timeout = conn.msg_timeout
        if data.msg_timeout != 0:
            if not 1000 <= data.msg_timeout <= options.max_msg_timeout * 1000:
                raise invalid("msg timeout", data.msg_timeout)
            msg_timeout = data.msg_timeout / 1000

        if data.client_id:
            conn.client_id = data.client_id
        if data.hostname:
            conn.hostname = data.hostname
        conn.user_agent = data.user_agent
        conn.heartbeat_interval = heartbeat
        conn.output_buffer_timeout = buffer_timeout
        conn.output_buffer_size = buffer_size
        conn.high_water = _high_water(buffer_size)
        conn.sample_rate = data.sample_rate
        conn.msg_timeout = msg_timeout
        conn.next_heartbeat = now + heartbeat if heartbeat > 0 else _INF
        self._arm_conn(conn)

        if not data.feature_negotiation:
            self._write(conn, self._ok_frame)
            return
        compressed = conn.encoder is not None or conn.pending_compression is not None
        tls = options.tls_available and data.tls_v1 and not conn.tls
        deflate = options.deflate and data.deflate and not compressed
        deflate_level = data.deflate_level if deflate and data.deflate_level > 0 else 6
        deflate_level = min(deflate_level, options.max_deflate_level)
        snappy = options.snappy and data.snappy and not compressed
        if deflate and snappy:
            raise _ClientError(
                "E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression"
            )
        answer = {
            "max_rdy_count": options.max_rdy_count,
            "version": options.version,
            "max_msg_timeout": int(options.max_msg_timeout * 1000),
            "msg_timeout": int(conn.msg_timeout * 1000),
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": deflate_level,
            "max_deflate_level": options.max_deflate_level,
            "snappy": snappy,
            "sample_rate": conn.sample_rate,
            "auth_required": options.auth_enabled,
            "output_buffer_size": conn.output_buffer_size,
            "output_buffer_timeout": int(conn.output_buffer_timeout * 1000),
        }
        self._write_frame(conn, _FRAME_RESPONSE, json.dumps(answer, separators=(",", ":")).encode())
        compression = ("snappy", 0) if snappy else ("deflate", deflate_level) if deflate else None
        if tls:
            conn.state = ClientState.TLS_HANDSHAKE
            conn.pending_compression = compression
        elif compression is not None:
            self._enable_compression(conn, compression[0], compression[1])
            conn.switch_input = True

    def _enable_compression(self, conn: _Conn, kind: str, level: int) -> None:
        from ..compression import DeflateCodec, SnappyCodec

        # What is already queued was produced before the upgrade and goes out uncompressed.
        if conn.out:
            conn.raw_prefix += b"".join(conn.out)
            conn.out.clear()
            conn.out_len = 0
        codec: Any = SnappyCodec() if kind == "snappy" else DeflateCodec(level)
        conn.encoder = codec
        conn.decoder = codec
        if kind == "snappy":
            conn.snappy = True
        else:
            conn.deflate = True
            conn.deflate_level = level
        self._write(conn, self._ok_frame)

    @staticmethod
    def _auth_request(conn: _Conn, secret: str) -> AuthRequest:
        host = conn.remote_address.rsplit(":", 1)[0] if ":" in conn.remote_address else ""
        return AuthRequest(remote_ip=host.strip("[]"), tls=conn.tls, secret=secret)

    def _query_auth(self, conn: _Conn, secret: str) -> AuthState | None:
        check = self.options.auth_check
        if check is None:
            return None
        try:
            result = check(self._auth_request(conn, secret))
        except Exception:
            return None
        return result if isinstance(result, AuthState) else None

    def _cmd_auth(self, conn: _Conn, body: bytes, now: float, events: list[ServerEvent]) -> None:
        if conn.auth is not None and conn.auth.authorizations:
            raise _ClientError("E_INVALID", "AUTH already set")
        if not self.options.auth_enabled:
            raise _ClientError("E_AUTH_DISABLED", "AUTH disabled")
        secret = body.decode("utf-8", "replace")
        conn.auth_secret = secret
        if self.options.auth_by_transport:
            conn.state = ClientState.AUTHENTICATING
            events.append(AuthRequested(conn.id, self._auth_request(conn, secret)))
            return
        self._apply_auth(conn, self._query_auth(conn, secret), now)

    def _apply_auth(self, conn: _Conn, state: AuthState | None, now: float) -> None:
        """Answer AUTH from the auth server's verdict (nsqd's checks and texts)."""
        if state is None:
            raise _ClientError("E_AUTH_FAILED", "AUTH failed")
        conn.auth = state
        conn.auth_expires = now + state.ttl
        if self.options.auth_by_transport:
            self._arm(conn, conn.auth_expires)
        if not state.authorizations:
            raise _ClientError("E_UNAUTHORIZED", "AUTH no authorizations found")
        answer = {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        }
        self._write_frame(conn, _FRAME_RESPONSE, json.dumps(answer, separators=(",", ":")).encode())

    def _check_auth(self, conn: _Conn, command: str, topic: str, channel: str, now: float) -> None:
        if not self.options.auth_enabled:
            return
        state = conn.auth
        if state is None or not state.authorizations:
            raise _ClientError("E_AUTH_FIRST", f"AUTH required before {command}")
        if now >= conn.auth_expires and not self.options.auth_by_transport:
            refreshed = self._query_auth(conn, conn.auth_secret)
            if refreshed is None:
                raise _ClientError("E_AUTH_FAILED", "AUTH failed")
            conn.auth = state = refreshed
            conn.auth_expires = now + refreshed.ttl
        if not state.allows(topic, channel):
            raise _ClientError(
                "E_UNAUTHORIZED",
                f"AUTH failed for {command} on {_go_quote(topic)} {_go_quote(channel)}",
            )

    def _cmd_sub(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        if conn.state is not ClientState.INIT:
            raise _ClientError("E_INVALID", "cannot SUB in current state")
        if conn.heartbeat_interval <= 0:
            raise _ClientError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise _ClientError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = self._topic_param("SUB", params[1])
        try:
            channel_name = validate_channel(params[2].decode("ascii"))
        except (UnicodeDecodeError, InvalidName):
            raise _ClientError(
                "E_BAD_CHANNEL", f"SUB channel name {_go_quote(params[2])} is not valid"
            ) from None
        self._check_auth(conn, "SUB", topic_name, channel_name, now)
        topic = self._get_topic(topic_name, now)
        channel = self._get_channel(topic, channel_name, now)
        limit = self.options.max_channel_consumers
        if limit and len(channel.clients) >= limit:
            raise _ClientError(
                "E_SUB_FAILED",
                f"SUB failed consumers for {topic_name}:{channel_name} exceeds limit of {limit}",
            )
        channel.clients[conn.id] = conn
        conn.channel = channel
        conn.state = ClientState.SUBSCRIBED
        self._write(conn, self._ok_frame)

    def _cmd_rdy(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        state = conn.state
        if state is ClientState.CLOSING:
            return
        if state is not ClientState.SUBSCRIBED:
            raise _ClientError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            parsed = _base10(params[1])
            if parsed is None:
                raise _ClientError("E_INVALID", f"RDY could not parse count {_text(params[1])}")
            count = parsed
        max_rdy = self.options.max_rdy_count
        if count > max_rdy:
            raise _ClientError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        conn.ready_count = count
        channel = conn.channel
        if channel is not None and conn.in_flight < count:
            self._enqueue_ready(channel, conn)
            self._pump(channel, now)

    def _in_flight_command(
        self, conn: _Conn, params: list[bytes], command: str, min_params: int
    ) -> tuple[_Channel, bytes]:
        state = conn.state
        channel = conn.channel
        if (
            state is not ClientState.SUBSCRIBED and state is not ClientState.CLOSING
        ) or channel is None:
            raise _ClientError("E_INVALID", f"cannot {command} in current state")
        if len(params) < min_params:
            raise _ClientError("E_INVALID", f"{command} insufficient number of params")
        message_id = params[1]
        if len(message_id) != 16:
            raise _ClientError("E_INVALID", "invalid message ID")
        return channel, message_id

    def _take_in_flight(self, channel: _Channel, conn: _Conn, message_id: bytes) -> _Msg | str:
        msg = channel.in_flight.get(message_id)
        if msg is None:
            return "ID not in flight"
        if msg.owner != conn.id:
            return "client does not own message"
        del channel.in_flight[message_id]
        msg.timer = -1
        heap = channel.in_flight_heap
        if len(heap) > 2 * len(channel.in_flight) + 1024:
            heap[:] = [entry for entry in heap if entry[2].timer == entry[1]]
            heapify(heap)
        return msg

    def _cmd_fin(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "FIN", 2)
        msg = channel.in_flight.get(message_id)
        if msg is None:
            failure = "ID not in flight"
        elif msg.owner != conn.id:
            failure = "client does not own message"
        else:
            self._finish(channel, conn, msg)
            return
        raise _ClientError("E_FIN_FAILED", f"FIN {_text(message_id)} failed {failure}", fatal=False)

    def _finish(self, channel: _Channel, conn: _Conn, msg: _Msg) -> None:
        """A FIN that matched: the message is done; deliveries it allows come at input end."""
        in_flight = channel.in_flight
        del in_flight[msg.id]
        msg.timer = -1
        heap = channel.in_flight_heap
        if len(heap) > 2 * len(in_flight) + 1024:
            heap[:] = [entry for entry in heap if entry[2].timer == entry[1]]
            heapify(heap)
        conn.finish_count += 1
        conn.in_flight -= 1
        if conn.in_flight < conn.ready_count:
            self._enqueue_ready(channel, conn)
            self._freed[channel] = None

    def _cmd_req(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "REQ", 3)
        timeout_ms = _base10(params[2])
        if timeout_ms is None:
            raise _ClientError("E_INVALID", f"REQ could not parse timeout {_text(params[2])}")
        timeout = min(timeout_ms / 1000, self.options.max_req_timeout)
        msg = self._take_in_flight(channel, conn, message_id)
        if isinstance(msg, str):
            raise _ClientError("E_REQ_FAILED", f"REQ {_text(message_id)} failed {msg}", fatal=False)
        conn.requeue_count += 1
        conn.in_flight -= 1
        channel.requeue_count += 1  # nsqd counts a REQ when it is made, delayed or not
        if timeout <= 0:
            self._channel_put(channel, msg)
        else:
            self._defer(channel, msg, now + timeout)
        if conn.in_flight < conn.ready_count:
            self._enqueue_ready(channel, conn)
        self._pump(channel, now)

    def _cmd_touch(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        channel, message_id = self._in_flight_command(conn, params, "TOUCH", 2)
        msg = channel.in_flight.get(message_id)
        failure = None
        if msg is None:
            failure = "ID not in flight"
        elif msg.owner != conn.id:
            failure = "client does not own message"
        if failure is not None or msg is None:
            raise _ClientError(
                "E_TOUCH_FAILED", f"TOUCH {_text(message_id)} failed {failure}", fatal=False
            )
        deadline = now + conn.msg_timeout
        max_timeout = self.options.max_msg_timeout
        if deadline - msg.delivered_at >= max_timeout:
            deadline = msg.delivered_at + max_timeout
        self._start_in_flight_timer(channel, msg, deadline)

    def _cmd_cls(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        if conn.state is not ClientState.SUBSCRIBED:
            raise _ClientError("E_INVALID", "cannot CLS in current state")
        conn.ready_count = 0
        conn.state = ClientState.CLOSING
        self._write_frame(conn, _FRAME_RESPONSE, _CLOSE_WAIT)

    def _cmd_nop(
        self, conn: _Conn, params: list[bytes], now: float, events: list[ServerEvent]
    ) -> None:
        return None

    def _cmd_pub(self, conn: _Conn, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("PUB", params[1])
        self._check_auth(conn, "PUB", topic_name, "", now)
        self._publish_one(conn, self._get_topic(topic_name, now), body, now)

    def _publish_one(self, conn: _Conn, topic: _Topic, body: bytes, now: float) -> None:
        """PUB's work once checked; deliveries happen when the input chunk is done."""
        self._touched[topic] = None
        try:
            self._topic_put(topic, _Msg(self._new_id(), body, self._timestamp(now)), now)
        except BackendError as exc:
            raise _ClientError("E_PUB_FAILED", f"PUB failed {exc}") from None
        counts = conn.pub_counts
        name = topic.name
        counts[name] = counts.get(name, 0) + 1
        conn.out.append(self._ok_frame)
        conn.out_len += 10
        self._dirty[conn.id] = None

    def _cmd_dpub(self, conn: _Conn, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("DPUB", params[1])
        timeout_ms = _base10(params[2]) or 0
        self._check_auth(conn, "DPUB", topic_name, "", now)
        topic = self._get_topic(topic_name, now)
        msg = _Msg(self._new_id(), body, self._timestamp(now), 0, timeout_ms / 1000)
        self._touched[topic] = None
        try:
            self._topic_put(topic, msg, now)
        except BackendError as exc:
            raise _ClientError("E_DPUB_FAILED", f"DPUB failed {exc}") from None
        conn.pub_counts[topic_name] = conn.pub_counts.get(topic_name, 0) + 1
        self._write(conn, self._ok_frame)

    def _cmd_mpub(self, conn: _Conn, params: list[bytes], body: bytes, now: float) -> None:
        topic_name = self._topic_param("MPUB", params[1])
        topic = self._get_topic(topic_name, now)
        bodies = self._split_mpub(body)
        timestamp = self._timestamp(now)
        self._touched[topic] = None
        try:
            for part in bodies:
                self._topic_put(topic, _Msg(self._new_id(), part, timestamp), now)
        except BackendError as exc:
            raise _ClientError("E_MPUB_FAILED", f"MPUB failed {exc}") from None
        conn.pub_counts[topic_name] = conn.pub_counts.get(topic_name, 0) + len(bodies)
        self._write(conn, self._ok_frame)

    def _split_mpub(self, body: bytes) -> list[bytes]:
        options = self.options
        end = len(body)
        if end < 4:
            raise _ClientError("E_BAD_BODY", "MPUB failed to read message count")
        count = _I32.unpack_from(body, 0)[0]
        max_messages = (options.max_body_size - 4) // 5
        if count <= 0 or count > max_messages:
            raise _ClientError("E_BAD_BODY", f"MPUB invalid message count {count}")
        bodies: list[bytes] = []
        pos = 4
        max_size = options.max_msg_size
        for index in range(count):
            if end - pos < 4:
                raise _ClientError(
                    "E_BAD_MESSAGE", f"MPUB failed to read message({index}) body size"
                )
            size = _I32.unpack_from(body, pos)[0]
            pos += 4
            if size <= 0:
                raise _ClientError(
                    "E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}"
                )
            if size > max_size:
                raise _ClientError("E_BAD_MESSAGE", f"MPUB message too big {size} > {max_size}")
            if end - pos < size:
                raise _ClientError("E_BAD_MESSAGE", "MPUB failed to read message body")
            bodies.append(body[pos : pos + size])
            pos += size
        if pos != end:
            raise _ClientError(
                "E_BAD_BODY", f"MPUB body size {end} does not match its messages ({pos} bytes)"
            )
        return bodies

    # ------------------------------------------------------------------ topics and channels

    def _timestamp(self, now: float) -> int:
        return int((now + self._epoch_offset) * 1_000_000_000)

    def _new_id(self) -> bytes:
        counter = self._id_counter
        self._id_counter = counter + 1
        return b"%016x" % (self._id_base | (counter & _ID_COUNTER_MASK))

    def _make_backend(self, topic: str, channel: str | None) -> Backend:
        if is_ephemeral(channel if channel is not None else topic):
            return DiscardBackend()
        return self._backend_factory(backend_name(topic, channel))

    def _get_topic(self, name: str, now: float) -> _Topic:
        topic = self._topics.get(name)
        if topic is None:
            topic = _Topic(name, self._make_backend(name, None))
            self._topics[name] = topic
            self._registry.append(TopicCreated(name))
        return topic

    def _get_channel(self, topic: _Topic, name: str, now: float) -> _Channel:
        channel = topic.channels.get(name)
        if channel is None:
            channel = _Channel(topic, name, self._make_backend(topic.name, name))
            topic.channels[name] = channel
            self._registry.append(ChannelCreated(topic.name, name))
            self._topic_flow(topic, now)
        return channel

    def _topic_put(self, topic: _Topic, msg: _Msg, now: float) -> None:
        """Publish to a topic: straight to its channels, or queued while it has none or is
        paused. Raises BackendError only when the message could not be kept at all."""
        if (
            topic.channels
            and not topic.paused
            and not topic.starting
            and (msg.deferred or not (topic.mem or topic.spilled))
        ):
            # Straight to the channels, unless a backlog is still being moved into them:
            # then the message waits behind it (a DPUB's copies are held back anyway).
            self._distribute(topic, msg, now)
        elif len(topic.mem) < self._mem_limit and not topic.spilled:
            topic.mem.append(msg)
        else:
            topic.backend.put(encode_record(msg.id, msg.timestamp, msg.attempts, msg.body))
            topic.spilled = True
        topic.message_count += 1
        topic.message_bytes += len(msg.body)

    def _topic_flow(self, topic: _Topic, now: float) -> None:
        """Start moving what waits in a topic into its channels (after SUB, unpause, restart):
        the first step now, the rest in :meth:`handle_timer` steps."""
        self._move_backlog(topic, now)

    def _move_backlog(self, topic: _Topic, now: float) -> None:
        """Move one bounded step of a topic's backlog into its channels and deliver what it
        allows; the topic stays in ``_moving`` while it has more."""
        if (
            not topic.channels
            or topic.paused
            or topic.starting
            or topic.deleted
            or not (topic.mem or topic.spilled)
        ):
            self._moving.pop(topic, None)
            return
        mem = topic.mem
        moved = 0
        size = 0
        while mem and moved < _BACKLOG_STEP_MESSAGES and size < _BACKLOG_STEP_BYTES:
            msg = mem.popleft()
            self._distribute(topic, msg, now)
            moved += 1
            size += len(msg.body)
        if not mem and topic.spilled:
            backend = topic.backend
            while moved < _BACKLOG_STEP_MESSAGES and size < _BACKLOG_STEP_BYTES:
                record = backend.get()
                if record is None:
                    break
                moved += 1
                size += len(record)
                decoded = decode_record(record)
                if decoded is not None:
                    self._distribute(topic, _record_msg(decoded), now)
            topic.spilled = backend.depth > 0
        if mem or topic.spilled:
            self._moving[topic] = None
        else:
            self._moving.pop(topic, None)
        self._pump_topic(topic, now)

    def _distribute(self, topic: _Topic, msg: _Msg, now: float) -> None:
        first = True
        delay = msg.deferred  # read once: every channel's copy is held back (DPUB)
        if delay > 0:
            msg.deferred = 0.0
        for channel in topic.channels.values():
            copy = msg if first else _Msg(msg.id, msg.body, msg.timestamp, msg.attempts)
            first = False
            channel.message_count += 1
            if delay > 0:
                self._defer(channel, copy, now + delay)
                continue
            if channel.ready and len(channel.mem) >= self._mem_limit:
                self._pump(channel, now)  # make room rather than spill to the backend
            self._channel_put(channel, copy)

    def _pump_topic(self, topic: _Topic, now: float) -> None:
        """Deliver what the last puts queued (once per command, not once per message)."""
        for channel in topic.channels.values():
            if channel.ready:
                self._pump(channel, now)

    def _channel_put(self, channel: _Channel, msg: _Msg) -> None:
        if len(channel.mem) < self._mem_limit and not channel.spilled:
            channel.mem.append(msg)
            return
        try:
            channel.backend.put(encode_record(msg.id, msg.timestamp, msg.attempts, msg.body))
            channel.spilled = True
        except BackendError as exc:
            # nsqd logs and marks itself unhealthy; keep the message in memory rather than lose it.
            self._health = f"NOK - {exc}"
            channel.mem.append(msg)

    def _backend_put(self, backend: Backend, msg: _Msg) -> None:
        try:
            backend.put(encode_record(msg.id, msg.timestamp, msg.attempts, msg.body))
        except BackendError as exc:
            self._health = f"NOK - {exc}"

    def _defer(self, channel: _Channel, msg: _Msg, deadline: float) -> None:
        self._seq += 1
        heappush(channel.deferred_heap, (deadline, self._seq, msg))
        if deadline < channel.alarm_at:
            self._arm(channel, deadline)

    def _start_in_flight_timer(self, channel: _Channel, msg: _Msg, deadline: float) -> None:
        self._seq += 1
        seq = self._seq
        msg.timer = seq
        heappush(channel.in_flight_heap, (deadline, seq, msg))
        if deadline < channel.alarm_at:
            self._arm(channel, deadline)

    def _next_message(self, channel: _Channel) -> _Msg | None:
        mem = channel.mem
        backend = channel.backend
        if mem:
            msg = mem.popleft()
            if not channel.spilled:
                return msg
            # Keep FIFO order: what overflowed to the backend moves up as memory frees.
            while backend.depth and len(mem) < self._mem_limit:
                record = backend.get()
                if record is None:
                    break
                decoded = decode_record(record)
                if decoded is not None:
                    mem.append(_record_msg(decoded))
                    break
            channel.spilled = backend.depth > 0
            return msg
        found = None
        while channel.spilled:
            record = backend.get()
            channel.spilled = backend.depth > 0
            if record is None:
                break
            decoded = decode_record(record)
            if decoded is not None:
                found = _record_msg(decoded)
                break
        return found

    def _enqueue_ready(self, channel: _Channel, conn: _Conn) -> None:
        if not conn.queued and conn.state is ClientState.SUBSCRIBED:
            conn.queued = True
            channel.ready.append(conn)

    def _pump(self, channel: _Channel, now: float) -> None:
        """Deliver queued messages to ready clients, one each in turn, as RDY allows."""
        if channel.paused or channel.deleted or not (channel.mem or channel.spilled):
            return
        ready = channel.ready
        subscribed = ClientState.SUBSCRIBED
        self._now = now
        while ready:
            conn = ready[0]
            if conn.state is not subscribed or conn.in_flight >= conn.ready_count:
                ready.popleft()
                conn.queued = False
                continue
            if conn.out_len >= conn.high_water:
                # Output back-pressure: the client has not taken what it was sent. It leaves
                # the ready queue; data_to_send puts it back (nsqd's blocked messagePump).
                ready.popleft()
                conn.queued = False
                self._block(conn, now)
                continue
            msg = self._next_message(channel)
            if msg is None:
                return
            ready.popleft()
            self._deliver(channel, conn, msg, now)
            if conn.in_flight >= conn.ready_count:
                conn.queued = False
            elif conn.out_len < conn.high_water:
                ready.append(conn)
            else:
                conn.queued = False
                self._block(conn, now)

    def _block(self, conn: _Conn, now: float) -> None:
        conn.blocked = True
        if not conn.poll_delay:
            conn.took = False
            conn.poll_delay = _RESUME_POLL
            self._arm(conn, now + _RESUME_POLL)

    def _deliver(self, channel: _Channel, conn: _Conn, msg: _Msg, now: float) -> None:
        sample_rate = conn.sample_rate
        if sample_rate and self._rng.randrange(100) > sample_rate:
            return  # nsqd's sampling: the message is consumed without being sent
        message_id = msg.id
        if message_id in channel.in_flight:
            self._defer(channel, msg, now + _DUPLICATE_ID_RETRY)
            return
        attempts = msg.attempts + 1
        if attempts > _MAX_ATTEMPTS:
            attempts = _MAX_ATTEMPTS
        msg.attempts = attempts
        msg.owner = conn.id
        msg.delivered_at = now
        channel.in_flight[message_id] = msg
        deadline = now + conn.msg_timeout
        self._seq = seq = self._seq + 1
        msg.timer = seq
        heappush(channel.in_flight_heap, (deadline, seq, msg))
        if deadline < channel.alarm_at:
            self._arm(channel, deadline)
        conn.in_flight += 1
        conn.message_count += 1
        body = msg.body
        out = conn.out
        out.append(
            _MESSAGE_FRAME_HEADER.pack(30 + len(body), _FRAME_MESSAGE, msg.timestamp, attempts)
        )
        out.append(message_id)
        out.append(body)
        conn.out_len += 34 + len(body)
        self._dirty[conn.id] = None

    def _channel_timer(self, channel: _Channel, now: float, events: list[ServerEvent]) -> None:
        if channel.deleted:
            return
        heap = channel.in_flight_heap
        in_flight = channel.in_flight
        clients = channel.clients
        budget = _TIMER_STEP
        while heap and heap[0][0] <= now and budget:
            _, seq, msg = heappop(heap)
            if msg.timer != seq:
                continue
            msg.timer = -1
            budget -= 1
            del in_flight[msg.id]
            channel.timeout_count += 1
            owner = clients.get(msg.owner)
            if owner is not None:
                owner.in_flight -= 1
                if owner.in_flight < owner.ready_count:
                    self._enqueue_ready(channel, owner)
            self._channel_put(channel, msg)
        deferred = channel.deferred_heap
        while deferred and deferred[0][0] <= now and budget:
            self._channel_put(channel, heappop(deferred)[2])
            budget -= 1
        while heap and heap[0][2].timer != heap[0][1]:
            heappop(heap)
        next_at = min(heap[0][0] if heap else _INF, deferred[0][0] if deferred else _INF)
        if next_at < _INF:
            # More due than one step takes: the rest at once, in the next handle_timer call.
            self._arm(channel, max(next_at, now))
        self._pump(channel, now)

    def _delete_channel(self, channel: _Channel, now: float, events: list[ServerEvent]) -> None:
        if channel.deleted:
            return
        channel.deleted = True
        topic = channel.topic
        for conn in list(channel.clients.values()):
            self._close(conn, f"channel {topic.name}:{channel.name} was deleted", None, now, events)
        channel.clients.clear()
        channel.ready.clear()
        channel.mem.clear()
        for msg in channel.in_flight.values():
            msg.timer = -1
        channel.in_flight.clear()
        channel.in_flight_heap.clear()
        channel.deferred_heap.clear()
        channel.alarm_at = _INF
        channel.backend.delete()
        if topic.channels.get(channel.name) is channel:
            del topic.channels[channel.name]
        self._registry.append(ChannelDeleted(topic.name, channel.name))
        if topic.ephemeral and not topic.channels and not topic.deleted:
            self._delete_topic(topic, now, events)

    def _delete_topic(self, topic: _Topic, now: float, events: list[ServerEvent]) -> None:
        if topic.deleted:
            return
        topic.deleted = True
        self._moving.pop(topic, None)
        for channel in list(topic.channels.values()):
            self._delete_channel(channel, now, events)
        topic.mem.clear()
        topic.backend.delete()
        if self._topics.get(topic.name) is topic:
            del self._topics[topic.name]
        self._registry.append(TopicDeleted(topic.name))

    # ------------------------------------------------------------------ connection lifecycle

    def _close(
        self,
        conn: _Conn,
        reason: str,
        error: ServerError | None,
        now: float,
        events: list[ServerEvent],
    ) -> None:
        if conn.state is ClientState.CLOSED:
            return
        conn.state = ClientState.CLOSED
        conn.alarm_at = _INF
        conn.inbuf.clear()
        conn.pending_verb = None
        channel = conn.channel
        if channel is not None and channel.clients.get(conn.id) is conn:
            del channel.clients[conn.id]
            if self.options.requeue_in_flight_on_close and conn.in_flight:
                mine = [msg for msg in channel.in_flight.values() if msg.owner == conn.id]
                for msg in mine:
                    del channel.in_flight[msg.id]
                    msg.timer = -1
                    self._channel_put(channel, msg)
                conn.in_flight = 0
                self._pump(channel, now)
            if channel.ephemeral and not channel.clients and not channel.deleted:
                self._delete_channel(channel, now, events)
        events.append(CloseConnection(conn.id, reason, error))
        self._dirty[conn.id] = None

    def _conn_timer(self, conn: _Conn, now: float, events: list[ServerEvent]) -> None:
        state = conn.state
        if state is ClientState.CLOSED:
            return
        delay = conn.poll_delay
        if delay:
            # Back-pressure poll: output was taken since the last one (keep coming back
            # soon), or the client is still held back (back off), or it is over (stop).
            if conn.took:
                conn.took = False
                delay = _RESUME_POLL
            elif conn.blocked:
                delay = min(delay * 2, _RESUME_POLL_MAX)
            else:
                delay = 0.0
            conn.poll_delay = delay
            if delay:
                self._arm(conn, now + delay)
        if state is ClientState.AWAITING_MAGIC:
            limit = conn.connected_at + self.options.client_timeout
            if now >= limit:
                self._close(conn, "timed out waiting for the protocol magic", None, now, events)
            else:
                self._arm(conn, limit)
            return
        if (
            self.options.auth_by_transport
            and conn.auth is not None
            and not conn.auth_refreshing
            and state is not ClientState.AUTHENTICATING
        ):
            if now >= conn.auth_expires:
                conn.auth_refreshing = True
                request = self._auth_request(conn, conn.auth_secret)
                events.append(AuthRequested(conn.id, request, refresh=True))
            else:
                self._arm(conn, conn.auth_expires)
        heartbeat = conn.heartbeat_interval
        if heartbeat <= 0:
            return
        read_deadline = conn.last_read + 2 * heartbeat
        if now >= read_deadline:
            self._close(
                conn, f"no command for {2 * heartbeat:g}s (missed heartbeats)", None, now, events
            )
            return
        if now >= conn.next_heartbeat:
            if state is not ClientState.TLS_HANDSHAKE:
                self._write(conn, self._heartbeat_frame)
            conn.next_heartbeat += heartbeat
            if conn.next_heartbeat <= now:
                conn.next_heartbeat = now + heartbeat
        self._arm(conn, min(conn.next_heartbeat, read_deadline))

    def _arm_conn(self, conn: _Conn) -> None:
        heartbeat = conn.heartbeat_interval
        if heartbeat > 0:
            self._arm(conn, min(conn.next_heartbeat, conn.last_read + 2 * heartbeat))

    def _arm(self, owner: _Timed, deadline: float) -> None:
        if deadline < owner.alarm_at:
            owner.alarm_at = deadline
            self._seq += 1
            heappush(self._alarms, (deadline, self._seq, owner))

    # ------------------------------------------------------------------ output

    def _write(self, conn: _Conn, frame: bytes) -> None:
        conn.out.append(frame)
        conn.out_len += len(frame)
        self._dirty[conn.id] = None

    def _write_frame(self, conn: _Conn, frame_type: int, data: bytes) -> None:
        self._write(conn, _FRAME_HEADER.pack(len(data) + 4, frame_type) + data)

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

    def _existing_topic(self, topic: str) -> _Topic:
        found = self._topics.get(topic)
        if found is None:
            raise AdminError(404, "TOPIC_NOT_FOUND")
        return found

    def _existing_channel(self, topic: str, channel: str) -> _Channel:
        found = self._existing_topic(self._admin_topic(topic, "INVALID_ARG_TOPIC"))
        chan = found.channels.get(self._admin_channel(channel))
        if chan is None:
            raise AdminError(404, "CHANNEL_NOT_FOUND")
        return chan

    def _publish_many(self, topic: str, bodies: Iterable[bytes], now: float, defer_ms: int) -> None:
        name = self._admin_topic(topic, "INVALID_TOPIC")
        if (
            isinstance(defer_ms, bool)
            or not isinstance(defer_ms, int)
            or not 0 <= defer_ms <= self.options.effective_max_defer_timeout * 1000
        ):
            raise AdminError(400, "INVALID_DEFER")
        found = self._get_topic(name, now)
        timestamp = self._timestamp(now)
        try:
            for body in bodies:
                msg = _Msg(self._new_id(), body, timestamp, 0, defer_ms / 1000)
                self._topic_put(found, msg, now)
        except BackendError as exc:
            raise AdminError(503, "EXITING", str(exc)) from None
        finally:
            self._pump_topic(found, now)

    def _client_stats(self, conn: _Conn, topic: str | None = None) -> dict[str, Any]:
        """One client's entry of /stats; a producer's ``pub_counts`` only for ``topic`` when
        one is given (and left out when that leaves none, as nsqd's omitempty does)."""
        stats: dict[str, Any] = {
            "client_id": conn.client_id,
            "hostname": conn.hostname,
            "version": "V2",
            "remote_address": conn.remote_address,
            "state": _STATS_STATE[conn.state],
            "ready_count": conn.ready_count,
            "in_flight_count": conn.in_flight,
            "message_count": conn.message_count,
            "finish_count": conn.finish_count,
            "requeue_count": conn.requeue_count,
            "connect_ts": int(conn.connected_at + self._epoch_offset),
            "sample_rate": conn.sample_rate,
            "deflate": conn.deflate,
            "snappy": conn.snappy,
            "user_agent": conn.user_agent,
            "tls": conn.tls,
            "tls_cipher_suite": "",
            "tls_version": "",
            "tls_negotiated_protocol": "",
            "tls_negotiated_protocol_is_mutual": False,
        }
        if conn.auth is not None and conn.auth.authorizations:
            stats["authed"] = True
            stats["auth_identity"] = conn.auth.identity
            stats["auth_identity_url"] = conn.auth.identity_url
        counts = conn.pub_counts
        if topic is not None:
            counts = {topic: counts[topic]} if topic in counts else {}
        if counts:
            stats["pub_counts"] = [
                {"topic": name, "count": count} for name, count in sorted(counts.items())
            ]
        return stats

"""nsqlookupd's role, pure: the registration DB and the server side of lookup protocol V1.

The wire protocol (what nsqd speaks to nsqlookupd over TCP) is line oriented::

    "  V1"                                    magic, once
    IDENTIFY\\n <int32 size><JSON peer info>   once, before REGISTER/UNREGISTER
    REGISTER <topic> [<channel>]\\n
    UNREGISTER <topic> [<channel>]\\n
    PING\\n

Every answer is ``<int32 size><data>`` (no frame type): ``OK``, the lookupd's own JSON info
for IDENTIFY, or ``E_CODE text`` for an error. All errors of V1 are fatal: the answer is queued
and the connection is then closed, exactly like nsqlookupd. The HTTP API's answers are
computed here too (:meth:`Lookupd.lookup`, :meth:`Lookupd.nodes`...), so the transport only
routes requests and serialises dicts to JSON. The registrations themselves are kept in
:mod:`.registration_db` (nsqlookupd's ``registration_db.go``).
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidName, LocalProtocolError, NSQError
from ..names import is_ephemeral, validate_channel, validate_topic
from .registration_db import Peer, PeerInfo, Producer, Registration, RegistrationDB

__all__ = [
    "DEFAULT_INACTIVE_PRODUCER_TIMEOUT",
    "DEFAULT_TOMBSTONE_LIFETIME",
    "LOOKUPD_VERSION",
    "MAGIC_V1",
    "ClientClosed",
    "ClientError",
    "ClientIdentified",
    "ClientPinged",
    "LookupConnState",
    "LookupEvent",
    "Lookupd",
    "LookupdAPIError",
    "LookupdOptions",
    "PeerInfo",
    "ProducerRegistered",
    "ProducerUnregistered",
    "Registration",
    "RegistrationDB",
    "encode_response",
    "join_host_port",
]

MAGIC_V1 = b"  V1"
#: The nsqlookupd version this registry answers with (``/info``, IDENTIFY), as nsqd's.
LOOKUPD_VERSION = "1.3.0"
# Go's zero time.Time as UnixNano (it overflows int64): what /debug shows as ``tombstoned_at``
# of a producer that was never tombstoned.
_GO_ZERO_TIME_UNIX_NANO = -6795364578871345152
DEFAULT_INACTIVE_PRODUCER_TIMEOUT = 300.0
DEFAULT_TOMBSTONE_LIFETIME = 45.0

_SIZE = struct.Struct(">i")


def encode_response(data: bytes) -> bytes:
    """Frame one V1 answer: a big-endian int32 size, then the bytes (no frame type in V1)."""
    return _SIZE.pack(len(data)) + data


def _unix_nano(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def join_host_port(host: str, port: int) -> str:
    """``host:port``, bracketing IPv6 literals like Go's ``net.JoinHostPort``."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


class LookupdAPIError(NSQError):
    """An HTTP API request was refused; ``status`` and ``message`` are nsqlookupd's (404 ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class LookupdOptions:
    """What a lookupd node needs to know; ports are the real bound ones (port 0 resolved)."""

    broadcast_address: str = "127.0.0.1"
    hostname: str = "localhost"
    tcp_port: int = 4160
    http_port: int = 4161
    version: str = LOOKUPD_VERSION
    inactive_producer_timeout: float = DEFAULT_INACTIVE_PRODUCER_TIMEOUT
    tombstone_lifetime: float = DEFAULT_TOMBSTONE_LIFETIME
    max_line_length: int = 4096
    max_identify_body: int = 64 * 1024
    #: At most this many commands per :meth:`Lookupd.receive_data` or
    #: :meth:`Lookupd.continue_input` call (``None``: all that are complete). With a bound,
    #: the rest waits (:meth:`Lookupd.input_pending`) until the transport calls
    #: ``continue_input``, after serving its other connections.
    max_commands_per_step: int | None = None

    def __post_init__(self) -> None:
        if self.inactive_producer_timeout <= 0:
            raise ValueError(
                f"inactive_producer_timeout must be > 0, got {self.inactive_producer_timeout}"
            )
        if self.tombstone_lifetime < 0:
            raise ValueError(f"tombstone_lifetime must be >= 0, got {self.tombstone_lifetime}")
        if self.max_line_length < 64 or self.max_identify_body < 64:
            raise ValueError("max_line_length and max_identify_body must be at least 64 bytes")
        if self.max_commands_per_step is not None and self.max_commands_per_step < 1:
            raise ValueError(
                f"max_commands_per_step must be at least 1, got {self.max_commands_per_step}"
            )


# ---------------------------------------------------------------------------------------------
# events


@dataclass(frozen=True, slots=True)
class ClientIdentified:
    """An nsqd identified itself on connection ``handle``."""

    handle: int
    peer: PeerInfo


@dataclass(frozen=True, slots=True)
class ProducerRegistered:
    """REGISTER succeeded; ``channel`` is None for a topic-only registration."""

    handle: int
    topic: str
    channel: str | None


@dataclass(frozen=True, slots=True)
class ProducerUnregistered:
    """UNREGISTER succeeded; ``channel`` is None for a topic unregistration."""

    handle: int
    topic: str
    channel: str | None


@dataclass(frozen=True, slots=True)
class ClientPinged:
    """A PING refreshed the peer's liveness."""

    handle: int


@dataclass(frozen=True, slots=True)
class ClientError:
    """The peer broke the protocol; the error answer is queued and the connection closes."""

    handle: int
    code: str
    text: str


@dataclass(frozen=True, slots=True)
class ClientClosed:
    """The connection is done: write what is left of ``data_to_send`` and close the socket."""

    handle: int
    reason: str


LookupEvent = (
    ClientIdentified
    | ProducerRegistered
    | ProducerUnregistered
    | ClientPinged
    | ClientError
    | ClientClosed
)


class LookupConnState(enum.Enum):
    """Where one lookup V1 connection is."""

    AWAIT_MAGIC = "await_magic"
    CONNECTED = "connected"
    IDENTIFIED = "identified"
    CLOSED = "closed"


@dataclass(slots=True)
class _Conn:
    handle: int
    remote_address: str
    state: LookupConnState = LookupConnState.AWAIT_MAGIC
    buffer: bytearray = field(default_factory=bytearray)
    outgoing: bytearray = field(default_factory=bytearray)
    peer: Peer | None = None
    more_input: bool = False  # stopped at max_commands_per_step with input left


class _Fatal(Exception):
    """Internal: a V1 error, always fatal for the connection."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class Lookupd:
    """One nsqlookupd node: many V1 connections over one registry, plus the HTTP answers."""

    def __init__(self, options: LookupdOptions | None = None) -> None:
        self.options = options if options is not None else LookupdOptions()
        self.db = RegistrationDB()
        self._conns: dict[int, _Conn] = {}
        self._next_handle = 1

    # -- connections ----------------------------------------------------------------------------

    def connect(self, remote_address: str, now: float) -> int:
        """Register a TCP connection from ``remote_address`` (``host:port``); returns a handle."""
        handle = self._next_handle
        self._next_handle += 1
        self._conns[handle] = _Conn(handle, remote_address)
        return handle

    def connection_state(self, handle: int) -> LookupConnState:
        """State of a connection; CLOSED for handles that are gone."""
        conn = self._conns.get(handle)
        return LookupConnState.CLOSED if conn is None else conn.state

    @property
    def connection_count(self) -> int:
        """TCP connections (nsqd registering) open now."""
        return len(self._conns)

    def _conn(self, handle: int) -> _Conn:
        conn = self._conns.get(handle)
        if conn is None:
            raise LocalProtocolError(f"unknown or already released lookupd connection {handle}")
        return conn

    def data_to_send(self, handle: int) -> bytes:
        """Bytes to write to the connection now (answers), possibly empty."""
        conn = self._conns.get(handle)
        if conn is None or not conn.outgoing:
            return b""
        data = bytes(conn.outgoing)
        conn.outgoing.clear()
        return data

    def receive_data(self, handle: int, data: bytes, now: float) -> list[LookupEvent]:
        """Feed bytes read from the connection; ``b""`` means EOF (the peer went away)."""
        conn = self._conn(handle)
        if conn.state is LookupConnState.CLOSED:
            if data:
                raise LocalProtocolError(
                    f"receive_data on lookupd connection {handle} in state CLOSED"
                )
            return []
        if not data:
            return self._close(conn, "peer closed the connection")
        conn.buffer += data
        return self._step(conn, now)

    def input_pending(self, handle: int) -> bool:
        """True when the last call stopped at ``max_commands_per_step`` with commands left:
        call :meth:`continue_input` (after serving other connections) before reading more."""
        conn = self._conns.get(handle)
        return conn is not None and conn.more_input

    def continue_input(self, handle: int, now: float) -> list[LookupEvent]:
        """Run the next bounded step of the input already received."""
        conn = self._conn(handle)
        if conn.state is LookupConnState.CLOSED:
            return []
        return self._step(conn, now)

    def _step(self, conn: _Conn, now: float) -> list[LookupEvent]:
        events: list[LookupEvent] = []
        budget = self.options.max_commands_per_step
        try:
            conn.more_input = self._process(conn, now, events, budget)
        except _Fatal as err:
            conn.more_input = False
            conn.outgoing += encode_response(f"{err.code} {err.text}".encode())
            events.append(ClientError(conn.handle, err.code, err.text))
            events.extend(self._close(conn, f"{err.code} {err.text}"))
        return events

    def connection_lost(self, handle: int, now: float) -> list[LookupEvent]:
        """The transport lost the socket: drop the peer's registrations and forget the handle."""
        conn = self._conns.get(handle)
        if conn is None:
            return []
        events = self._close(conn, "connection lost")
        self.release(handle)
        return events

    def release(self, handle: int) -> None:
        """Forget a connection (after its socket is closed); its registrations are gone."""
        conn = self._conns.pop(handle, None)
        if conn is not None and conn.state is not LookupConnState.CLOSED:
            self._close(conn, "released")

    def _close(self, conn: _Conn, reason: str) -> list[LookupEvent]:
        if conn.state is LookupConnState.CLOSED:
            return []
        conn.state = LookupConnState.CLOSED
        conn.buffer.clear()
        if conn.peer is not None:
            peer_id = conn.peer.info.id
            for key in self.db.lookup_registrations(peer_id):
                self.db.remove_producer(key, peer_id)
        return [ClientClosed(conn.handle, reason)]

    # -- parsing --------------------------------------------------------------------------------

    def _process(
        self, conn: _Conn, now: float, events: list[LookupEvent], budget: int | None
    ) -> bool:
        """Run complete commands, at most ``budget`` (``None``: all); True when it stopped at
        the budget."""
        buf = conn.buffer
        if conn.state is LookupConnState.AWAIT_MAGIC:
            if len(buf) < 4:
                return False
            magic = bytes(buf[:4])
            if magic != MAGIC_V1:
                raise _Fatal("E_BAD_PROTOCOL", f"bad protocol magic {magic!r}")
            del buf[:4]
            conn.state = LookupConnState.CONNECTED
        while conn.state is not LookupConnState.CLOSED:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > self.options.max_line_length:
                    raise _Fatal(
                        "E_INVALID",
                        f"command line longer than {self.options.max_line_length} bytes",
                    )
                return False
            if budget is not None:
                if budget <= 0:
                    return True
                budget -= 1
            if nl > self.options.max_line_length:
                raise _Fatal(
                    "E_INVALID", f"command line longer than {self.options.max_line_length} bytes"
                )
            line = bytes(buf[:nl]).strip().decode("utf-8", "replace")
            params = line.split(" ")
            command = params[0]
            if command == "IDENTIFY":
                if conn.peer is not None:
                    raise _Fatal("E_INVALID", "cannot IDENTIFY again")
                start = nl + 1
                if len(buf) < start + 4:
                    return False
                (size,) = _SIZE.unpack_from(buf, start)
                if size <= 0 or size > self.options.max_identify_body:
                    raise _Fatal(
                        "E_BAD_BODY",
                        f"IDENTIFY invalid body size {size} "
                        f"(allowed 1..{self.options.max_identify_body})",
                    )
                end = start + 4 + size
                if len(buf) < end:
                    return False
                body = bytes(buf[start + 4 : end])
                del buf[:end]
                response = self._identify(conn, body, now, events)
            else:
                del buf[: nl + 1]
                response = self._exec(conn, command, params[1:], now, events)
            conn.outgoing += encode_response(response)
        return False

    def _exec(
        self, conn: _Conn, command: str, params: list[str], now: float, events: list[LookupEvent]
    ) -> bytes:
        if command == "PING":
            if conn.peer is not None:
                conn.peer.last_update = now
            events.append(ClientPinged(conn.handle))
            return b"OK"
        if command == "REGISTER":
            return self._register(conn, params, events)
        if command == "UNREGISTER":
            return self._unregister(conn, params, events)
        raise _Fatal("E_INVALID", f"invalid command {command}")

    def _identify(self, conn: _Conn, body: bytes, now: float, events: list[LookupEvent]) -> bytes:
        try:
            raw = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            # RecursionError: JSON nested deeper than the interpreter's stack (nsqlookupd
            # answers any undecodable body with E_BAD_BODY)
            raise _Fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        # nsqlookupd decodes into a struct: any shape or type it cannot take is the same error
        undecodable = _Fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
        if not isinstance(raw, dict):
            raise undecodable

        def text(name: str) -> str:
            value = raw.get(name, "")
            if value is None:
                return ""
            if not isinstance(value, str):
                raise undecodable
            return value

        def port(name: str) -> int:
            value = raw.get(name, 0)
            if value is None:
                return 0
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise undecodable
            return value

        info = PeerInfo(
            id=conn.remote_address,
            remote_address=conn.remote_address,
            hostname=text("hostname"),
            broadcast_address=text("broadcast_address"),
            tcp_port=port("tcp_port"),
            http_port=port("http_port"),
            version=text("version"),
        )
        required = (info.broadcast_address, info.tcp_port, info.http_port, info.version)
        if not all(required):
            raise _Fatal("E_BAD_BODY", "IDENTIFY missing fields")
        peer = Peer(info, now)
        conn.peer = peer
        conn.state = LookupConnState.IDENTIFIED
        self.db.add_producer(Registration("client"), peer)
        events.append(ClientIdentified(conn.handle, info))
        answer = {
            "tcp_port": self.options.tcp_port,
            "http_port": self.options.http_port,
            "version": self.options.version,
            "broadcast_address": self.options.broadcast_address,
            "hostname": self.options.hostname,
        }
        return json.dumps(answer, separators=(",", ":")).encode()

    @staticmethod
    def _topic_channel(command: str, params: list[str]) -> tuple[str, str | None]:
        if not params:
            raise _Fatal("E_INVALID", f"{command} insufficient number of params")
        topic = params[0]
        channel = params[1] if len(params) >= 2 and params[1] else None
        try:
            validate_topic(topic)
        except InvalidName:
            raise _Fatal("E_BAD_TOPIC", f"{command} topic name {topic!r} is not valid") from None
        if channel is not None:
            try:
                validate_channel(channel)
            except InvalidName:
                raise _Fatal(
                    "E_BAD_CHANNEL", f"{command} channel name {channel!r} is not valid"
                ) from None
        return topic, channel

    def _register(self, conn: _Conn, params: list[str], events: list[LookupEvent]) -> bytes:
        if conn.peer is None:
            raise _Fatal("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("REGISTER", params)
        if channel is not None:
            self.db.add_producer(Registration("channel", topic, channel), conn.peer)
        self.db.add_producer(Registration("topic", topic), conn.peer)
        events.append(ProducerRegistered(conn.handle, topic, channel))
        return b"OK"

    def _unregister(self, conn: _Conn, params: list[str], events: list[LookupEvent]) -> bytes:
        if conn.peer is None:
            raise _Fatal("E_INVALID", "client must IDENTIFY")
        topic, channel = self._topic_channel("UNREGISTER", params)
        peer_id = conn.peer.info.id
        if channel is not None:
            key = Registration("channel", topic, channel)
            _, left = self.db.remove_producer(key, peer_id)
            if left == 0 and is_ephemeral(channel):
                self.db.remove_registration(key)
        else:
            for key in self.db.find_registrations("channel", topic, "*"):
                self.db.remove_producer(key, peer_id)
            key = Registration("topic", topic)
            _, left = self.db.remove_producer(key, peer_id)
            if left == 0 and is_ephemeral(topic):
                self.db.remove_registration(key)
        events.append(ProducerUnregistered(conn.handle, topic, channel))
        return b"OK"

    # -- HTTP API answers (JSON-ready dicts; modern nsqlookupd shape, no status envelope) -------

    def _active(
        self, producers: Iterable[Producer], now: float, *, tombstones: bool
    ) -> list[Producer]:
        timeout = self.options.inactive_producer_timeout
        lifetime = self.options.tombstone_lifetime if tombstones else 0.0
        return [
            p
            for p in producers
            if now - p.peer.last_update <= timeout and not p.is_tombstoned(now, lifetime)
        ]

    @staticmethod
    def _require_topic(topic: str | None) -> str:
        if topic is None:
            raise LookupdAPIError(400, "MISSING_ARG_TOPIC")
        return topic

    def _topic_channel_args(self, topic: str | None, channel: str | None) -> tuple[str, str]:
        topic = self._require_topic(topic)
        try:
            validate_topic(topic)
        except InvalidName:
            raise LookupdAPIError(400, "INVALID_ARG_TOPIC") from None
        if channel is None:
            raise LookupdAPIError(400, "MISSING_ARG_CHANNEL")
        try:
            validate_channel(channel)
        except InvalidName:
            raise LookupdAPIError(400, "INVALID_ARG_CHANNEL") from None
        return topic, channel

    def info(self) -> dict[str, Any]:
        """``GET /info``."""
        return {"version": self.options.version}

    def debug(self, now: float, epoch_offset: float = 0.0) -> dict[str, list[dict[str, Any]]]:
        """``GET /debug``: every registration (``category:key:subkey``) with its producers as
        nsqlookupd dumps them; times are wall-clock nanoseconds (``now + epoch_offset``)."""
        dump: dict[str, list[dict[str, Any]]] = {}
        for key, producers in self.db.items():
            if not producers:
                continue  # nsqlookupd lists a registration only through its producers
            entries = dump[f"{key.category}:{key.key}:{key.subkey}"] = []
            for producer in producers:
                info = producer.peer.info
                entries.append(
                    {
                        "id": info.id,
                        "hostname": info.hostname,
                        "broadcast_address": info.broadcast_address,
                        "tcp_port": info.tcp_port,
                        "http_port": info.http_port,
                        "version": info.version,
                        "last_update": _unix_nano(producer.peer.last_update + epoch_offset),
                        "tombstoned": producer.tombstoned,
                        "tombstoned_at": (
                            _unix_nano(producer.tombstoned_at + epoch_offset)
                            if producer.tombstoned
                            else _GO_ZERO_TIME_UNIX_NANO
                        ),
                    }
                )
        return dump

    def topics(self) -> dict[str, Any]:
        """``GET /topics``: every known topic."""
        return {"topics": [k.key for k in self.db.find_registrations("topic", "*", "")]}

    def channels(self, topic: str | None) -> dict[str, Any]:
        """``GET /channels?topic=``: every known channel of a topic."""
        topic = self._require_topic(topic)
        regs = self.db.find_registrations("channel", topic, "*")
        return {"channels": [k.subkey for k in regs]}

    def lookup(self, topic: str | None, now: float) -> dict[str, Any]:
        """``GET /lookup?topic=``: channels and the active, non-tombstoned producers."""
        topic = self._require_topic(topic)
        if not self.db.find_registrations("topic", topic, ""):
            raise LookupdAPIError(404, "TOPIC_NOT_FOUND")
        channels = [k.subkey for k in self.db.find_registrations("channel", topic, "*")]
        producers = self._active(self.db.find_producers("topic", topic, ""), now, tombstones=True)
        return {"channels": channels, "producers": [p.peer.info.to_json() for p in producers]}

    def nodes(self, now: float) -> dict[str, Any]:
        """``GET /nodes``: active nsqds with their topics and per-topic tombstone flags."""
        lifetime = self.options.tombstone_lifetime
        nodes: list[dict[str, Any]] = []
        for client in self._active(self.db.find_producers("client", "", ""), now, tombstones=False):
            info = client.peer.info
            topics = [k.key for k in self.db.lookup_registrations(info.id) if k.category == "topic"]
            flags = []
            for t in topics:
                p = self.db.producer(Registration("topic", t), info.id)
                flags.append(p is not None and p.is_tombstoned(now, lifetime))
            node = info.to_json()
            node["tombstones"] = flags
            node["topics"] = topics
            nodes.append(node)
        return {"producers": nodes}

    def create_topic(self, topic: str | None) -> None:
        """``POST /topic/create``."""
        topic = self._require_topic(topic)
        try:
            validate_topic(topic)
        except InvalidName:
            raise LookupdAPIError(400, "INVALID_ARG_TOPIC") from None
        self.db.add_registration(Registration("topic", topic))

    def delete_topic(self, topic: str | None) -> None:
        """``POST /topic/delete``: forget the topic and its channels."""
        topic = self._require_topic(topic)
        for key in self.db.find_registrations("channel", topic, "*"):
            self.db.remove_registration(key)
        for key in self.db.find_registrations("topic", topic, ""):
            self.db.remove_registration(key)

    def create_channel(self, topic: str | None, channel: str | None) -> None:
        """``POST /channel/create`` (creates the topic key too)."""
        topic, channel = self._topic_channel_args(topic, channel)
        self.db.add_registration(Registration("channel", topic, channel))
        self.db.add_registration(Registration("topic", topic))

    def delete_channel(self, topic: str | None, channel: str | None) -> None:
        """``POST /channel/delete``; 404 CHANNEL_NOT_FOUND when unknown."""
        topic, channel = self._topic_channel_args(topic, channel)
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise LookupdAPIError(404, "CHANNEL_NOT_FOUND")
        for key in regs:
            self.db.remove_registration(key)

    def tombstone_topic_producer(self, topic: str | None, node: str | None, now: float) -> None:
        """``POST /topic/tombstone?topic=&node=<broadcast_address>:<http_port>``."""
        topic = self._require_topic(topic)
        if node is None:
            raise LookupdAPIError(400, "MISSING_ARG_NODE")
        for p in self.db.find_producers("topic", topic, ""):
            info = p.peer.info
            if join_host_port(info.broadcast_address, info.http_port) == node:
                p.tombstoned = True
                p.tombstoned_at = now

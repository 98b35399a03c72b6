"""nsqd's side of lookup protocol V1, pure: one :class:`LookupPeer` per configured nsqlookupd.

On every (re)connection the peer sends the magic, IDENTIFY with the node's identity and one
REGISTER per topic/channel the node has (the caller passes them in), then a PING every
``ping_interval`` seconds. New or removed topics and channels are sent as REGISTER/UNREGISTER
while connected; while disconnected they are dropped, since the next connection resyncs the
whole set, so nothing here grows without bound. Answers come back in order, so commands are
pipelined and matched FIFO. An error answer, an oversized answer or a missing answer after
``response_timeout`` closes the connection (nsqlookupd's V1 errors are all fatal) and a
reconnect is scheduled with capped exponential backoff.

nsqd also asks its nsqlookupds' HTTP API for the channels of a topic it creates (see
``NSQD.lookupd_channels``): :func:`channels_request_target` is that request,
:func:`parse_channels_answer` reads the answer.
"""

from __future__ import annotations

import enum
import json
import random
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from ..errors import ConfigError, LocalProtocolError
from .lookupd import MAGIC_V1, join_host_port

__all__ = [
    "LookupPeer",
    "LookupPeerClosed",
    "LookupPeerEvent",
    "LookupPeerIdentified",
    "LookupPeerResponse",
    "LookupPeerState",
    "LookupdInfo",
    "NodeIdentity",
    "channels_request_target",
    "encode_identify",
    "encode_ping",
    "encode_register",
    "encode_unregister",
    "parse_channels_answer",
    "sync_registrations",
]

_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """What an nsqd tells nsqlookupd about itself in IDENTIFY."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    hostname: str
    version: str

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": self.version,
                "tcp_port": self.tcp_port,
                "http_port": self.http_port,
                "hostname": self.hostname,
                "broadcast_address": self.broadcast_address,
            },
            separators=(",", ":"),
        ).encode()


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's answer to IDENTIFY: where its HTTP API is."""

    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    hostname: str

    @property
    def http_address(self) -> str:
        return join_host_port(self.broadcast_address, self.http_port)


@dataclass(frozen=True, slots=True)
class LookupPeerIdentified:
    """nsqlookupd accepted IDENTIFY; ``info`` is None if its answer was not the expected JSON."""

    info: LookupdInfo | None


@dataclass(frozen=True, slots=True)
class LookupPeerResponse:
    """An answer to a REGISTER, UNREGISTER or PING (``OK``)."""

    command: bytes
    data: bytes


@dataclass(frozen=True, slots=True)
class LookupPeerClosed:
    """The peer gave up on this connection: close the socket; a reconnect is scheduled."""

    reason: str
    reconnect_at: float


LookupPeerEvent = LookupPeerIdentified | LookupPeerResponse | LookupPeerClosed


class LookupPeerState(enum.Enum):
    """DISCONNECTED (waiting to reconnect) -> CONNECTED (socket up) -> back, or CLOSED for good."""

    DISCONNECTED = "disconnected"
    CONNECTED = "connected"
    CLOSED = "closed"


def encode_identify(identity: NodeIdentity) -> bytes:
    """``IDENTIFY\\n`` then the size-prefixed JSON body."""
    body = identity.to_json()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


def encode_register(topic: str, channel: str | None = None) -> bytes:
    """``REGISTER topic [channel]\\n``."""
    if channel:
        return f"REGISTER {topic} {channel}\n".encode()
    return f"REGISTER {topic}\n".encode()


def encode_unregister(topic: str, channel: str | None = None) -> bytes:
    """``UNREGISTER topic [channel]\\n``."""
    if channel:
        return f"UNREGISTER {topic} {channel}\n".encode()
    return f"UNREGISTER {topic}\n".encode()


def encode_ping() -> bytes:
    return b"PING\n"


def sync_registrations(
    topics: Iterable[tuple[str, Iterable[str]]],
) -> list[tuple[str, str | None]]:
    """What nsqd registers on connect: each channel, or the bare topic when it has none."""
    result: list[tuple[str, str | None]] = []
    for topic, channels in topics:
        names = list(channels)
        if names:
            result.extend((topic, c) for c in names)
        else:
            result.append((topic, None))
    return result


class LookupPeer:
    """The connection from one nsqd to one nsqlookupd, as a state machine."""

    def __init__(
        self,
        address: str,
        identity: NodeIdentity,
        *,
        ping_interval: float = 15.0,
        response_timeout: float = 5.0,
        reconnect_min: float = 0.1,
        reconnect_max: float = 15.0,
        max_response_size: int = 1024 * 1024,
        max_pending: int = 10_000,
        rng: random.Random | None = None,
    ) -> None:
        if ping_interval <= 0 or response_timeout <= 0:
            raise ConfigError("ping_interval and response_timeout must be > 0")
        if not 0 < reconnect_min <= reconnect_max:
            raise ConfigError(
                f"need 0 < reconnect_min <= reconnect_max, got {reconnect_min}, {reconnect_max}"
            )
        if max_pending < 1 or max_response_size < 64:
            raise ConfigError("max_pending must be >= 1 and max_response_size >= 64")
        self.address = address
        self.identity = identity
        self.ping_interval = ping_interval
        self.response_timeout = response_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.max_response_size = max_response_size
        self.max_pending = max_pending
        self._rng = rng
        self.state = LookupPeerState.DISCONNECTED
        self.info: LookupdInfo | None = None
        self._reconnect_at = 0.0
        self._failures = 0
        self._buffer = bytearray()
        self._outgoing = bytearray()
        self._pending: deque[tuple[bytes, float]] = deque()
        self._next_ping = 0.0

    # -- connection lifecycle -------------------------------------------------------------------

    def wants_connect(self, now: float) -> bool:
        """Whether the transport should open a connection now."""
        return self.state is LookupPeerState.DISCONNECTED and now >= self._reconnect_at

    def connection_made(
        self, now: float, registrations: Iterable[tuple[str, str | None]] = ()
    ) -> None:
        """The socket is up: queue magic, IDENTIFY and a REGISTER for each (topic, channel)."""
        if self.state is not LookupPeerState.DISCONNECTED:
            raise LocalProtocolError(
                f"connection_made to lookupd {self.address} in state {self.state.name}"
            )
        self.state = LookupPeerState.CONNECTED
        self._buffer.clear()
        self._outgoing.clear()
        self._pending.clear()
        self._outgoing += MAGIC_V1
        self._send(encode_identify(self.identity), now)
        for topic, channel in registrations:
            self._send(encode_register(topic, channel), now)
        self._next_ping = now + self.ping_interval

    def connection_failed(self, now: float) -> list[LookupPeerEvent]:
        """Connecting failed (or the socket broke): schedule the next attempt."""
        return self._disconnect(now, "connection failed")

    def connection_lost(self, now: float) -> list[LookupPeerEvent]:
        """The socket closed under us."""
        return self._disconnect(now, "connection lost")

    def close(self) -> None:
        """Stop for good (node shutting down); further calls are no-ops."""
        self.state = LookupPeerState.CLOSED
        self._pending.clear()
        self._buffer.clear()

    def _disconnect(self, now: float, reason: str) -> list[LookupPeerEvent]:
        if self.state is LookupPeerState.CLOSED:
            return []
        was_connected = self.state is LookupPeerState.CONNECTED
        self.state = LookupPeerState.DISCONNECTED
        self._pending.clear()
        self._buffer.clear()
        self._outgoing.clear()
        self._failures += 1
        delay = min(self.reconnect_max, self.reconnect_min * 2 ** min(self._failures - 1, 30))
        if self._rng is not None:
            delay *= 0.5 + self._rng.random() / 2
        self._reconnect_at = now + delay
        if was_connected:
            return [LookupPeerClosed(reason, self._reconnect_at)]
        return []

    # -- commands -------------------------------------------------------------------------------

    def _send(self, command: bytes, now: float) -> None:
        self._outgoing += command
        head = command.split(b"\n", 1)[0]
        self._pending.append((head, now))

    def _queue(self, command: bytes, now: float) -> bool:
        if self.state is not LookupPeerState.CONNECTED:
            return False
        if len(self._pending) >= self.max_pending:
            # lookupd is not keeping up: dropping one command would leave it wrong, so give up
            # on this connection; the next one resyncs everything
            self._disconnect(now, f"more than {self.max_pending} commands unanswered")
            return False
        self._send(command, now)
        return True

    def register(self, now: float, topic: str, channel: str | None = None) -> bool:
        """Announce a topic (or channel). False when not sent: the peer is disconnected (or
        just dropped an overloaded connection) and the next connection resyncs it."""
        return self._queue(encode_register(topic, channel), now)

    def unregister(self, now: float, topic: str, channel: str | None = None) -> bool:
        """Withdraw a topic (or channel); False when not sent (see :meth:`register`)."""
        return self._queue(encode_unregister(topic, channel), now)

    def data_to_send(self) -> bytes:
        """Bytes to write now."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    # -- input and timers -----------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> list[LookupPeerEvent]:
        """Feed bytes read from nsqlookupd; ``b""`` is EOF."""
        if self.state is not LookupPeerState.CONNECTED:
            return []
        if not data:
            return self._disconnect(now, "lookupd closed the connection")
        self._buffer += data
        events: list[LookupPeerEvent] = []
        buf = self._buffer
        while len(buf) >= 4:
            (size,) = _SIZE.unpack_from(buf, 0)
            if size < 0 or size > self.max_response_size:
                events.extend(
                    self._disconnect(now, f"response size {size} above {self.max_response_size}")
                )
                return events
            if len(buf) < 4 + size:
                break
            payload = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            if not self._pending:
                events.extend(self._disconnect(now, "unsolicited response from lookupd"))
                return events
            command, _ = self._pending.popleft()
            if payload.startswith(b"E_"):
                answer = payload.decode(errors="replace")
                reason = f"lookupd answered {command.decode()} with {answer}"
                events.extend(self._disconnect(now, reason))
                return events
            if command == b"IDENTIFY":
                self._failures = 0
                self.info = _parse_info(payload)
                events.append(LookupPeerIdentified(self.info))
            else:
                events.append(LookupPeerResponse(command, payload))
        return events

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next be called (ping, response timeout, reconnect)."""
        if self.state is LookupPeerState.CLOSED:
            return None
        if self.state is LookupPeerState.DISCONNECTED:
            return self._reconnect_at
        deadline = self._next_ping
        if self._pending:
            deadline = min(deadline, self._pending[0][1] + self.response_timeout)
        return deadline

    def handle_timer(self, now: float) -> list[LookupPeerEvent]:
        """Send the heartbeat when due; give up on a lookupd that stopped answering."""
        if self.state is not LookupPeerState.CONNECTED:
            return []
        if self._pending and now >= self._pending[0][1] + self.response_timeout:
            return self._disconnect(now, f"no answer from lookupd {self.address} in time")
        if now >= self._next_ping:
            self._next_ping = now + self.ping_interval
            self._queue(encode_ping(), now)
        return []


def channels_request_target(topic: str) -> str:
    """What nsqd asks an nsqlookupd's HTTP API for a new topic's channels: ``GET`` this."""
    return "/channels?topic=" + quote(topic, safe="")


def parse_channels_answer(body: bytes) -> list[str]:
    """The channel names in nsqlookupd's ``200`` answer to ``GET /channels``: ``{"channels":
    [...]}``, or the envelope of older versions (``{"status_code": 200, "data": {...}}``).
    Raises ``ValueError`` for anything else; names that are not strings are left out (the
    node checks each name before making a channel of it)."""
    try:
        document = json.loads(body)
    except RecursionError:
        raise ValueError("answer nested too deeply") from None
    if isinstance(document, dict) and "channels" not in document:
        document = document.get("data")
    channels = document.get("channels") if isinstance(document, dict) else None
    if channels is None and isinstance(document, dict):
        return []  # Go's null for a topic it does not know
    if not isinstance(channels, list):
        raise ValueError("answer has no channels list")
    return [name for name in channels if isinstance(name, str)]


def _parse_info(payload: bytes) -> LookupdInfo | None:
    try:
        raw = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    try:
        return LookupdInfo(
            broadcast_address=str(raw.get("broadcast_address", "")),
            tcp_port=int(raw.get("tcp_port", 0)),
            http_port=int(raw.get("http_port", 0)),
            version=str(raw.get("version", "")),
            hostname=str(raw.get("hostname", "")),
        )
    except (TypeError, ValueError):
        return None

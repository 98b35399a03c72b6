"""Events a client connection reports, and the records they carry (all frozen dataclasses)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

from .errors import NSQError, RemoteProtocolError, ServerError

__all__ = [
    "AuthResult",
    "CloseWait",
    "ConnectionClosed",
    "ConnectionReady",
    "Event",
    "Heartbeat",
    "Message",
    "MessageTakenBack",
    "PublishAcknowledged",
    "PublishFailed",
    "ServerSettings",
    "Subscribed",
    "TLSUpgradeRequired",
]

#: nsqd's --max-rdy-count, assumed when the server did not negotiate features (client guide).
DEFAULT_MAX_RDY_COUNT = 2500


class Message(NamedTuple):
    """A message pushed by nsqd: ``id`` (16 ASCII hex bytes), ``body``, ``timestamp`` in ns since
    the epoch (when it was published), ``attempts`` (1 on first delivery).

    The one event that is a ``NamedTuple`` rather than a frozen dataclass: it is built once per
    message on the hottest path, where a frozen dataclass's ``__init__`` cost a third of the
    decoding time. It is just as immutable.
    """

    id: bytes
    body: bytes
    timestamp: int
    attempts: int


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What nsqd answered to IDENTIFY: the limits this connection must respect.

    Durations are in milliseconds, as on the wire; ``raw`` keeps the whole JSON answer.
    """

    max_rdy_count: int = DEFAULT_MAX_RDY_COUNT
    msg_timeout: int = 60_000
    max_msg_timeout: int = 15 * 60_000
    tls_v1: bool = False
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    max_deflate_level: int = 6
    auth_required: bool = False
    sample_rate: int = 0
    output_buffer_size: int = 16 * 1024
    output_buffer_timeout: int = 250
    version: str = ""
    negotiated: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def default(cls) -> ServerSettings:
        """Settings for an old nsqd that answered IDENTIFY with a plain ``OK``."""
        return cls()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerSettings:
        """Read nsqd's IDENTIFY answer; a field of the wrong type is a protocol error."""

        def read(name: str, kind: type, default: Any) -> Any:
            value = data.get(name, default)
            if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
                raise RemoteProtocolError(
                    f"IDENTIFY answer field {name!r} must be an int, got {value!r}"
                )
            if kind is bool and not isinstance(value, bool):
                raise RemoteProtocolError(
                    f"IDENTIFY answer field {name!r} must be a bool, got {value!r}"
                )
            if kind is str and not isinstance(value, str):
                raise RemoteProtocolError(
                    f"IDENTIFY answer field {name!r} must be a string, got {value!r}"
                )
            return value

        base = cls()
        settings = cls(
            max_rdy_count=read("max_rdy_count", int, base.max_rdy_count),
            msg_timeout=read("msg_timeout", int, base.msg_timeout),
            max_msg_timeout=read("max_msg_timeout", int, base.max_msg_timeout),
            tls_v1=read("tls_v1", bool, False),
            snappy=read("snappy", bool, False),
            deflate=read("deflate", bool, False),
            deflate_level=read("deflate_level", int, 0),
            max_deflate_level=read("max_deflate_level", int, base.max_deflate_level),
            auth_required=read("auth_required", bool, False),
            sample_rate=read("sample_rate", int, 0),
            output_buffer_size=read("output_buffer_size", int, base.output_buffer_size),
            output_buffer_timeout=read("output_buffer_timeout", int, base.output_buffer_timeout),
            version=read("version", str, ""),
            negotiated=True,
            raw=dict(data),
        )
        if settings.max_rdy_count < 1:
            raise RemoteProtocolError(
                f"IDENTIFY answer max_rdy_count must be >= 1, got {settings.max_rdy_count}"
            )
        if settings.snappy and settings.deflate:
            raise RemoteProtocolError("IDENTIFY answer enabled both snappy and deflate")
        return settings


@dataclass(frozen=True, slots=True)
class AuthResult:
    """nsqd's answer to AUTH: who the secret identifies and how many permissions it grants."""

    identity: str
    identity_url: str
    permission_count: int
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class TLSUpgradeRequired:
    """Start the TLS handshake now, before sending or reading anything else.

    ``trailing_data`` holds bytes that arrived after the IDENTIFY answer: they belong to the TLS
    layer and must be fed to it before anything read later.
    """

    trailing_data: bytes = b""


@dataclass(frozen=True, slots=True)
class ConnectionReady:
    """Negotiation (and TLS, compression, AUTH where asked) finished: SUB or PUB may be sent."""

    settings: ServerSettings
    auth: AuthResult | None = None


@dataclass(frozen=True, slots=True)
class Subscribed:
    """nsqd accepted ``SUB``; messages flow once RDY is above 0."""

    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """nsqd sent ``_heartbeat_``; the connection already queued the ``NOP`` that answers it."""


class PublishAcknowledged(NamedTuple):
    """The publish with this ``request_id`` was accepted by nsqd.

    A ``NamedTuple`` like :class:`Message`: one is built for every publish answered, on the
    publish path's hottest line.
    """

    request_id: int


@dataclass(frozen=True, slots=True)
class PublishFailed:
    """The publish with this ``request_id`` was refused; ``error`` keeps nsqd's code and text."""

    request_id: int
    error: NSQError


@dataclass(frozen=True, slots=True)
class MessageTakenBack:
    """A late ``FIN``/``REQ``/``TOUCH`` failed: the server had already taken the message back
    (it timed out and was requeued, usually to another consumer). Not fatal."""

    message_id: bytes | None
    command: str
    error: ServerError


@dataclass(frozen=True, slots=True)
class CloseWait:
    """nsqd acknowledged ``CLS``: it sends no new messages; in-flight ones may still be answered."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over; the transport must close the socket.

    ``error`` is ``None`` for a clean close after ``CLOSE_WAIT``. ``in_flight`` lists messages
    never answered (nsqd requeues them); ``pending_requests``, publishes that got no answer.
    """

    error: NSQError | None
    in_flight: tuple[bytes, ...] = ()
    pending_requests: tuple[int, ...] = ()


Event = Union[  # noqa: UP007 - a runtime alias must work on Python 3.10
    Message,
    TLSUpgradeRequired,
    ConnectionReady,
    Subscribed,
    Heartbeat,
    PublishAcknowledged,
    PublishFailed,
    MessageTakenBack,
    CloseWait,
    ConnectionClosed,
]

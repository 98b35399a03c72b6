"""What the nsqd role asks of its transport, what it tells a lookupd registrar, and admin errors.

:data:`ServerEvent` values come back from ``NSQD.receive_data`` / ``handle_timer`` / admin
calls and each names the connection it is about. :data:`RegistryEvent` values are the topic and
channel lifecycle that nsqd announces to nsqlookupd (REGISTER / UNREGISTER).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import NSQError, ServerError
from .options import AuthRequest

__all__ = [
    "AdminError",
    "AuthRequested",
    "ChannelCreated",
    "ChannelDeleted",
    "CloseConnection",
    "LookupChannels",
    "RegistryEvent",
    "ServerEvent",
    "StartTLS",
    "TopicCreated",
    "TopicDeleted",
]


@dataclass(frozen=True, slots=True)
class StartTLS:
    """Write ``data_to_send()`` in plaintext, then run a server-side TLS handshake on the
    connection, feeding it ``trailing_data`` (bytes that arrived after IDENTIFY, which belong
    to the handshake) first; then call ``NSQD.tls_established``."""

    conn_id: int
    trailing_data: bytes


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Write ``data_to_send()`` (it may hold the error frame), then close the connection.

    ``error`` is the fatal error nsqd sent (``None`` for EOF, timeouts, admin deletes);
    ``reason`` says in words why, for logs.
    """

    conn_id: int
    reason: str
    error: ServerError | None = None


@dataclass(frozen=True, slots=True)
class AuthRequested:
    """Ask the auth server about ``request`` (with ``NSQDOptions.auth_by_transport``), then
    call ``NSQD.auth_result``. ``refresh`` is a re-check after the previous answer's TTL: the
    connection keeps working meanwhile; otherwise its input waits for the answer."""

    conn_id: int
    request: AuthRequest
    refresh: bool = False


@dataclass(frozen=True, slots=True)
class LookupChannels:
    """A topic was just created and nsqd has nsqlookupds: ask each of ``addresses`` (their
    HTTP ``host:port``) for the topic's channels with ``GET /channels?topic=<topic>``, and
    give each answer to ``NSQD.lookupd_channels`` (``None`` when that nsqlookupd could not
    be asked). Until every nsqlookupd answered, or ``http_client_request_timeout`` passed,
    the topic holds its messages and the client (or HTTP request) that created it waits, as
    nsqd's ``GetTopic`` does; then the channels found are created and get the messages."""

    lookup_id: int
    topic: str
    addresses: tuple[str, ...]


ServerEvent = StartTLS | CloseConnection | AuthRequested | LookupChannels


@dataclass(frozen=True, slots=True)
class TopicCreated:
    """A topic now exists on this nsqd (lookupd: ``REGISTER topic``)."""

    topic: str


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    """A topic is gone (lookupd: ``UNREGISTER topic``)."""

    topic: str


@dataclass(frozen=True, slots=True)
class ChannelCreated:
    """A channel now exists (lookupd: ``REGISTER topic channel``)."""

    topic: str
    channel: str


@dataclass(frozen=True, slots=True)
class ChannelDeleted:
    """A channel is gone (lookupd: ``UNREGISTER topic channel``)."""

    topic: str
    channel: str


RegistryEvent = TopicCreated | TopicDeleted | ChannelCreated | ChannelDeleted


class AdminError(NSQError):
    """An HTTP-API action was refused: ``status`` and ``code`` are what nsqd's HTTP API answers
    (e.g. ``404 TOPIC_NOT_FOUND``, ``413 MSG_TOO_BIG``)."""

    def __init__(self, status: int, code: str, detail: str = "") -> None:
        super().__init__(f"{status} {code}" + (f": {detail}" if detail else ""))
        self.status = status
        self.code = code
        self.detail = detail

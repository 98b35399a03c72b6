"""nsqd's configuration (:class:`NSQDOptions`) and the pluggable AUTH check's records.

Field names are nsqd's flag names in snake_case, with nsqd's defaults. Durations are float
seconds (the core's clock unit); on the wire nsqd speaks milliseconds and the core converts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

from ..errors import ConfigError

__all__ = [
    "DEFAULT_VERSION",
    "AuthCheck",
    "AuthRequest",
    "AuthState",
    "Authorization",
    "NSQDOptions",
]

#: The nsqd version this broker answers with in IDENTIFY, /info and /stats.
DEFAULT_VERSION = "1.3.0"


@dataclass(frozen=True, slots=True)
class Authorization:
    """One grant from an auth server: ``topic`` and ``channels`` are regular expressions
    (searched, as Go's ``MatchString`` does), ``permissions`` holds ``"subscribe"`` and/or
    ``"publish"``."""

    topic: str
    channels: tuple[str, ...] = (".*",)
    permissions: tuple[str, ...] = ("subscribe", "publish")

    def allows(self, topic: str, channel: str) -> bool:
        """nsqd's rule: SUB needs "subscribe", PUB/MPUB/DPUB ("" channel) need "publish"."""
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        try:
            if re.search(self.topic, topic) is None:
                return False
            return any(re.search(pattern, channel) is not None for pattern in self.channels)
        except re.error:
            return False


@dataclass(frozen=True, slots=True)
class AuthState:
    """What the auth server answered for a secret: identity and grants, valid ``ttl`` seconds."""

    identity: str = ""
    identity_url: str = ""
    authorizations: tuple[Authorization, ...] = ()
    ttl: float = 3600.0

    def allows(self, topic: str, channel: str) -> bool:
        """True when some grant covers this action."""
        return any(grant.allows(topic, channel) for grant in self.authorizations)


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What nsqd sends its auth server: the client's IP, whether it uses TLS, and the secret."""

    remote_ip: str
    tls: bool
    secret: str


#: The pluggable AUTH check: ``None`` means the auth server could not be asked (E_AUTH_FAILED);
#: an :class:`AuthState` without authorizations means E_UNAUTHORIZED. It must not block.
AuthCheck = Callable[[AuthRequest], "AuthState | None"]


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"NSQDOptions.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class NSQDOptions:
    """nsqd's flags that matter to the protocol, with nsqd's defaults; validated on creation."""

    node_id: int = 0
    version: str = DEFAULT_VERSION
    hostname: str = "localhost"
    broadcast_address: str = "127.0.0.1"
    tcp_port: int = 4150
    http_port: int = 4151

    mem_queue_size: int = 10_000
    max_msg_size: int = 1_048_576
    max_body_size: int = 5_242_880
    max_rdy_count: int = 2500
    max_channel_consumers: int = 0

    msg_timeout: float = 60.0
    max_msg_timeout: float = 15 * 60.0
    max_req_timeout: float = 60 * 60.0
    #: Longest DPUB / HTTP ``defer``; ``None`` falls back to ``max_req_timeout`` as nsqd does.
    max_defer_timeout: float | None = None
    client_timeout: float = 60.0
    max_heartbeat_interval: float = 60.0

    max_output_buffer_size: int = 65_536
    max_output_buffer_timeout: float = 30.0
    min_output_buffer_timeout: float = 0.025
    output_buffer_timeout: float = 0.25

    snappy: bool = True
    deflate: bool = True
    max_deflate_level: int = 6

    #: nsqd has ``--tls-cert``/``--tls-key``: clients may negotiate ``tls_v1``.
    tls_available: bool = False
    #: ``--tls-required``: every command but IDENTIFY needs TLS first.
    tls_required: bool = False

    #: ``--auth-http-address`` as a callable; ``None`` disables AUTH (unless the next is set).
    auth_check: AuthCheck | None = field(default=None, compare=False)
    #: AUTH is enabled and the transport answers each check: the node emits ``AuthRequested``
    #: and waits for ``NSQD.auth_result`` (for an auth server reached over the network).
    auth_by_transport: bool = False

    #: Longest command line accepted (nsqd reads commands through a 16 KiB buffer).
    max_command_line: int = 16 * 1024
    #: Not nsqd: put a vanished client's in-flight messages back at once instead of waiting
    #: for their timeouts. nsqd waits, so this is off by default.
    requeue_in_flight_on_close: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.node_id < 1024:
            raise ConfigError(f"NSQDOptions.node_id must be within 0..1023, got {self.node_id}")
        for name in ("mem_queue_size",):
            value = getattr(self, name)
            if value < 0:
                raise ConfigError(f"NSQDOptions.{name} must be >= 0, got {value}")
        for name in (
            "max_msg_size",
            "max_body_size",
            "max_rdy_count",
            "msg_timeout",
            "max_msg_timeout",
            "max_req_timeout",
            "client_timeout",
            "max_heartbeat_interval",
            "max_output_buffer_size",
            "max_output_buffer_timeout",
            "min_output_buffer_timeout",
            "output_buffer_timeout",
            "max_command_line",
        ):
            _positive(name, getattr(self, name))
        if self.max_defer_timeout is not None:
            _positive("max_defer_timeout", self.max_defer_timeout)
        if self.max_channel_consumers < 0:
            raise ConfigError(
                f"NSQDOptions.max_channel_consumers must be >= 0 (0 = unlimited), "
                f"got {self.max_channel_consumers}"
            )
        if self.msg_timeout > self.max_msg_timeout:
            raise ConfigError(
                f"NSQDOptions.msg_timeout ({self.msg_timeout}s) must not exceed "
                f"max_msg_timeout ({self.max_msg_timeout}s)"
            )
        if self.max_body_size < self.max_msg_size:
            raise ConfigError(
                f"NSQDOptions.max_body_size ({self.max_body_size}) must be >= max_msg_size "
                f"({self.max_msg_size})"
            )
        if self.max_msg_size > 0x7FFFFFFF or self.max_body_size > 0x7FFFFFFF:
            raise ConfigError("NSQDOptions.max_msg_size/max_body_size must fit a 4-byte size")
        if not 1 <= self.max_deflate_level <= 9:
            raise ConfigError(
                f"NSQDOptions.max_deflate_level must be within 1..9, got {self.max_deflate_level}"
            )
        if self.auth_by_transport and self.auth_check is not None:
            raise ConfigError("NSQDOptions: give auth_check or auth_by_transport, not both")
        if self.tls_required and not self.tls_available:
            raise ConfigError("NSQDOptions.tls_required needs tls_available (a certificate)")
        for port_name in ("tcp_port", "http_port"):
            port = getattr(self, port_name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"NSQDOptions.{port_name} must be within 0..65535, got {port}")

    @property
    def auth_enabled(self) -> bool:
        """Clients must AUTH before SUB/PUB (IDENTIFY answers ``auth_required``)."""
        return self.auth_check is not None or self.auth_by_transport

    @property
    def effective_max_defer_timeout(self) -> float:
        """``max_defer_timeout``, or ``max_req_timeout`` when unset."""
        return self.max_req_timeout if self.max_defer_timeout is None else self.max_defer_timeout

    def flag_names(self) -> Sequence[str]:
        """The option names, for CLIs that map ``--flag-name`` onto them."""
        return [f.name for f in fields(self)]

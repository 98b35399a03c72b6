"""One validated, immutable configuration for consumers and their connections.

Defaults follow go-nsq (the reference client). Durations are float **seconds**, like the
``now`` the core is driven with; :meth:`Config.identify_body` converts them to the
milliseconds IDENTIFY wants. Every field is checked in ``__post_init__``; a bad value raises
:class:`~nsq_sansio.errors.ConfigError` naming the field and the allowed range, so a mistake is
found when the config is built rather than when nsqd closes the connection.

Secrets never show: ``repr()`` and ``str()`` print ``auth_secret='***'``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["DEFAULT_USER_AGENT", "Config"]

#: Fields whose value is a secret: shown as ``'***'`` by ``repr()``.
_SECRET_FIELDS = frozenset({"auth_secret"})

#: Sent as IDENTIFY ``user_agent`` unless the user sets one (HTTP style: name/version).
DEFAULT_USER_AGENT = "nsq-sansio/0.1.0"

_INT32_MAX = 2**31 - 1
_HOUR = 3600.0
#: The longest delay a REQ or DPUB can carry (s): a signed 32-bit count of milliseconds.
_MAX_DELAY = _INT32_MAX / 1000


@dataclass(frozen=True, slots=True)
class Config:
    """Consumer behaviour plus the connection-level IDENTIFY knobs; immutable and validated.

    Use :meth:`replace` to derive a changed copy (validated again).
    """

    # -- flow control -----------------------------------------------------------------------
    #: Messages this consumer may hold un-answered over all connections (0 pauses it).
    max_in_flight: int = 1
    #: Deliveries after which a message is given up (FIN'd and reported); 0 = unlimited.
    max_attempts: int = 5
    #: REQ delay unit when the user gives none: ``default_requeue_delay * attempts``.
    default_requeue_delay: float = 90.0
    #: Ceiling of any automatic REQ delay (also capped by the server's max_req_timeout).
    max_requeue_delay: float = 15 * 60.0
    # -- backoff ----------------------------------------------------------------------------
    #: Turn consumer-wide backoff on failures on or off.
    backoff_enabled: bool = True
    #: Backoff unit: a window lasts ``backoff_multiplier * 2**level`` seconds.
    backoff_multiplier: float = 1.0
    #: Longest backoff window; 0 disables backoff like go-nsq.
    max_backoff_duration: float = 120.0
    # -- discovery and reconnection ---------------------------------------------------------
    #: Seconds between polls of every nsqlookupd.
    lookupd_poll_interval: float = 60.0
    #: Fraction of the interval added at random to each poll (thundering-herd guard).
    lookupd_poll_jitter: float = 0.3
    #: A lookupd request unanswered after this long is reported and skipped.
    lookupd_poll_timeout: float = 60.0
    #: First retry delay for a lost nsqd in direct mode (doubles per failure).
    reconnect_delay: float = 1.0
    #: Ceiling of the direct-mode retry delay.
    max_reconnect_delay: float = 60.0
    #: Fraction of each reconnect delay taken off at random.
    reconnect_jitter: float = 0.3
    #: From TCP connect to SUB answered; a connection slower than this is closed and retried.
    connect_timeout: float = 10.0
    # -- RDY redistribution -----------------------------------------------------------------
    #: A connection holding RDY that received nothing for this long gives it up (low-RDY mode).
    low_rdy_idle_timeout: float = 10.0
    #: Low-RDY mode: a connection gives its RDY up after holding it this long, even if busy,
    #: so that every nsqd is served in turn (go-nsq's low_rdy_timeout).
    low_rdy_timeout: float = 30.0
    #: Period of the RDY redistribution check.
    rdy_redistribute_interval: float = 5.0
    # -- graceful shutdown and pull mode ----------------------------------------------------
    #: How long drain() waits for messages in the user's hands before requeueing them.
    drain_timeout: float = 30.0
    #: Bound on outstanding fetch() requests (JetStream's max_waiting).
    max_waiting_fetches: int = 512
    #: Pull mode: how long a message that arrived for no waiting fetch is held before REQ 0.
    pull_hold_timeout: float = 1.0
    # -- IDENTIFY (connection level) --------------------------------------------------------
    #: Sent in IDENTIFY to name this client in nsqd's /stats and nsqadmin. None: every
    #: client sends the short host name (up to the first dot), as go-nsq does; "" sends it
    #: empty.
    client_id: str | None = None
    #: Sent in IDENTIFY as this client's host name. None: every client sends the full host
    #: name (`socket.gethostname()`, no DNS lookup), as go-nsq does; "" sends it empty.
    hostname: str | None = None
    user_agent: str = DEFAULT_USER_AGENT
    #: Seconds between nsqd heartbeats; None disables them (IDENTIFY -1).
    heartbeat_interval: float | None = 30.0
    #: Server-side message timeout for this client; None keeps nsqd's (--msg-timeout, 60 s).
    msg_timeout: float | None = None
    #: Percentage of the channel's messages to receive; 0 = all (no sampling).
    sample_rate: int = 0
    #: nsqd's output buffer for this client in bytes; -1 disables buffering, None = server's.
    output_buffer_size: int | None = 16 * 1024
    #: nsqd's output flush timeout in seconds; -1 disables it, None = server's.
    output_buffer_timeout: float | None = 0.25
    #: Ask nsqd to upgrade the connection to TLS after IDENTIFY (see security.md); an nsqd
    #: without TLS set up is refused (IncompatibleNSQD), never used in clear.
    tls_v1: bool = False
    #: Negotiate snappy compression of the connection (exclusive with `deflate`); required
    #: once asked: an nsqd that does not enable it is refused (IncompatibleNSQD).
    snappy: bool = False
    #: Negotiate deflate compression of the connection (exclusive with `snappy`); required
    #: once asked, like snappy.
    deflate: bool = False
    deflate_level: int = 6
    #: Sent with AUTH when nsqd requires it (nsqd's --auth-http-address); repr() shows '***'.
    auth_secret: bytes | None = None
    #: Refuse to send auth_secret over a connection without TLS (IncompatibleNSQD instead).
    auth_requires_tls: bool = False
    #: nsqd's --max-req-timeout, when it is not nsqd's default of an hour (nsqd does not
    #: announce it): REQ and DPUB delays above it are refused before they are sent.
    max_req_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_int("max_in_flight", self.max_in_flight, 0, _INT32_MAX)
        _check_int("max_attempts", self.max_attempts, 0, 65535)
        _check_float("default_requeue_delay", self.default_requeue_delay, 0.0, _HOUR)
        _check_float("max_requeue_delay", self.max_requeue_delay, 0.0, _HOUR)
        _check_bool("backoff_enabled", self.backoff_enabled)
        _check_float("backoff_multiplier", self.backoff_multiplier, 0.0, _HOUR)
        _check_float("max_backoff_duration", self.max_backoff_duration, 0.0, _HOUR)
        _check_float("lookupd_poll_interval", self.lookupd_poll_interval, 0.01, 300.0)
        _check_float("lookupd_poll_jitter", self.lookupd_poll_jitter, 0.0, 1.0)
        _check_float("lookupd_poll_timeout", self.lookupd_poll_timeout, 0.01, 300.0)
        _check_float("reconnect_delay", self.reconnect_delay, 0.001, _HOUR)
        _check_float("max_reconnect_delay", self.max_reconnect_delay, 0.001, _HOUR)
        if self.max_reconnect_delay < self.reconnect_delay:
            raise ConfigError(
                f"max_reconnect_delay={self.max_reconnect_delay!r} is below reconnect_delay="
                f"{self.reconnect_delay!r}: allowed reconnect_delay <= max_reconnect_delay"
            )
        _check_float("reconnect_jitter", self.reconnect_jitter, 0.0, 1.0)
        _check_float("connect_timeout", self.connect_timeout, 0.001, _HOUR)
        _check_float("pull_hold_timeout", self.pull_hold_timeout, 0.0, 60.0)
        _check_float("low_rdy_idle_timeout", self.low_rdy_idle_timeout, 1.0, 300.0)
        _check_float("low_rdy_timeout", self.low_rdy_timeout, 1.0, 300.0)
        _check_float("rdy_redistribute_interval", self.rdy_redistribute_interval, 0.001, 5.0)
        _check_float("drain_timeout", self.drain_timeout, 0.0, _HOUR)
        _check_int("max_waiting_fetches", self.max_waiting_fetches, 1, 1_000_000)
        for name in ("client_id", "hostname"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name}={value!r} must be a string or None")
        if not isinstance(self.user_agent, str):
            raise ConfigError(f"user_agent={self.user_agent!r} must be a string")
        if self.heartbeat_interval is not None:
            _check_float("heartbeat_interval", self.heartbeat_interval, 1.0, _HOUR, "or None")
        if self.msg_timeout is not None:
            _check_float("msg_timeout", self.msg_timeout, 1.0, 24 * _HOUR, "or None")
        _check_int("sample_rate", self.sample_rate, 0, 99)
        if self.output_buffer_size is not None and self.output_buffer_size != -1:
            _check_int(
                "output_buffer_size", self.output_buffer_size, 64, _INT32_MAX, "or -1 or None"
            )
        if self.output_buffer_timeout is not None and self.output_buffer_timeout != -1:
            _check_float(
                "output_buffer_timeout", self.output_buffer_timeout, 0.001, _HOUR, "or -1 or None"
            )
        _check_bool("tls_v1", self.tls_v1)
        _check_bool("snappy", self.snappy)
        _check_bool("deflate", self.deflate)
        _check_int("deflate_level", self.deflate_level, 1, 9)
        if self.snappy and self.deflate:
            raise ConfigError("snappy=True and deflate=True: the compressions are exclusive")
        if self.auth_secret is not None and not isinstance(self.auth_secret, bytes):
            raise ConfigError(f"auth_secret must be bytes or None, got {type(self.auth_secret)}")
        _check_bool("auth_requires_tls", self.auth_requires_tls)
        if self.max_req_timeout is not None:
            _check_float("max_req_timeout", self.max_req_timeout, 0.0, _MAX_DELAY, "or None")

    def __repr__(self) -> str:
        """The fields as the dataclass would show them, with secrets as ``'***'``."""
        shown = (
            f"{f.name}='***'"
            if f.name in _SECRET_FIELDS and getattr(self, f.name) is not None
            else f"{f.name}={getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"{type(self).__name__}({', '.join(shown)})"

    __str__ = __repr__

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied and validated again."""
        try:
            return dataclasses.replace(self, **changes)
        except TypeError as exc:  # unknown field name
            raise ConfigError(f"unknown Config field in {sorted(changes)}: {exc}") from None

    @property
    def backoff_active(self) -> bool:
        """Whether failures can put the consumer in backoff at all."""
        return (
            self.backoff_enabled and self.backoff_multiplier > 0 and self.max_backoff_duration > 0
        )

    def identify_body(self) -> dict[str, object]:
        """The IDENTIFY JSON fields for :class:`~nsq_sansio.connection.ClientConnection`.

        Durations become integer milliseconds; unset (``None``) fields are left out so nsqd
        applies its own defaults.
        """
        body: dict[str, object] = {
            "user_agent": self.user_agent,
            "feature_negotiation": True,
            "heartbeat_interval": (
                -1 if self.heartbeat_interval is None else _ms(self.heartbeat_interval)
            ),
            "tls_v1": self.tls_v1,
            "snappy": self.snappy,
            "deflate": self.deflate,
            "deflate_level": self.deflate_level,
            "sample_rate": self.sample_rate,
        }
        if self.client_id is not None:
            body["client_id"] = self.client_id
        if self.hostname is not None:
            body["hostname"] = self.hostname
        if self.output_buffer_size is not None:
            body["output_buffer_size"] = self.output_buffer_size
        if self.output_buffer_timeout is not None:
            body["output_buffer_timeout"] = (
                -1 if self.output_buffer_timeout == -1 else _ms(self.output_buffer_timeout)
            )
        if self.msg_timeout is not None:
            body["msg_timeout"] = _ms(self.msg_timeout)
        return body


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} must be True or False")


def _check_int(name: str, value: object, low: int, high: int, extra: str = "") -> None:
    allowed = f"allowed {low} <= {name} <= {high}{' ' + extra if extra else ''}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} must be an integer: {allowed}")
    if not low <= value <= high:
        raise ConfigError(f"{name}={value!r} is out of range: {allowed}")


def _check_float(name: str, value: object, low: float, high: float, extra: str = "") -> None:
    allowed = f"allowed {low:g} <= {name} <= {high:g} (seconds){' ' + extra if extra else ''}"
    if name in ("lookupd_poll_jitter", "reconnect_jitter"):
        allowed = f"allowed {low:g} <= {name} <= {high:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r} must be a number: {allowed}")
    if math.isnan(value) or not low <= value <= high:
        raise ConfigError(f"{name}={value!r} is out of range: {allowed}")

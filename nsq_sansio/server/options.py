"""nsqd's configuration (:class:`NSQDOptions`) and the pluggable AUTH check's records.

Field names are nsqd's flag names in snake_case, with nsqd's defaults. Durations are float
seconds (the core's clock unit); on the wire nsqd speaks milliseconds and the core converts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any

from ..errors import ConfigError

try:  # RE2's own binding (google-re2): nsqd matches grants with Go's RE2
    import re2 as _re2  # type: ignore[import-untyped, import-not-found, unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    _re2 = None
try:
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse

_RE2_OPTIONS: Any = None
if _re2 is not None:
    _RE2_OPTIONS = _re2.Options()
    _RE2_OPTIONS.log_errors = False  # a bad pattern is refused quietly, not logged to stderr

__all__ = [
    "DEFAULT_VERSION",
    "MAX_PATTERN_LENGTH",
    "MAX_UNBOUNDED_REPEATS",
    "AuthCheck",
    "AuthRequest",
    "AuthState",
    "Authorization",
    "NSQDOptions",
    "grant_pattern",
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
        """nsqd's rule: SUB needs "subscribe", PUB/MPUB/DPUB ("" channel) need "publish".
        A pattern that cannot be used (see :func:`grant_pattern`) matches nothing."""
        needed = "subscribe" if channel else "publish"
        if needed not in self.permissions:
            return False
        topic_matches = grant_pattern(self.topic)
        if topic_matches is None or not topic_matches(topic):
            return False
        for pattern in self.channels:
            matches = grant_pattern(pattern)
            if matches is not None and matches(channel):
                return True
        return False


#: Longest topic or channel pattern of a grant that is used (longer ones match nothing).
MAX_PATTERN_LENGTH = 512
#: Without RE2, at most this many unbounded repeats (``*``, ``+``, ``{n,}``) in one pattern:
#: backtracking over a 64-character name stays polynomial of this degree.
MAX_UNBOUNDED_REPEATS = 2


@lru_cache(maxsize=4096)
def grant_pattern(pattern: str) -> Callable[[str], bool] | None:
    """The search function of an auth server's topic or channel pattern, or ``None`` when it
    cannot be used (invalid, longer than :data:`MAX_PATTERN_LENGTH`, or unsafe).

    nsqd matches these with Go's RE2, in time linear in the name. With the ``google-re2``
    package installed (RE2's own Python binding) they are matched the same way, syntax
    included. Without it Python's backtracking ``re`` is used, on patterns that cannot
    backtrack exponentially only: no repeat inside a repeat (``^(a+)+$`` doubles its time
    with every character), no alternation inside a repeat, at most
    :data:`MAX_UNBOUNDED_REPEATS` unbounded repeats, no backreference or lookaround (which
    RE2 does not have either).
    """
    if len(pattern) > MAX_PATTERN_LENGTH:
        return None
    if _re2 is not None:
        try:
            compiled_re2 = _re2.compile(pattern, _RE2_OPTIONS)
        except Exception:  # re2.error, and whatever else an odd pattern raises
            return None
        return lambda name: compiled_re2.search(name) is not None
    try:
        if not _backtracks_safely(_sre_parse.parse(pattern)):
            return None
        compiled = re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    return lambda name: compiled.search(name) is not None


def _backtracks_safely(parsed: Any) -> bool:
    unbounded = 0

    def walk(items: Any, inside_repeat: bool) -> bool:
        nonlocal unbounded
        for op, arg in items:
            name = str(op)
            if name in _REFUSED_OPS:
                return False
            if name in _REPEAT_OPS:
                _, high, body = arg
                repeats = high > 1
                if repeats and inside_repeat:
                    return False
                if high == _sre_parse.MAXREPEAT:
                    unbounded += 1
                if not walk(body, inside_repeat or repeats):
                    return False
            elif name == "BRANCH":
                if inside_repeat:
                    return False
                if not all(walk(branch, inside_repeat) for branch in arg[1]):
                    return False
            elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
                body = arg[-1] if name == "SUBPATTERN" else arg
                if not walk(body, inside_repeat):
                    return False
        return True

    return walk(parsed, False) and unbounded <= MAX_UNBOUNDED_REPEATS


_REPEAT_OPS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})
_REFUSED_OPS = frozenset({"GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT"})


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
    """What nsqd sends its auth server: the client's IP, whether it uses TLS, and the secret
    (left out of ``repr``, so it never reaches a log or a traceback by accident)."""

    remote_ip: str
    tls: bool
    secret: str = field(repr=False)


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

    #: nsqd's HTTP client: how long to connect, and the whole request, e.g. asking
    #: nsqlookupd for a new topic's channels (a topic waits for it at most this long).
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0

    #: ``--e2e-processing-latency-percentile``: the percentiles of each channel's (and
    #: topic's) publish-to-FIN latency reported in ``/stats``, each within (0, 1]; kept
    #: sorted from the highest, as nsqd keeps them. Empty (the default): none tracked.
    e2e_processing_latency_percentiles: tuple[float, ...] = ()
    #: ``--e2e-processing-latency-window-time``: the latencies of about this long ago are
    #: the oldest the percentiles cover (nsqd's default, 10 minutes).
    e2e_processing_latency_window_time: float = 600.0

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
            "http_client_connect_timeout",
            "http_client_request_timeout",
            "e2e_processing_latency_window_time",
            "max_command_line",
        ):
            _positive(name, getattr(self, name))
        percentiles = self.e2e_processing_latency_percentiles
        if isinstance(percentiles, (str, bytes)) or not isinstance(percentiles, Iterable):
            raise ConfigError(
                "NSQDOptions.e2e_processing_latency_percentiles must be a sequence of "
                f"numbers, got {percentiles!r}"
            )
        for value in percentiles:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigError(f"invalid E2E processing latency percentile: {value!r}")
        object.__setattr__(
            self,
            "e2e_processing_latency_percentiles",
            tuple(sorted((float(v) for v in percentiles), reverse=True)),
        )
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

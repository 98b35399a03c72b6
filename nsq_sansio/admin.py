"""nsqd's and nsqlookupd's HTTP API, pure: the requests to send and their answers, typed.

Every call of the admin clients (:class:`~transports.anyio.admin.NSQDAdmin`,
:class:`~transports.anyio.admin.LookupdAdmin` and their blocking twins) is an
:class:`AdminRequest` built here by :class:`NSQDAPI` or :class:`LookupdAPI`: the method and
target to send, and :meth:`AdminRequest.read`, which turns the
:class:`~nsq_sansio.http_client.HTTPAnswer` into a frozen dataclass or a typed error. The
runtimes only move bytes (through :class:`~nsq_sansio.http_client.HTTPClient`), so every
runtime answers the same call with the same value or the same exception.

Errors: an error status is an :class:`AdminHTTPError` with the HTTP status and nsqd's message
(``INVALID_TOPIC``...), :class:`TopicNotFound` / :class:`ChannelNotFound` for the 404s; an
answer that is not what the API documents (not JSON, a wrong type anywhere, over the size
limit) is an :class:`AdminResponseError`. Parsing never raises anything else, whatever the JSON.

**Lag** (:attr:`ChannelStats.lag`) is what an operator means by "how far behind is this
consumer group on this nsqd": the messages published to the topic that the channel has not
finished yet, i.e. ``topic_depth + depth + in_flight_count + deferred_count`` (``depth``
already counts the channel's disk backlog, ``backend_depth``). See :class:`ChannelStats`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

from .discovery import NSQDAddress, _join, _split_host_port
from .errors import ConfigError, NSQError, RemoteProtocolError
from .http_client import DEFAULT_MAX_BODY_SIZE, HTTPAnswer
from .names import validate_channel, validate_topic

__all__ = [
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_NSQD_HTTP_PORT",
    "NSQDAPI",
    "AdminEndpoint",
    "AdminHTTPError",
    "AdminRequest",
    "AdminResponseError",
    "ChannelNotFound",
    "ChannelStats",
    "ClientStats",
    "E2ELatency",
    "LatencyPercentile",
    "LookupdAPI",
    "LookupdInfo",
    "LookupdNode",
    "LookupdProducer",
    "MemoryStats",
    "NSQDInfo",
    "NSQDStats",
    "PubCount",
    "TopicLookup",
    "TopicNotFound",
    "TopicStats",
    "http_error",
    "parse_lookupd_info",
    "parse_lookupd_nodes",
    "parse_nsqd_info",
    "parse_nsqd_stats",
    "parse_topic_lookup",
]

DEFAULT_NSQD_HTTP_PORT = 4151
DEFAULT_LOOKUPD_HTTP_PORT = 4161

T = TypeVar("T")


# --- errors --------------------------------------------------------------------------------------


class AdminHTTPError(NSQError):
    """nsqd or nsqlookupd answered an HTTP API call with an error status.

    ``status`` is the HTTP status, ``message`` the server's own text (nsqd's code such as
    ``INVALID_TOPIC``, or the health text of a failing ``/ping``), ``method`` and ``target``
    the request and ``endpoint`` where it went.
    """

    def __init__(
        self, status: int, message: str, *, method: str = "", target: str = "", endpoint: str = ""
    ) -> None:
        where = " ".join(part for part in (endpoint, method, target) if part)
        super().__init__(f"{where + ': ' if where else ''}HTTP {status} {message}".rstrip())
        self.status = status
        self.message = message
        self.method = method
        self.target = target
        self.endpoint = endpoint


class TopicNotFound(AdminHTTPError):
    """The topic does not exist there (nsqd's and nsqlookupd's ``404 TOPIC_NOT_FOUND``)."""


class ChannelNotFound(AdminHTTPError):
    """The channel does not exist on that topic (``404 CHANNEL_NOT_FOUND``)."""


class AdminResponseError(RemoteProtocolError):
    """An answer was not what the HTTP API documents: not JSON, a field of the wrong type, a
    missing name; the message says which field (``topics[0].channels[2].depth``...)."""


_NOT_FOUND: dict[str, type[AdminHTTPError]] = {
    "TOPIC_NOT_FOUND": TopicNotFound,
    "CHANNEL_NOT_FOUND": ChannelNotFound,
}


# --- where ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminEndpoint:
    """Where an nsqd or nsqlookupd HTTP API listens; ``tls`` means HTTPS."""

    host: str
    port: int
    tls: bool = False
    path_prefix: str = ""

    def __str__(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{_join(self.host, self.port)}{self.path_prefix}"

    @property
    def host_header(self) -> str:
        """``host:port`` as the ``Host`` header wants it (IPv6 in brackets)."""
        return _join(self.host, self.port)

    @classmethod
    def parse(cls, url: str | AdminEndpoint, default_port: int) -> AdminEndpoint:
        """``"http://host:4151"``, ``"https://[::1]:4152/prefix"`` or a bare ``"host:port"``
        (http, ``default_port`` when none is given); :class:`ConfigError` otherwise."""
        if isinstance(url, AdminEndpoint):
            return url
        if not isinstance(url, str):
            raise ConfigError(f"HTTP API address must be a str, got {url!r}")
        raw = url.strip()
        if "://" not in raw:
            raw = "http://" + raw
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https"):
            raise ConfigError(f"HTTP API address {url!r}: scheme must be http or https")
        if parts.query or parts.fragment or "@" in parts.netloc:
            raise ConfigError(f"HTTP API address {url!r}: no user, query or fragment allowed")
        tls = parts.scheme == "https"
        host, port = _split_host_port(parts.netloc, default_port, "HTTP API")
        if any(c in host for c in " /\\\r\n\t"):
            raise ConfigError(f"HTTP API address {url!r}: bad host")
        return cls(host, port, tls, parts.path.rstrip("/"))


# --- requests ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdminRequest(Generic[T]):
    """One call of the HTTP API: what to send, and how to read the answer."""

    method: str
    path: str
    query: tuple[tuple[str, str], ...]
    parse: Callable[[bytes], T]

    def target(self, path_prefix: str = "") -> str:
        """The request target (path and URL-encoded query) under ``path_prefix``."""
        target = path_prefix + self.path
        if self.query:
            target += "?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in self.query)
        return target

    def read(self, answer: HTTPAnswer, endpoint: AdminEndpoint | str = "") -> T:
        """The answer's value; :class:`AdminHTTPError` (or a subclass) for an error status,
        :class:`AdminResponseError` when the body is not what the API documents."""
        where = str(endpoint)
        if not answer.ok:
            raise http_error(answer.status, answer.body, self.method, self.target(), where)
        try:
            return self.parse(answer.body)
        except AdminHTTPError as exc:  # a not-found the answer implies (topic_stats...)
            raise type(exc)(
                exc.status, exc.message, method=self.method, target=self.target(), endpoint=where
            ) from None
        except AdminResponseError as exc:
            prefix = f"{where} " if where else ""
            raise AdminResponseError(f"{prefix}{self.method} {self.target()}: {exc}") from None


def http_error(
    status: int, body: bytes, method: str = "", target: str = "", endpoint: str = ""
) -> AdminHTTPError:
    """The typed error for an error answer: nsqd's ``{"message": ...}`` (or the old
    ``status_txt`` envelope, or plain text) as ``message``; the not-found codes get their
    own class."""
    text = body[:4096].decode("utf-8", "replace").strip()
    message = text
    try:
        document = json.loads(text) if text else None
    except (ValueError, RecursionError):
        document = None
    if isinstance(document, dict):
        found = document.get("message", document.get("status_txt"))
        if isinstance(found, str):
            message = found
        inner = document.get("status_code")
        if isinstance(inner, int) and not isinstance(inner, bool) and 100 <= inner <= 999:
            status = inner
    kind = _NOT_FOUND.get(message, AdminHTTPError) if status == 404 else AdminHTTPError
    return kind(status, message, method=method, target=target, endpoint=endpoint)


def _query(**params: str | None) -> tuple[tuple[str, str], ...]:
    return tuple((k, v) for k, v in params.items() if v is not None)


def _nothing(body: bytes) -> None:
    return None


class NSQDAPI:
    """nsqd's HTTP API as :class:`AdminRequest` objects, one per call (names are checked
    here, so a bad one raises :class:`~nsq_sansio.errors.InvalidName` before any IO)."""

    @staticmethod
    def ping() -> AdminRequest[None]:
        """``GET /ping``: None when healthy; nsqd answers 500 with its health text otherwise
        (an :class:`AdminHTTPError` whose ``message`` is that text)."""
        return AdminRequest("GET", "/ping", (), _nothing)

    @staticmethod
    def info() -> AdminRequest[NSQDInfo]:
        """``GET /info``: version, addresses and limits."""
        return AdminRequest("GET", "/info", (), parse_nsqd_info)

    @staticmethod
    def stats(
        topic: str | None = None,
        channel: str | None = None,
        *,
        include_clients: bool = True,
        include_memory: bool = False,
    ) -> AdminRequest[NSQDStats]:
        """``GET /stats?format=json``, optionally filtered to a topic and channel. Without
        ``include_clients`` nsqd leaves out the per-client entries (``client_count`` stays);
        ``include_memory`` asks for the Go runtime's memory figures (nsqd stops the world
        briefly to read them, so it is off by default)."""
        if topic is not None:
            validate_topic(topic)
        if channel is not None:
            validate_channel(channel)
        query = _query(
            format="json",
            topic=topic,
            channel=channel,
            include_clients=None if include_clients else "false",
            include_mem="true" if include_memory else "false",
        )
        return AdminRequest("GET", "/stats", query, parse_nsqd_stats)

    @staticmethod
    def topic_stats(topic: str) -> AdminRequest[TopicStats]:
        """One topic's ``/stats`` entry; :class:`TopicNotFound` when nsqd has no such topic."""
        validate_topic(topic)

        def parse(body: bytes) -> TopicStats:
            found = parse_nsqd_stats(body).topic(topic)
            if found is None:
                raise TopicNotFound(404, "TOPIC_NOT_FOUND")
            return found

        return AdminRequest("GET", "/stats", _query(format="json", topic=topic), parse)

    @staticmethod
    def channel_stats(topic: str, channel: str) -> AdminRequest[ChannelStats]:
        """One channel's ``/stats`` entry (its :attr:`~ChannelStats.lag` included);
        :class:`TopicNotFound` or :class:`ChannelNotFound` when it does not exist."""
        validate_topic(topic)
        validate_channel(channel)

        def parse(body: bytes) -> ChannelStats:
            found = parse_nsqd_stats(body).topic(topic)
            if found is None:
                raise TopicNotFound(404, "TOPIC_NOT_FOUND")
            chan = found.channel(channel)
            if chan is None:
                raise ChannelNotFound(404, "CHANNEL_NOT_FOUND")
            return chan

        return AdminRequest("GET", "/stats", _query(format="json", topic=topic), parse)

    @staticmethod
    def create_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/create`` (nothing changes if it exists)."""
        return _topic_call("/topic/create", topic)

    @staticmethod
    def delete_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/delete``: the topic, its channels, their messages; consumers of its
        channels are disconnected. :class:`TopicNotFound` if it does not exist."""
        return _topic_call("/topic/delete", topic)

    @staticmethod
    def empty_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/empty``: drop the messages waiting in the topic itself (not those
        already copied into its channels)."""
        return _topic_call("/topic/empty", topic)

    @staticmethod
    def pause_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/pause``: published messages wait in the topic (no channel gets them)."""
        return _topic_call("/topic/pause", topic)

    @staticmethod
    def unpause_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/unpause``: what waited in the topic flows to its channels again."""
        return _topic_call("/topic/unpause", topic)

    @staticmethod
    def create_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/create`` on an existing topic (:class:`TopicNotFound` otherwise);
        from then on the channel gets a copy of every message published to the topic."""
        return _channel_call("/channel/create", topic, channel)

    @staticmethod
    def delete_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/delete``: its messages go and its consumers are disconnected."""
        return _channel_call("/channel/delete", topic, channel)

    @staticmethod
    def empty_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/empty``: drop the channel's queued messages (memory and disk)."""
        return _channel_call("/channel/empty", topic, channel)

    @staticmethod
    def pause_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/pause``: no deliveries to its consumers; messages keep queueing."""
        return _channel_call("/channel/pause", topic, channel)

    @staticmethod
    def unpause_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/unpause``: deliveries resume."""
        return _channel_call("/channel/unpause", topic, channel)


def _topic_call(path: str, topic: str) -> AdminRequest[None]:
    validate_topic(topic)
    return AdminRequest("POST", path, _query(topic=topic), _nothing)


def _channel_call(path: str, topic: str, channel: str) -> AdminRequest[None]:
    validate_topic(topic)
    validate_channel(channel)
    return AdminRequest("POST", path, _query(topic=topic, channel=channel), _nothing)


class LookupdAPI:
    """nsqlookupd's HTTP API as :class:`AdminRequest` objects, one per call."""

    @staticmethod
    def ping() -> AdminRequest[None]:
        """``GET /ping``."""
        return AdminRequest("GET", "/ping", (), _nothing)

    @staticmethod
    def info() -> AdminRequest[LookupdInfo]:
        """``GET /info``: the version."""
        return AdminRequest("GET", "/info", (), parse_lookupd_info)

    @staticmethod
    def nodes() -> AdminRequest[tuple[LookupdNode, ...]]:
        """``GET /nodes``: every nsqd registered, with its topics and their tombstones."""
        return AdminRequest("GET", "/nodes", (), parse_lookupd_nodes)

    @staticmethod
    def topics() -> AdminRequest[tuple[str, ...]]:
        """``GET /topics``: every topic known, sorted."""
        return AdminRequest("GET", "/topics", (), _names_parser("topics"))

    @staticmethod
    def channels(topic: str) -> AdminRequest[tuple[str, ...]]:
        """``GET /channels?topic=``: the topic's channels, sorted (none for an unknown topic)."""
        validate_topic(topic)
        return AdminRequest("GET", "/channels", _query(topic=topic), _names_parser("channels"))

    @staticmethod
    def lookup(topic: str) -> AdminRequest[TopicLookup]:
        """``GET /lookup?topic=``: the nsqd producing the topic (tombstoned ones left out)
        and its channels; :class:`TopicNotFound` when no nsqd ever registered it."""
        validate_topic(topic)

        def parse(body: bytes) -> TopicLookup:
            return parse_topic_lookup(topic, body)

        return AdminRequest("GET", "/lookup", _query(topic=topic), parse)

    @staticmethod
    def create_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/create``: register a topic with no producer yet."""
        validate_topic(topic)
        return AdminRequest("POST", "/topic/create", _query(topic=topic), _nothing)

    @staticmethod
    def delete_topic(topic: str) -> AdminRequest[None]:
        """``POST /topic/delete``: forget the topic and its channels here. nsqlookupd does not
        tell the nsqd: delete it there too, or their next registration brings it back."""
        validate_topic(topic)
        return AdminRequest("POST", "/topic/delete", _query(topic=topic), _nothing)

    @staticmethod
    def create_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/create``: register a channel (and its topic)."""
        validate_topic(topic)
        validate_channel(channel)
        query = _query(topic=topic, channel=channel)
        return AdminRequest("POST", "/channel/create", query, _nothing)

    @staticmethod
    def delete_channel(topic: str, channel: str) -> AdminRequest[None]:
        """``POST /channel/delete``: forget the channel here; :class:`ChannelNotFound` when
        it is not registered."""
        validate_topic(topic)
        validate_channel(channel)
        query = _query(topic=topic, channel=channel)
        return AdminRequest("POST", "/channel/delete", query, _nothing)

    @staticmethod
    def tombstone(topic: str, node: str | LookupdProducer) -> AdminRequest[None]:
        """``POST /topic/tombstone``: hide one nsqd from the topic's ``/lookup`` answers for
        nsqlookupd's ``--tombstone-lifetime``, so consumers stop finding it there while it
        deletes the topic. ``node`` is the nsqd's ``broadcast_address:http_port`` (its HTTP
        port, not TCP) or a producer/node from :meth:`lookup` or :meth:`nodes`."""
        validate_topic(topic)
        if isinstance(node, LookupdProducer):
            text = node.http_address
        else:
            text = str(NSQDAddress.parse(node))
        return AdminRequest("POST", "/topic/tombstone", _query(topic=topic, node=text), _nothing)


# --- answers: nsqd -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyPercentile:
    """One end-to-end latency percentile: ``quantile`` (0.99) and its value in seconds."""

    quantile: float
    seconds: float


@dataclass(frozen=True, slots=True)
class E2ELatency:
    """End-to-end processing latency (publish to FIN) that nsqd measured over its window.

    Only when nsqd runs with ``--e2e-processing-latency-percentile``; ``count`` is how many
    messages the window saw (0: the percentiles are 0 and mean nothing yet).
    """

    count: int
    percentiles: tuple[LatencyPercentile, ...]

    def percentile(self, quantile: float) -> float | None:
        """The value in seconds at ``quantile`` (0.99), or None when nsqd does not track it."""
        for entry in self.percentiles:
            if entry.quantile == quantile:
                return entry.seconds
        return None


@dataclass(frozen=True, slots=True)
class PubCount:
    """How many messages a producer connection published to one topic."""

    topic: str
    count: int


@dataclass(frozen=True, slots=True)
class ClientStats:
    """One client connection as nsqd's ``/stats`` lists it (a consumer of a channel, or a
    producer with its ``pub_counts``)."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    #: nsqd's connection state: 0 init, 1 disconnected, 2 connected, 3 subscribed, 4 closing.
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    #: When it connected (Unix seconds).
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: bool
    tls_cipher_suite: str
    tls_version: str
    tls_negotiated_protocol: str
    tls_negotiated_protocol_is_mutual: bool
    authed: bool
    auth_identity: str
    auth_identity_url: str
    pub_counts: tuple[PubCount, ...]


@dataclass(frozen=True, slots=True)
class ChannelStats:
    """One channel of one nsqd, from ``/stats``.

    ``depth`` is what waits to be delivered (memory plus disk: it includes
    ``backend_depth``), ``in_flight_count`` what was delivered and not yet finished,
    ``deferred_count`` what waits for a delay (a requeue with delay or a deferred publish).
    ``message_count``, ``requeue_count`` and ``timeout_count`` count since the channel was
    created. ``topic_depth`` is the depth of its topic: messages published and not yet copied
    into the channels (a paused topic, or a backlog nsqd is still moving).
    """

    topic: str
    name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    requeue_count: int
    timeout_count: int
    client_count: int
    paused: bool
    #: Per-client entries (empty when asked for without clients; ``client_count`` remains).
    clients: tuple[ClientStats, ...]
    e2e_latency: E2ELatency | None
    topic_depth: int

    @property
    def lag(self) -> int:
        """Messages published to the topic on this nsqd that this channel has not finished:
        ``topic_depth + depth + in_flight_count + deferred_count``.

        That is the consumer group's backlog in the sense of "work not done yet": waiting in
        the topic (it will reach the channel), queued in the channel (memory or disk),
        delivered but not finished (a crash would redeliver them), and deferred. It is 0
        exactly when everything published so far has been finished. Sum it over every nsqd
        of the topic (:meth:`LookupdAPI.lookup`) for the whole cluster.
        """
        return self.topic_depth + self.depth + self.in_flight_count + self.deferred_count


@dataclass(frozen=True, slots=True)
class TopicStats:
    """One topic of one nsqd, from ``/stats``: ``depth`` (memory plus disk, waiting to be
    copied into its channels), ``message_count`` and ``message_bytes`` published, its
    channels."""

    name: str
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    channels: tuple[ChannelStats, ...]
    #: Merged over its channels, when nsqd tracks it.
    e2e_latency: E2ELatency | None

    def channel(self, name: str) -> ChannelStats | None:
        """The channel called ``name``, or None."""
        for chan in self.channels:
            if chan.name == name:
                return chan
        return None


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """The Go runtime's memory figures of nsqd (``include_memory=True``)."""

    heap_objects: int
    heap_idle_bytes: int
    heap_in_use_bytes: int
    heap_released_bytes: int
    gc_pause_usec_100: int
    gc_pause_usec_99: int
    gc_pause_usec_95: int
    next_gc_bytes: int
    gc_total_runs: int


@dataclass(frozen=True, slots=True)
class NSQDStats:
    """nsqd's ``/stats``: its health, topics (sorted by name, channels too) and producers."""

    version: str
    #: ``"OK"``, or why nsqd is unhealthy (a failed disk write).
    health: str
    #: When nsqd started (Unix seconds).
    start_time: int
    topics: tuple[TopicStats, ...]
    #: Connections that published (with their ``pub_counts``).
    producers: tuple[ClientStats, ...]
    memory: MemoryStats | None

    def topic(self, name: str) -> TopicStats | None:
        """The topic called ``name``, or None."""
        for found in self.topics:
            if found.name == name:
                return found
        return None

    def channel(self, topic: str, channel: str) -> ChannelStats | None:
        """The channel ``channel`` of ``topic``, or None."""
        found = self.topic(topic)
        return None if found is None else found.channel(channel)


@dataclass(frozen=True, slots=True)
class NSQDInfo:
    """nsqd's ``/info``: version, where it listens, and the limits clients negotiate against
    (durations in seconds; fields an older nsqd leaves out are 0 or empty)."""

    version: str
    broadcast_address: str
    hostname: str
    http_port: int
    tcp_port: int
    start_time: int
    max_heartbeat_interval: float
    max_output_buffer_size: int
    max_output_buffer_timeout: float
    max_deflate_level: int


# --- answers: nsqlookupd -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LookupdInfo:
    """nsqlookupd's ``/info``."""

    version: str


@dataclass(frozen=True, slots=True)
class LookupdProducer:
    """An nsqd as nsqlookupd knows it: where it says it is (``broadcast_address`` and ports),
    where it registered from (``remote_address``), its version."""

    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str

    @property
    def tcp_address(self) -> str:
        """``broadcast_address:tcp_port``: where consumers and producers connect."""
        return _join(self.broadcast_address, self.tcp_port)

    @property
    def http_address(self) -> str:
        """``broadcast_address:http_port``: its HTTP API, and its name for tombstones."""
        return _join(self.broadcast_address, self.http_port)


@dataclass(frozen=True, slots=True)
class LookupdNode(LookupdProducer):
    """An nsqd registered with nsqlookupd (``/nodes``), with its topics; those tombstoned for
    this node are in ``tombstoned_topics`` too."""

    topics: tuple[str, ...] = ()
    tombstoned_topics: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicLookup:
    """``/lookup`` for one topic: its channels (sorted) and the nsqd producing it."""

    topic: str
    channels: tuple[str, ...]
    producers: tuple[LookupdProducer, ...]


# --- parsing -------------------------------------------------------------------------------------


class _Obj:
    """A JSON object read field by field with checked types; errors name the field's path."""

    __slots__ = ("_data", "_path")

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, dict):
            raise AdminResponseError(f"{path or 'answer'}: expected an object, got {_kind(data)}")
        self._data: dict[str, Any] = data
        self._path = path

    def _where(self, key: str) -> str:
        return f"{self._path}.{key}" if self._path else key

    def integer(self, key: str, default: int = 0) -> int:
        value = self._data.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise AdminResponseError(f"{self._where(key)}: expected an integer, got {_kind(value)}")
        return value

    def number(self, key: str) -> float:
        value = self._data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AdminResponseError(f"{self._where(key)}: expected a number, got {_kind(value)}")
        try:
            result = float(value)
        except OverflowError:
            raise AdminResponseError(f"{self._where(key)}: number out of range") from None
        if not math.isfinite(result):
            raise AdminResponseError(f"{self._where(key)}: expected a finite number")
        return result

    def text(self, key: str, default: str = "") -> str:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise AdminResponseError(f"{self._where(key)}: expected a string, got {_kind(value)}")
        return value

    def name(self, key: str) -> str:
        value = self.text(key)
        if not value:
            raise AdminResponseError(f"{self._where(key)}: missing")
        return value

    def flag(self, key: str, default: bool = False) -> bool:
        value = self._data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise AdminResponseError(f"{self._where(key)}: expected true/false, got {_kind(value)}")
        return value

    def array(self, key: str) -> list[Any]:
        """A list, or [] for a missing key or null (Go's nil slice)."""
        value = self._data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise AdminResponseError(f"{self._where(key)}: expected a list, got {_kind(value)}")
        return value

    def objects(self, key: str) -> list[_Obj]:
        where = self._where(key)
        return [_Obj(item, f"{where}[{i}]") for i, item in enumerate(self.array(key))]

    def strings(self, key: str) -> list[str]:
        items = self.array(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise AdminResponseError(
                    f"{self._where(key)}[{i}]: expected a string, got {_kind(item)}"
                )
        return items

    def optional(self, key: str) -> _Obj | None:
        value = self._data.get(key)
        return None if value is None else _Obj(value, self._where(key))


def _kind(value: object) -> str:
    """How an error names a JSON value: its kind, and a short repr of a scalar."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    kind = {bool: "a boolean", int: "an integer", float: "a number"}.get(type(value), "a string")
    return f"{kind} {value!r:.40}"


def _document(body: bytes) -> object:
    """The JSON of an answer, without the envelope nsqd and nsqlookupd used before 1.0
    (``{"status_code": 200, "status_txt": "OK", "data": {...}}``)."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        raise AdminResponseError(f"not JSON: {body[:80]!r}") from None
    if isinstance(document, dict) and "status_code" in document and "data" in document:
        return document["data"]
    return document


def _seconds(obj: _Obj, key: str, scale: float = 1e9) -> float:
    """A duration nsqd gives in nanoseconds (Go's ``time.Duration``), in seconds."""
    value = obj.integer(key)
    try:
        return value / scale
    except OverflowError:
        raise AdminResponseError(f"{obj._where(key)}: number out of range") from None


def _latency(obj: _Obj) -> E2ELatency | None:
    found = obj.optional("e2e_processing_latency")
    if found is None:
        return None
    entries = found.objects("percentiles")
    if not entries:
        return None
    percentiles = tuple(
        LatencyPercentile(entry.number("quantile"), _seconds(entry, "value")) for entry in entries
    )
    return E2ELatency(found.integer("count"), percentiles)


def _client(obj: _Obj) -> ClientStats:
    return ClientStats(
        client_id=obj.text("client_id"),
        hostname=obj.text("hostname"),
        version=obj.text("version"),
        remote_address=obj.text("remote_address"),
        state=obj.integer("state"),
        ready_count=obj.integer("ready_count"),
        in_flight_count=obj.integer("in_flight_count"),
        message_count=obj.integer("message_count"),
        finish_count=obj.integer("finish_count"),
        requeue_count=obj.integer("requeue_count"),
        connect_ts=obj.integer("connect_ts"),
        sample_rate=obj.integer("sample_rate"),
        deflate=obj.flag("deflate"),
        snappy=obj.flag("snappy"),
        user_agent=obj.text("user_agent"),
        tls=obj.flag("tls"),
        tls_cipher_suite=obj.text("tls_cipher_suite"),
        tls_version=obj.text("tls_version"),
        tls_negotiated_protocol=obj.text("tls_negotiated_protocol"),
        tls_negotiated_protocol_is_mutual=obj.flag("tls_negotiated_protocol_is_mutual"),
        authed=obj.flag("authed"),
        auth_identity=obj.text("auth_identity"),
        auth_identity_url=obj.text("auth_identity_url"),
        pub_counts=tuple(
            PubCount(entry.text("topic"), entry.integer("count"))
            for entry in obj.objects("pub_counts")
        ),
    )


def _channel(obj: _Obj, topic: str, topic_depth: int) -> ChannelStats:
    clients = tuple(_client(c) for c in obj.objects("clients"))
    return ChannelStats(
        topic=topic,
        name=obj.name("channel_name"),
        depth=obj.integer("depth"),
        backend_depth=obj.integer("backend_depth"),
        in_flight_count=obj.integer("in_flight_count"),
        deferred_count=obj.integer("deferred_count"),
        message_count=obj.integer("message_count"),
        requeue_count=obj.integer("requeue_count"),
        timeout_count=obj.integer("timeout_count"),
        client_count=obj.integer("client_count", len(clients)),
        paused=obj.flag("paused"),
        clients=clients,
        e2e_latency=_latency(obj),
        topic_depth=topic_depth,
    )


def _topic(obj: _Obj) -> TopicStats:
    name = obj.name("topic_name")
    depth = obj.integer("depth")
    channels = tuple(_channel(c, name, depth) for c in obj.objects("channels"))
    return TopicStats(
        name=name,
        depth=depth,
        backend_depth=obj.integer("backend_depth"),
        message_count=obj.integer("message_count"),
        message_bytes=obj.integer("message_bytes"),
        paused=obj.flag("paused"),
        channels=tuple(sorted(channels, key=lambda c: c.name)),
        e2e_latency=_latency(obj),
    )


def _memory(obj: _Obj | None) -> MemoryStats | None:
    if obj is None:
        return None
    return MemoryStats(
        heap_objects=obj.integer("heap_objects"),
        heap_idle_bytes=obj.integer("heap_idle_bytes"),
        heap_in_use_bytes=obj.integer("heap_in_use_bytes"),
        heap_released_bytes=obj.integer("heap_released_bytes"),
        gc_pause_usec_100=obj.integer("gc_pause_usec_100"),
        gc_pause_usec_99=obj.integer("gc_pause_usec_99"),
        gc_pause_usec_95=obj.integer("gc_pause_usec_95"),
        next_gc_bytes=obj.integer("next_gc_bytes"),
        gc_total_runs=obj.integer("gc_total_runs"),
    )


def parse_nsqd_stats(body: bytes) -> NSQDStats:
    """``/stats?format=json`` as :class:`NSQDStats`; :class:`AdminResponseError` otherwise."""
    obj = _Obj(_document(body), "")
    topics = tuple(_topic(t) for t in obj.objects("topics"))
    return NSQDStats(
        version=obj.text("version"),
        health=obj.text("health", "OK"),
        start_time=obj.integer("start_time"),
        topics=tuple(sorted(topics, key=lambda t: t.name)),
        producers=tuple(_client(c) for c in obj.objects("producers")),
        memory=_memory(obj.optional("memory")),
    )


def parse_nsqd_info(body: bytes) -> NSQDInfo:
    """``/info`` of nsqd as :class:`NSQDInfo`."""
    obj = _Obj(_document(body), "")
    return NSQDInfo(
        version=obj.text("version"),
        broadcast_address=obj.text("broadcast_address"),
        hostname=obj.text("hostname"),
        http_port=obj.integer("http_port"),
        tcp_port=obj.integer("tcp_port"),
        start_time=obj.integer("start_time"),
        max_heartbeat_interval=_seconds(obj, "max_heartbeat_interval"),
        max_output_buffer_size=obj.integer("max_output_buffer_size"),
        max_output_buffer_timeout=_seconds(obj, "max_output_buffer_timeout"),
        max_deflate_level=obj.integer("max_deflate_level"),
    )


def parse_lookupd_info(body: bytes) -> LookupdInfo:
    """``/info`` of nsqlookupd as :class:`LookupdInfo`."""
    return LookupdInfo(_Obj(_document(body), "").text("version"))


def _names_parser(key: str) -> Callable[[bytes], tuple[str, ...]]:
    def parse(body: bytes) -> tuple[str, ...]:
        return tuple(sorted(set(_Obj(_document(body), "").strings(key))))

    return parse


def _producer_fields(obj: _Obj) -> dict[str, Any]:
    return {
        "remote_address": obj.text("remote_address"),
        "hostname": obj.text("hostname"),
        # nsqlookupd before 1.0 called it "address"
        "broadcast_address": obj.text("broadcast_address") or obj.text("address"),
        "tcp_port": obj.integer("tcp_port"),
        "http_port": obj.integer("http_port"),
        "version": obj.text("version"),
    }


def parse_lookupd_nodes(body: bytes) -> tuple[LookupdNode, ...]:
    """``/nodes`` as :class:`LookupdNode` entries, sorted by HTTP address."""
    nodes: list[LookupdNode] = []
    for entry in _Obj(_document(body), "").objects("producers"):
        topics = entry.strings("topics")
        flags = entry.array("tombstones")
        for i, flag in enumerate(flags):
            if not isinstance(flag, bool):
                raise AdminResponseError(f"tombstones[{i}]: expected true/false, got {_kind(flag)}")
        tombstoned = tuple(t for t, flag in zip(topics, flags, strict=False) if flag)
        nodes.append(
            LookupdNode(
                **_producer_fields(entry),
                topics=tuple(sorted(topics)),
                tombstoned_topics=tuple(sorted(tombstoned)),
            )
        )
    return tuple(sorted(nodes, key=lambda n: (n.http_address, n.tcp_port)))


def parse_topic_lookup(topic: str, body: bytes) -> TopicLookup:
    """``/lookup?topic=`` as :class:`TopicLookup` (producers sorted by HTTP address)."""
    obj = _Obj(_document(body), "")
    producers = [LookupdProducer(**_producer_fields(p)) for p in obj.objects("producers")]
    return TopicLookup(
        topic=topic,
        channels=tuple(sorted(set(obj.strings("channels")))),
        producers=tuple(sorted(producers, key=lambda p: (p.http_address, p.tcp_port))),
    )

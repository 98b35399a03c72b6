"""Each call of nsqd's and nsqlookupd's HTTP API as an :class:`AdminRequest`: the method and
target to send and how to read the answer. :class:`NSQDAPI` and :class:`LookupdAPI` build
them (names checked first, so a bad one raises before any IO); :class:`AdminEndpoint` is
where they go."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar
from urllib.parse import quote, urlsplit

from ..discovery import NSQDAddress, _join, _split_host_port
from ..errors import ConfigError
from ..http_client import HTTPAnswer
from ..names import validate_channel, validate_topic
from .answers import (
    ChannelStats,
    LookupdInfo,
    LookupdNode,
    LookupdProducer,
    NSQDInfo,
    NSQDStats,
    TopicLookup,
    TopicStats,
)
from .errors import AdminHTTPError, AdminResponseError, ChannelNotFound, TopicNotFound, http_error
from .parsing import (
    names_parser,
    parse_lookupd_info,
    parse_lookupd_nodes,
    parse_nsqd_info,
    parse_nsqd_stats,
    parse_topic_lookup,
)

__all__ = [
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_NSQD_HTTP_PORT",
    "NSQDAPI",
    "AdminEndpoint",
    "AdminRequest",
    "LookupdAPI",
]

DEFAULT_NSQD_HTTP_PORT = 4151
DEFAULT_LOOKUPD_HTTP_PORT = 4161

T = TypeVar("T")


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
        if "@" in parts.netloc:  # said without the URL: before "@" may be a password
            raise ConfigError(
                "an HTTP API address with a user or password is not supported (nsqd's and "
                "nsqlookupd's HTTP APIs have no authentication); give scheme://host:port only"
            )
        if parts.query or parts.fragment:
            raise ConfigError(f"HTTP API address {url!r}: no query or fragment allowed")
        tls = parts.scheme == "https"
        host, port = _split_host_port(parts.netloc, default_port, "HTTP API")
        try:
            host.encode("idna")
        except UnicodeError:
            raise ConfigError(f"HTTP API address {url!r}: bad host") from None
        if any(c.isspace() or c in "/\\" for c in host):
            raise ConfigError(f"HTTP API address {url!r}: bad host")
        # the path goes into every request line: percent-encoded, printable ASCII only
        prefix = quote(parts.path.rstrip("/"), safe="/%:@!$&'()*+,;=-._~")
        return cls(host, port, tls, prefix)


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
        return AdminRequest("GET", "/topics", (), names_parser("topics"))

    @staticmethod
    def channels(topic: str) -> AdminRequest[tuple[str, ...]]:
        """``GET /channels?topic=``: the topic's channels, sorted (none for an unknown topic)."""
        validate_topic(topic)
        return AdminRequest("GET", "/channels", _query(topic=topic), names_parser("channels"))

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

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
answer that is not what the API documents (not JSON, a wrong type anywhere) is an
:class:`AdminResponseError`. Parsing never raises anything else, whatever the JSON.

**Lag** (:attr:`ChannelStats.lag`) is what an operator means by "how far behind is this
consumer group on this nsqd": the messages published to the topic that the channel has not
finished yet, i.e. ``topic_depth + depth + in_flight_count + deferred_count`` (``depth``
already counts the channel's disk backlog, ``backend_depth``). See :class:`ChannelStats`.

One job per module: :mod:`.calls` (where and what to send: :class:`AdminEndpoint`,
:class:`AdminRequest`, :class:`NSQDAPI`, :class:`LookupdAPI`), :mod:`.answers` (the
dataclasses), :mod:`.parsing` (JSON into them, checked field by field), :mod:`.errors`.
"""

from __future__ import annotations

from ..http_client import DEFAULT_MAX_BODY_SIZE
from .answers import (
    ChannelStats,
    ClientStats,
    E2ELatency,
    LatencyPercentile,
    LookupdInfo,
    LookupdNode,
    LookupdProducer,
    MemoryStats,
    NSQDInfo,
    NSQDStats,
    PubCount,
    TopicLookup,
    TopicStats,
)
from .calls import (
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_NSQD_HTTP_PORT,
    NSQDAPI,
    AdminEndpoint,
    AdminRequest,
    LookupdAPI,
)
from .errors import (
    AdminHTTPError,
    AdminResponseError,
    ChannelNotFound,
    TopicNotFound,
    http_error,
)
from .parsing import (
    parse_lookupd_info,
    parse_lookupd_nodes,
    parse_nsqd_info,
    parse_nsqd_stats,
    parse_topic_lookup,
)

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

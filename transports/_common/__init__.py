"""What every client transport shares (anyio, trio, blocking), one module per job.

* :mod:`.addresses`: ``host:port`` and ``http(s)://`` URLs parsed and formatted.
* :mod:`.tls`: :class:`TLSOptions` and :func:`build_ssl_context`.
* :mod:`.options`: keyword arguments split onto :class:`~nsq_sansio.config.Config` and
  :class:`TransportOptions`; the transports' constants.
* :mod:`.stats`: the :class:`ConsumerStats` / :class:`ProducerStats` /
  :class:`ConnectionStats` snapshots.
* :mod:`.connection_log`: :class:`ConnectionLogger`, the ``[host:port]`` on every log line.
* :mod:`.http_publish`: nsqd's HTTP ``/pub`` and ``/mpub`` as bytes in and out (over
  :class:`~nsq_sansio.http_client.HTTPClient`), and when a request may be sent again.
* :mod:`.publishing`: the bounded set of checked topic names.
* :mod:`.failures`: why a connection or a publish failed, in one wording for every runtime.
* :mod:`.reports`: what the clients log, one level and text per event for every runtime.
* :mod:`.logs`: :func:`~.logs.fields`, the ``nsq_*`` extra fields every log record carries.
* :mod:`.handlers`: what a ``run()`` handler's return value means (FIN, REQ, or a TypeError
  logged), one rule for every runtime.
* :mod:`.message`: what a delivered message is (``MessageBase``), :class:`KeepaliveExpired`.
* :mod:`.drain`: :class:`DrainResult`, what ``drain()`` returns.
* :mod:`.arguments`: the checks of a user's arguments.

This package re-exports their names, so ``from transports._common import TLSOptions`` keeps
working. Nothing here opens a socket; ``build_ssl_context`` reads certificate files when
asked to.
"""

from __future__ import annotations

from .addresses import (
    DEFAULT_HTTP_PORT,
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_TCP_PORT,
    HTTPURL,
    format_address,
    parse_address,
    parse_http_url,
)
from .connection_log import ConnectionLogger
from .drain import DrainResult
from .http_publish import HTTPPublishClient, HTTPPublishError, PubResponse
from .options import (
    MAX_CONNECTIONS_PER_NSQD,
    READ_SIZE,
    TransportOptions,
    check_connections_per_nsqd,
    make_config,
    read_auth_secret,
    split_options,
)
from .publishing import TOPICS_REMEMBERED, remember_topic
from .stats import CONNECTION_STATES, ConnectionStats, ConsumerStats, ProducerStats
from .tls import TLSOptions, build_ssl_context

__all__ = [
    "CONNECTION_STATES",
    "DEFAULT_HTTP_PORT",
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_TCP_PORT",
    "HTTPURL",
    "MAX_CONNECTIONS_PER_NSQD",
    "READ_SIZE",
    "TOPICS_REMEMBERED",
    "ConnectionLogger",
    "ConnectionStats",
    "ConsumerStats",
    "DrainResult",
    "HTTPPublishClient",
    "HTTPPublishError",
    "ProducerStats",
    "PubResponse",
    "TLSOptions",
    "TransportOptions",
    "build_ssl_context",
    "check_connections_per_nsqd",
    "format_address",
    "make_config",
    "parse_address",
    "parse_http_url",
    "read_auth_secret",
    "remember_topic",
    "split_options",
]

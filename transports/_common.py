"""Pieces every transport shares (anyio, trio, blocking); light on IO and stable.

* :func:`parse_address` / :func:`format_address` / :func:`parse_http_url`: ``host:port`` and
  lookupd URLs.
* :class:`TLSOptions` and :func:`build_ssl_context`: an :class:`ssl.SSLContext` with
  verification on by default, a custom CA, a client certificate, and the server name to check.
* :func:`make_config`: keyword arguments mapped onto :class:`nsq_sansio.config.Config`.
* :class:`ConnectionStats` / :class:`ConsumerStats` / :class:`ProducerStats`: plain snapshots.
* :class:`ConnectionLogger`: a :class:`logging.LoggerAdapter` putting the connection address in
  every record (``record.nsq_address``, and ``[host:port]`` before the message).
* :class:`HTTPPublishClient`, :func:`build_pub_request`, :func:`parse_pub_response`: nsqd's
  HTTP ``/pub``, ``/mpub`` (binary) and deferred publish, as bytes in and bytes out over h11.

Nothing here opens a socket; ``build_ssl_context`` reads certificate files when asked to.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import struct
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import h11

from nsq_sansio.config import Config
from nsq_sansio.errors import ConfigError, NSQError

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_TCP_PORT",
    "HTTPURL",
    "READ_SIZE",
    "ConnectionLogger",
    "ConnectionStats",
    "ConsumerStats",
    "HTTPPublishClient",
    "HTTPPublishError",
    "ProducerStats",
    "PubResponse",
    "TLSOptions",
    "TransportOptions",
    "build_mpub_request",
    "build_pub_request",
    "build_ssl_context",
    "check_connections_per_nsqd",
    "format_address",
    "make_config",
    "parse_address",
    "parse_http_url",
    "parse_pub_response",
    "split_options",
]

DEFAULT_TCP_PORT = 4150
DEFAULT_HTTP_PORT = 4151
DEFAULT_LOOKUPD_HTTP_PORT = 4161
#: How much a transport asks the socket for per read.
READ_SIZE = 64 * 1024


#: The most TCP connections a producer opens to one nsqd (``connections_per_nsqd``).
MAX_CONNECTIONS_PER_NSQD = 64


def check_connections_per_nsqd(value: object) -> None:
    """A producer's ``connections_per_nsqd``: an int from 1 to 64 (ConfigError otherwise)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_CONNECTIONS_PER_NSQD
    ):
        raise ConfigError(
            f"connections_per_nsqd={value!r} must be an int from 1 to {MAX_CONNECTIONS_PER_NSQD}"
        )


# --- addresses -----------------------------------------------------------------------------


def parse_address(address: str, default_port: int = DEFAULT_TCP_PORT) -> tuple[str, int]:
    """``"host:port"``, ``"[v6]:port"``, ``"host"`` or ``("host", port)`` -> ``(host, port)``.

    Raises :class:`ValueError` for an empty host or a bad port.
    """
    if isinstance(address, tuple):
        host, port = address
        return _checked(str(host), int(port), repr(address))
    if not isinstance(address, str):
        raise ValueError(f"address must be 'host:port', got {address!r}")
    text = address.strip()
    if "://" in text:
        url = parse_http_url(text)
        return url.host, url.port
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError(f"invalid address {address!r}")
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:  # a bare host name, or a bare IPv6 literal
        host, port_text = text, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"invalid port in address {address!r}") from None
    return _checked(host, port, repr(address))


def _checked(host: str, port: int, what: str) -> tuple[str, int]:
    if not host:
        raise ValueError(f"no host in address {what}")
    if not 0 < port <= 65535:
        raise ValueError(f"port out of range 1..65535 in address {what}")
    return host, port


def format_address(host: str, port: int) -> str:
    """The inverse of :func:`parse_address` (brackets around IPv6 literals)."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class HTTPURL:
    """A parsed ``http(s)://host:port/path`` (the path without a trailing slash)."""

    scheme: str
    host: str
    port: int
    path: str = ""

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    @property
    def host_header(self) -> str:
        return self.address

    def target(self, path: str, query: Mapping[str, str] | None = None) -> str:
        """A request target under this URL's path, with a URL-encoded query string."""
        target = self.path + path
        if query:
            target += "?" + "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
        return target


def parse_http_url(url: str, default_port: int = DEFAULT_LOOKUPD_HTTP_PORT) -> HTTPURL:
    """``"http://127.0.0.1:4161"`` or bare ``"127.0.0.1:4161"`` -> :class:`HTTPURL`."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in {url!r} (use http:// or https://)")
    host = parts.hostname or ""
    try:
        port = parts.port or default_port
    except ValueError:
        raise ValueError(f"invalid port in URL {url!r}") from None
    host, port = _checked(host, port, repr(url))
    return HTTPURL(parts.scheme, host, port, parts.path.rstrip("/"))


# --- TLS -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """How to check nsqd's certificate and which one to present.

    ``verify`` is on by default: the server's chain is checked against the system store (or
    ``ca_file`` / ``ca_data``) and its name against ``server_name`` (default: the host
    connected to). ``ssl_context`` replaces everything else when given.
    """

    verify: bool = True
    ca_file: str | None = None
    ca_data: str | bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: str | None = None
    server_name: str | None = None
    ssl_context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        if self.ssl_context is not None:
            return self.ssl_context
        return build_ssl_context(
            verify=self.verify,
            ca_file=self.ca_file,
            ca_data=self.ca_data,
            cert_file=self.cert_file,
            key_file=self.key_file,
            key_password=self.key_password,
        )

    def server_hostname(self, host: str) -> str | None:
        """The name sent in SNI and checked against the certificate."""
        if self.server_name is not None:
            return self.server_name
        return host


def build_ssl_context(
    *,
    verify: bool = True,
    ca_file: str | None = None,
    ca_data: str | bytes | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    key_password: str | None = None,
) -> ssl.SSLContext:
    """A client-side context: TLS >= 1.2, chain and host name checked unless ``verify=False``.

    ``ca_file``/``ca_data`` replace the system trust store (a private CA); ``cert_file`` (and
    ``key_file`` when the key is separate) present a client certificate.
    """
    if ca_file is not None or ca_data is not None:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH,
            cafile=ca_file,
            cadata=ca_data.decode() if isinstance(ca_data, bytes) else ca_data,
        )
    else:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert_file is not None:
        context.load_cert_chain(cert_file, key_file, key_password)
    elif key_file is not None:
        raise ConfigError("key_file given without cert_file")
    return context


# --- configuration -------------------------------------------------------------------------

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))


def make_config(config: Config | None = None, **overrides: Any) -> Config:
    """``config`` (or the defaults) with keyword arguments applied; unknown names are errors.

    ``auth_secret`` may be given as ``str``; durations are seconds, like :class:`Config`.
    """
    unknown = sorted(set(overrides) - _CONFIG_FIELDS)
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; valid options are the Config fields: "
            + ", ".join(sorted(_CONFIG_FIELDS))
        )
    secret = overrides.get("auth_secret")
    if isinstance(secret, str):
        overrides["auth_secret"] = secret.encode()
    base = config if config is not None else Config()
    return base.replace(**overrides) if overrides else base


# --- stats ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One nsqd connection at the moment of the snapshot."""

    address: str
    state: str
    connected: bool
    rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    touched: int = 0
    reconnects: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer at the moment of the snapshot: totals plus one entry per connection."""

    topic: str
    channel: str
    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    taken_back: int = 0
    in_flight: int = 0
    rdy: int = 0
    max_in_flight: int = 0
    backoff_level: int = 0
    backoff_phase: str = "normal"
    reconnects: int = 0
    connection_errors: int = 0
    connections: tuple[ConnectionStats, ...] = ()

    @property
    def connected(self) -> int:
        return sum(1 for c in self.connections if c.connected)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer at the moment of the snapshot."""

    published: int = 0
    failed: int = 0
    pending: int = 0
    reconnects: int = 0
    connections: tuple[ConnectionStats, ...] = ()


# --- logging -------------------------------------------------------------------------------


class ConnectionLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefix every message with ``[address]`` and set ``record.nsq_address``.

    ``logger.with_address(addr)`` derives an adapter for another connection cheaply.
    """

    def __init__(self, logger: logging.Logger, address: str, **extra: Any) -> None:
        super().__init__(logger, {"nsq_address": address, **extra})
        self.address = address

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = dict(self.extra or {})
        extra.update(kwargs.get("extra") or {})
        kwargs["extra"] = extra
        return f"[{self.address}] {msg}", kwargs

    def with_address(self, address: str) -> ConnectionLogger:
        extra = {k: v for k, v in (self.extra or {}).items() if k != "nsq_address"}
        return ConnectionLogger(self.logger, address, **extra)


# --- HTTP publishing over h11 --------------------------------------------------------------


class HTTPPublishError(NSQError):
    """nsqd's HTTP API refused a publish: ``status`` and nsqd's ``message`` (``INVALID_TOPIC``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status} {message}".rstrip())
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class PubResponse:
    """An answer of nsqd's HTTP API to ``/pub`` or ``/mpub``."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = field(default=(), compare=False)
    keep_alive: bool = True

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """nsqd's error text: ``{"message": "..."}`` in v1, the plain body before."""
        text = self.body.decode("utf-8", "replace").strip()
        try:
            data = json.loads(text)
        except ValueError:
            return text
        if isinstance(data, dict) and isinstance(data.get("message"), str):
            return str(data["message"])
        return text

    def raise_for_status(self) -> None:
        if not self.ok:
            raise HTTPPublishError(self.status, self.message)


class HTTPPublishClient:
    """A sans-IO keep-alive HTTP client for nsqd's publish endpoints (one request at a time).

    ``pub()`` / ``mpub()`` return the bytes of a request to write; feed what the socket reads
    to ``receive_data()`` (``b""`` at EOF) until it returns a :class:`PubResponse`. When the
    response says ``keep_alive`` the same client (and socket) can send the next request.
    """

    def __init__(self, host: str, path_prefix: str = "", user_agent: str | None = None) -> None:
        self._host = host.encode("idna") if not host.isascii() else host.encode()
        self._prefix = path_prefix.rstrip("/")
        self._user_agent = (user_agent or "nsq-sansio").encode()
        self._conn = h11.Connection(h11.CLIENT)
        self._status = 0
        self._headers: tuple[tuple[bytes, bytes], ...] = ()
        self._body: list[bytes] = []

    def _request(self, target: str, body: bytes) -> bytes:
        if self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE:
            self._conn.start_next_cycle()
        if self._conn.our_state is not h11.IDLE:
            raise RuntimeError("the previous request has not been answered yet")
        headers = [
            (b"Host", self._host),
            (b"User-Agent", self._user_agent),
            (b"Content-Length", str(len(body)).encode()),
            (b"Content-Type", b"application/octet-stream"),
        ]
        request = h11.Request(
            method="POST", target=(self._prefix + target).encode(), headers=headers
        )
        data = self._conn.send(request) or b""
        data += self._conn.send(h11.Data(data=body)) or b""
        data += self._conn.send(h11.EndOfMessage()) or b""
        self._status = 0
        self._body = []
        return data

    def pub(self, topic: str, body: bytes, *, defer: float | None = None) -> bytes:
        """``POST /pub?topic=...[&defer=ms]``."""
        target = f"/pub?topic={quote(topic, safe='')}"
        if defer is not None:
            if not defer >= 0:
                raise ValueError(f"defer must be >= 0 seconds, got {defer!r}")
            target += f"&defer={round(defer * 1000)}"
        return self._request(target, body)

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> bytes:
        """``POST /mpub?topic=...&binary=true``: bodies are length-prefixed, so any byte goes."""
        if not bodies:
            raise ValueError("mpub needs at least one body")
        parts = [struct.pack(">i", len(bodies))]
        for body in bodies:
            parts.append(struct.pack(">i", len(body)))
            parts.append(body)
        return self._request(f"/mpub?topic={quote(topic, safe='')}&binary=true", b"".join(parts))

    def receive_data(self, data: bytes) -> PubResponse | None:
        """Feed response bytes; returns the response once complete. Raises
        :class:`~nsq_sansio.errors.ProtocolError` for a broken answer or EOF mid-answer."""
        from nsq_sansio.errors import ConnectionLost, ProtocolError

        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise ConnectionLost("nsqd closed the HTTP connection mid-answer")
                    return None
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                    self._headers = tuple((bytes(k), bytes(v)) for k, v in event.headers)
                elif isinstance(event, h11.Data):
                    self._body.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    keep = self._conn.our_state is h11.DONE and self._conn.their_state is h11.DONE
                    return PubResponse(self._status, b"".join(self._body), self._headers, keep)
                elif isinstance(event, h11.ConnectionClosed):
                    raise ConnectionLost("nsqd closed the HTTP connection mid-answer")
        except h11.RemoteProtocolError as exc:
            if not data:
                raise ConnectionLost("nsqd closed the HTTP connection mid-answer") from exc
            raise ProtocolError(f"bad HTTP answer from nsqd: {exc}") from exc


def build_pub_request(
    host: str, topic: str, body: bytes, *, defer: float | None = None
) -> tuple[HTTPPublishClient, bytes]:
    """A fresh client and the bytes of one ``/pub`` request (deferred when ``defer`` is set)."""
    client = HTTPPublishClient(host)
    return client, client.pub(topic, body, defer=defer)


def build_mpub_request(
    host: str, topic: str, bodies: Sequence[bytes]
) -> tuple[HTTPPublishClient, bytes]:
    """A fresh client and the bytes of one binary ``/mpub`` request."""
    client = HTTPPublishClient(host)
    return client, client.mpub(topic, bodies)


def parse_pub_response(client: HTTPPublishClient, data: bytes) -> PubResponse | None:
    """Feed ``data`` to ``client``; the response when complete, else None."""
    return client.receive_data(data)


# --- transport options ---------------------------------------------------------------------

_TLS_FLAT = {
    "ssl_context": "ssl_context",
    "tls_ca_file": "ca_file",
    "tls_ca_data": "ca_data",
    "tls_cert_file": "cert_file",
    "tls_key_file": "key_file",
    "tls_key_password": "key_password",
    "tls_server_name": "server_name",
    "tls_verify": "verify",
}


@dataclass(frozen=True)
class TransportOptions:
    """What a transport itself needs (the protocol's knobs live in :class:`Config`)."""

    connect_timeout: float = 5.0
    tls: TLSOptions = field(default_factory=TLSOptions)
    _context: list[ssl.SSLContext] = field(default_factory=list, repr=False, compare=False)

    def ssl_context(self) -> ssl.SSLContext:
        """The client context (built once, shared by every connection)."""
        if not self._context:
            self._context.append(self.tls.context())
        return self._context[0]


def split_options(
    config: Config | None, kwargs: Mapping[str, Any]
) -> tuple[Config, TransportOptions]:
    """Keyword arguments -> (Config, TransportOptions).

    Config field names go to the config; ``connect_timeout``, ``tls=TLSOptions(...)`` or the
    flat ``ssl_context``/``tls_ca_file``/``tls_ca_data``/``tls_cert_file``/``tls_key_file``/
    ``tls_key_password``/``tls_server_name``/``tls_verify`` are transport options. Giving any
    TLS option turns ``tls_v1`` on (verification stays on unless ``tls_verify=False``).
    """
    config_changes: dict[str, Any] = {}
    tls_changes: dict[str, Any] = {}
    tls: TLSOptions | None = None
    connect_timeout = 5.0
    for name, value in kwargs.items():
        if name == "connect_timeout":  # both: the TCP connect, and the core's handshake deadline
            connect_timeout = float(value)
            if "connect_timeout" in _CONFIG_FIELDS:
                config_changes[name] = value
        elif name in _CONFIG_FIELDS:
            config_changes[name] = value
        elif name in _TLS_FLAT:
            tls_changes[_TLS_FLAT[name]] = value
        elif name == "tls":
            if value is True:
                tls = TLSOptions()
            elif isinstance(value, TLSOptions):
                tls = value
            elif isinstance(value, ssl.SSLContext):
                tls = TLSOptions(ssl_context=value)
            else:
                raise ConfigError(f"tls must be True, a TLSOptions or an SSLContext, got {value!r}")
        else:
            raise ConfigError(
                f"unknown option {name!r}: not a Config field nor a transport option "
                f"(connect_timeout, tls, {', '.join(sorted(_TLS_FLAT))})"
            )
    if not connect_timeout > 0:
        raise ConfigError(f"connect_timeout={connect_timeout!r} must be > 0 seconds")
    if tls is not None and tls_changes:
        raise ConfigError("give either tls=TLSOptions(...) or the flat tls_* options, not both")
    if tls_changes:
        tls = TLSOptions(**tls_changes)
    if tls is not None:
        config_changes.setdefault("tls_v1", True)
    return make_config(config, **config_changes), TransportOptions(
        connect_timeout, tls if tls is not None else TLSOptions()
    )

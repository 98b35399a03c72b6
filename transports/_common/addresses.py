"""Where nsqd and nsqlookupd are: ``host:port`` and ``http(s)://`` URLs, parsed and formatted.

Every transport and the command line take addresses in the same forms (``"host:port"``,
``"[v6]:port"``, a bare host, a ``(host, port)`` tuple, a lookupd or nsqd HTTP URL); this
module turns them into ``(host, port)`` or an :class:`HTTPURL` and back, with clear
:class:`ValueError` messages for what does not parse.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_LOOKUPD_HTTP_PORT",
    "DEFAULT_TCP_PORT",
    "HTTPURL",
    "format_address",
    "parse_address",
    "parse_http_url",
]

DEFAULT_TCP_PORT = 4150
DEFAULT_HTTP_PORT = 4151
DEFAULT_LOOKUPD_HTTP_PORT = 4161


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
    if "@" in parts.netloc:  # said without the URL: what is before "@" may be a password
        raise ValueError(
            "a user or password in an nsqd/nsqlookupd URL is not supported (nsqd's HTTP API "
            "has no authentication); give scheme://host:port only"
        )
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"unsupported URL scheme in {url!r} (use http:// or https://)")
    host = parts.hostname or ""
    try:
        port = parts.port or default_port
    except ValueError:
        raise ValueError(f"invalid port in URL {url!r}") from None
    host, port = _checked(host, port, repr(url))
    return HTTPURL(parts.scheme, host, port, parts.path.rstrip("/"))

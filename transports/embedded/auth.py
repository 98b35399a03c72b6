"""nsqd's ``--auth-http-address``: ask an HTTP auth server about a client's AUTH secret.

The request is nsqd's: ``GET /auth?remote_ip=<ip>&tls=<true|false>&secret=<secret>``; the
answer is JSON::

    {"ttl": 3600, "identity": "alice", "identity_url": "https://...",
     "authorizations": [{"permissions": ["subscribe", "publish"],
                         "topic": ".*", "channels": [".*"]}]}

An address is ``host:port`` (then ``http://host:port/auth`` is asked, as nsqd does) or a full
``http://`` / ``https://`` URL (asked as given, with the parameters appended). Several
addresses are tried in turn from a random one, like nsqd's ``QueryAnyAuthd``; when none
answers 200 with a valid document the client gets ``E_AUTH_FAILED``: any failure of the
exchange (no answer, a timeout, garbage, JSON nested too deeply, an answer over
:data:`MAX_ANSWER` bytes) is logged without the secret and refused, never raised. HTTP is
spoken with h11 over anyio sockets, one short-lived connection per query, the whole of it
within the timeout.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, quote_plus, urlencode, urlsplit

import anyio
import anyio.abc
import h11

from nsq_sansio.server.options import (
    MAX_PATTERN_LENGTH,
    Authorization,
    AuthRequest,
    AuthState,
    grant_pattern,
)
from transports._common.logs import fields

from ._net import format_address, parse_address, read_http_answer

__all__ = ["AuthServerError", "AuthURL", "parse_auth_address", "parse_auth_state", "query_auth"]

_log = logging.getLogger("nsq_sansio.embedded.nsqd")

#: An auth server's answer is small; a bigger one is refused.
MAX_ANSWER = 1 << 20
#: The shortest TTL honoured: a TTL of 0 would have the server re-asked without pause.
MIN_TTL = 1.0
_PERMISSIONS = frozenset({"subscribe", "publish"})


class AuthServerError(Exception):
    """The auth server could not be asked, or gave an answer nsqd would not accept."""


_QUERY_ERRORS = (
    AuthServerError,
    OSError,  # ssl.SSLError too
    TimeoutError,
    h11.ProtocolError,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    ValueError,
)


@dataclass(frozen=True, slots=True)
class AuthURL:
    """Where to ask: the query of ``target`` (a token, maybe) is left out of ``repr``."""

    scheme: str
    host: str
    port: int
    target: str = field(repr=False)  # path and query, parameters are appended

    @property
    def netloc(self) -> str:
        return format_address(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.netloc}{self.target.split('?', 1)[0]}"


def parse_auth_address(address: str) -> AuthURL:
    """``host:port`` or ``http(s)://host[:port][/path]`` -> :class:`AuthURL`. An error names
    the address without its credentials and query."""
    if "://" not in address:
        try:
            host, port = parse_address(address)
        except ValueError:
            raise ValueError(f"auth HTTP address {_shown(address)!r}: invalid port") from None
        if not port:
            raise ValueError(f"auth HTTP address {_shown(address)!r} needs a port")
        return AuthURL("http", host, port, "/auth")
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"auth HTTP address {_shown(address)!r}: expected http(s)://host[:port]/path"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ValueError(f"auth HTTP address {_shown(address)!r}: {exc}") from None
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return AuthURL(parts.scheme, parts.hostname, port, target)


def _shown(address: str) -> str:
    """An address as errors show it: no ``user:password@``, no query, no fragment."""
    address = address.split("?", 1)[0].split("#", 1)[0]
    scheme, sep, rest = address.rpartition("://")
    return scheme + sep + rest.rpartition("@")[2]


def parse_auth_state(document: Any) -> AuthState:
    """nsqd's checks on an auth server's JSON answer."""
    if not isinstance(document, dict):
        raise AuthServerError("auth answer is not a JSON object")
    grants: list[Authorization] = []
    raw_grants = document.get("authorizations") or []
    if not isinstance(raw_grants, list):
        raise AuthServerError("auth answer: authorizations is not a list")
    for raw in raw_grants:
        if not isinstance(raw, dict):
            raise AuthServerError("auth answer: an authorization is not an object")
        topic = raw.get("topic", "")
        channels = raw.get("channels") or []
        permissions = raw.get("permissions") or []
        if not isinstance(topic, str) or not isinstance(channels, list):
            raise AuthServerError("auth answer: bad topic or channels")
        if not all(isinstance(c, str) for c in channels):
            raise AuthServerError("auth answer: channels must be strings")
        if not isinstance(permissions, list) or not all(p in _PERMISSIONS for p in permissions):
            raise AuthServerError(f"auth answer: unknown permission in {permissions!r}")
        grants.append(Authorization(topic, tuple(channels), tuple(permissions)))
    ttl = document.get("ttl", 0)
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise AuthServerError(f"auth answer: bad ttl {ttl!r}")
    identity = document.get("identity", "")
    identity_url = document.get("identity_url", "")
    if not isinstance(identity, str) or not isinstance(identity_url, str):
        raise AuthServerError("auth answer: identity and identity_url must be strings")
    return AuthState(
        identity=identity,
        identity_url=identity_url,
        authorizations=tuple(grants),
        ttl=max(float(ttl), MIN_TTL),
    )


async def query_auth(
    urls: Sequence[AuthURL],
    request: AuthRequest,
    *,
    timeout: float = 5.0,
    connect_timeout: float = 2.0,
    rng: random.Random | None = None,
) -> AuthState | None:
    """Ask the auth servers in turn (from a random one); None when none gave an answer."""
    if not urls:
        return None
    start = (rng or random).randrange(len(urls))
    for i in range(len(urls)):
        url = urls[(start + i) % len(urls)]
        try:
            return await _query_one(url, request, timeout, connect_timeout)
        except Exception as exc:  # any failure of the exchange: E_AUTH_FAILED, never a crash
            text = _describe(exc, request.secret)
            _log.warning("nsqd: auth server %s: %s", url.netloc, text, extra=fields(error=text))
    return None


def _describe(exc: BaseException, secret: str) -> str:
    """An error for the log: short, and without the secret (an auth server may echo it)."""
    if isinstance(exc, _QUERY_ERRORS):
        text = str(exc) or type(exc).__name__
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = text[:300]
    if secret:
        for form in {secret, quote(secret, safe=""), quote_plus(secret)}:
            text = text.replace(form, "<secret>")
    return text


async def _query_one(
    url: AuthURL, request: AuthRequest, timeout: float, connect_timeout: float
) -> AuthState:
    params = urlencode(
        {
            "remote_ip": request.remote_ip,
            "tls": "true" if request.tls else "false",
            "secret": request.secret,
        }
    )
    target = url.target + ("&" if "?" in url.target else "?") + params
    with anyio.fail_after(connect_timeout):
        stream: anyio.abc.ByteStream
        if url.scheme == "https":
            stream = await anyio.connect_tcp(
                url.host, url.port, tls=True, ssl_context=ssl.create_default_context()
            )
        else:
            stream = await anyio.connect_tcp(url.host, url.port)
    async with stream:
        with anyio.fail_after(timeout):
            conn = h11.Connection(h11.CLIENT)
            headers = [
                ("Host", url.netloc),
                ("Accept", "application/json"),
                ("User-Agent", "nsq-sansio-embedded-nsqd"),
                ("Connection", "close"),
            ]
            out = conn.send(h11.Request(method="GET", target=target, headers=headers)) or b""
            out += conn.send(h11.EndOfMessage()) or b""
            await stream.send(out)
            status, body = await read_http_answer(
                stream, conn, limit=MAX_ANSWER, error=AuthServerError
            )
    if status != 200:
        raise AuthServerError(f"answered HTTP {status}")
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise AuthServerError(f"answer is not JSON: {exc}") from None
    except RecursionError:
        raise AuthServerError("answer is JSON nested too deeply") from None
    state = parse_auth_state(document)
    for grant in state.authorizations:
        for pattern in (grant.topic, *grant.channels):
            if grant_pattern(pattern) is None:
                _log.warning(
                    "nsqd: auth server %s: pattern %.80r is not used (invalid, longer than "
                    "%d characters, or it could backtrack without end; see grant_pattern)",
                    url.netloc,
                    pattern,
                    MAX_PATTERN_LENGTH,
                )
    return state

"""A small HTTP/1.1 server loop over h11 for the embedded nsqd and nsqlookupd APIs.

One coroutine per connection: parse a request with h11, read the body up to a limit (never
more), call the handler, write its answer, and keep the connection alive when both sides
allow it. Framing is h11's (0.16 or later: earlier ones accepted malformed chunk endings,
CVE-2025-43859): a request h11 cannot frame exactly is refused and the connection closed,
as is one framed by both Transfer-Encoding and Content-Length once answered. The limits a
listener shares (connections, a whole-request deadline, request bodies held at once) are
:class:`HTTPLimits`. Answers follow modern nsqd (v1.x): the JSON document itself, without the old
``{"status_code":..,"status_txt":..,"data":..}`` envelope; errors are
``{"message": "TOPIC_NOT_FOUND"}`` with the matching status code.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import h11

__all__ = [
    "HTTPLimits",
    "HTTPRequest",
    "HTTPResponse",
    "Handler",
    "error_response",
    "json_response",
    "method_not_routed",
    "plain_text_response",
    "serve_http_connection",
    "text_response",
]

_NSQ_CONTENT_TYPE = (b"X-NSQ-Content-Type", b"nsq; version=1.0")


@dataclass(frozen=True, slots=True)
class HTTPRequest:
    """A parsed request; ``body_too_large`` is set when the body passed ``max_body``."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: list[tuple[bytes, bytes]]
    body: bytes
    body_too_large: bool = False

    def arg(self, name: str) -> str | None:
        """First value of a query parameter, None when absent (like Go's ``Query()[name][0]``)."""
        values = self.query.get(name)
        return values[0] if values else None

    def has_arg(self, name: str) -> bool:
        return name in self.query

    def header(self, name: bytes) -> bytes | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


@dataclass(frozen=True, slots=True)
class HTTPResponse:
    """What a handler answers."""

    status: int
    body: bytes
    content_type: bytes | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


Handler = Callable[[HTTPRequest], Awaitable[HTTPResponse]]


def json_response(data: Any, status: int = 200) -> HTTPResponse:
    """A JSON document, as nsqd's ``RespondV1`` writes it (``bytes`` are sent as they are:
    a document nsqd writes by hand)."""
    body = data if isinstance(data, bytes) else json.dumps(data, separators=(",", ":")).encode()
    return HTTPResponse(status, body, b"application/json; charset=utf-8", [_NSQ_CONTENT_TYPE])


def text_response(text: str | bytes, status: int = 200) -> HTTPResponse:
    """A plain body (``OK``), as nsqd answers ``/ping`` and ``/pub``."""
    body = text.encode() if isinstance(text, str) else text
    return HTTPResponse(status, body, b"text/plain; charset=utf-8", [_NSQ_CONTENT_TYPE])


def plain_text_response(text: str, status: int = 200) -> HTTPResponse:
    """A bare text answer without nsq's content-type header (nsqd's and nsqlookupd's /ping)."""
    return HTTPResponse(status, text.encode(), b"text/plain; charset=utf-8")


def method_not_routed(
    routes: Mapping[str, frozenset[str]], request: HTTPRequest
) -> HTTPResponse | None:
    """What nsqd's router (httprouter) answers before any handler runs, or ``None`` when the
    handler should: 404 for an unknown path; for a known one, ``OPTIONS`` gets an empty 200
    with the ``Allow`` list and any other method it does not route gets 405 with it (``HEAD``
    too: nsqd routes ``GET`` only)."""
    allowed = routes.get(request.path)
    if allowed is None:
        return error_response(404, "NOT_FOUND")
    if request.method in allowed:
        return None
    allow = (b"Allow", ", ".join(sorted(allowed | {"OPTIONS"})).encode())
    if request.method == "OPTIONS":
        return HTTPResponse(200, b"", None, [allow])
    refused = error_response(405, "METHOD_NOT_ALLOWED")
    return HTTPResponse(405, refused.body, refused.content_type, [allow, _NSQ_CONTENT_TYPE])


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def empty_response() -> HTTPResponse:
    """200 with an empty body, what nsqd's admin POSTs answer."""
    return HTTPResponse(200, b"", None, [_NSQ_CONTENT_TYPE])


def error_response(status: int, message: str) -> HTTPResponse:
    """``{"message": "..."}`` with ``status``."""
    return json_response({"message": message}, status)


async def _send(stream: anyio.abc.ByteStream, conn: h11.Connection, event: Any) -> None:
    data = conn.send(event)
    if data:
        await stream.send(data)


async def _respond(
    stream: anyio.abc.ByteStream,
    conn: h11.Connection,
    response: HTTPResponse,
    close: bool,
    head_only: bool = False,
) -> None:
    headers: list[tuple[bytes, bytes]] = [
        (b"Content-Length", str(len(response.body)).encode()),
        *response.headers,
    ]
    if response.content_type is not None:
        headers.append((b"Content-Type", response.content_type))
    if close:
        headers.append((b"Connection", b"close"))
    response_head = h11.Response(
        status_code=response.status, headers=headers, reason=_reason(response.status)
    )
    await _send(stream, conn, response_head)
    if response.body and not head_only:
        await _send(stream, conn, h11.Data(data=response.body))
    await _send(stream, conn, h11.EndOfMessage())


class HTTPLimits:
    """What one HTTP listener lets its clients hold, shared by all its connections.

    nsqd's HTTP server (Go's net/http as nsqd configures it) has no limits of its own; this
    server runs on one event loop, so it keeps a few: ``max_connections`` open at once (the
    next one is answered 503 and closed), ``request_timeout`` seconds from a request's first
    byte to the end of its body (a client trickling a byte every few seconds is cut off,
    whatever the idle timeout per read), and ``max_body_bytes`` of request bodies being read
    at once across connections (a request that would pass it is answered 503 and closed), so
    stalled uploads cannot pile up ``max_connections`` times the largest body in memory.
    """

    __slots__ = (
        "body_bytes",
        "connections",
        "max_body_bytes",
        "max_connections",
        "request_timeout",
    )

    def __init__(
        self,
        *,
        max_connections: int = 256,
        request_timeout: float = 30.0,
        max_body_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        if max_connections < 1 or request_timeout <= 0 or max_body_bytes < 1:
            raise ValueError("HTTPLimits: every limit must be positive")
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_body_bytes = max_body_bytes
        self.connections = 0
        self.body_bytes = 0


class _BodyBudgetExceeded(Exception):
    """The bodies being read on this listener would pass ``HTTPLimits.max_body_bytes``."""


_BUSY = error_response(503, "TOO_MANY_REQUESTS")


async def serve_http_connection(
    stream: anyio.abc.ByteStream,
    handler: Handler,
    *,
    max_body: int,
    max_header_size: int = 64 * 1024,
    idle_timeout: float = 60.0,
    limits: HTTPLimits | None = None,
) -> None:
    """Serve requests on one connection until the peer or an error closes it (or a limit of
    ``limits`` does: a fresh :class:`HTTPLimits` when none is shared)."""
    limits = limits if limits is not None else HTTPLimits()
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_size)
    if limits.connections >= limits.max_connections:
        with contextlib.suppress(Exception):
            with anyio.move_on_after(1.0):
                await _respond(stream, conn, _BUSY, True)
        await _aclose_quietly(stream)
        return
    limits.connections += 1
    try:
        while True:
            try:
                request = await _read_request(stream, conn, max_body, idle_timeout, limits)
            except h11.RemoteProtocolError as err:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    status = err.error_status_hint
                    await _respond(stream, conn, error_response(status, "INVALID_REQUEST"), True)
                return
            except _BodyBudgetExceeded:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _respond(stream, conn, _BUSY, True)
                return
            if request is None:
                return
            try:
                response = await handler(request)
            except Exception:  # a handler bug must not kill the server
                response = error_response(500, "INTERNAL_ERROR")
            # A body framed by both Transfer-Encoding and Content-Length is read as chunked (h11,
            # as RFC 9112 says) and the connection closed after the answer, since a proxy in
            # front may have framed it the other way: what follows could be smuggled.
            close = (
                request.body_too_large
                or conn.their_state is not h11.DONE
                or (
                    request.header(b"transfer-encoding") is not None
                    and request.header(b"content-length") is not None
                )
            )
            # a client that does not read its answer is not waited for without end either
            with anyio.move_on_after(limits.request_timeout) as sending:
                await _respond(stream, conn, response, close, request.method == "HEAD")
            if sending.cancelled_caught or close or conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
        return
    except h11.LocalProtocolError:
        return
    finally:
        limits.connections -= 1
        await _aclose_quietly(stream)


async def _aclose_quietly(stream: anyio.abc.ByteStream) -> None:
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            await stream.aclose()


async def _read_request(
    stream: anyio.abc.ByteStream,
    conn: h11.Connection,
    max_body: int,
    idle_timeout: float,
    limits: HTTPLimits,
) -> HTTPRequest | None:
    """The next request, body read up to ``max_body`` (never more): ``None`` when the peer
    closed, stayed idle ``idle_timeout`` between reads, or took longer than the whole-request
    deadline from its first byte."""
    head: h11.Request | None = None
    body = bytearray()
    too_large = False
    deadline = math.inf  # set when the request's first byte is here
    if conn.trailing_data[0]:
        deadline = anyio.current_time() + limits.request_timeout
    reserved = 0
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                now = anyio.current_time()
                if now >= deadline:
                    return None  # the whole request took too long
                with anyio.move_on_after(min(idle_timeout, deadline - now)):
                    try:
                        data = await stream.receive(65536)
                    except anyio.EndOfStream:
                        data = b""
                    if data and deadline == math.inf:
                        deadline = anyio.current_time() + limits.request_timeout
                    conn.receive_data(data)
                    continue
                return None  # idle for too long, or past the deadline
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
                if conn.they_are_waiting_for_100_continue:  # curl -d @file sends Expect
                    await _send(
                        stream, conn, h11.InformationalResponse(status_code=100, headers=[])
                    )
            elif isinstance(event, h11.Data):
                kept = min(len(event.data), max_body + 1 - len(body))
                if limits.body_bytes + kept > limits.max_body_bytes:
                    raise _BodyBudgetExceeded
                limits.body_bytes += kept
                reserved += kept
                body += event.data[:kept]
                if len(body) > max_body:
                    too_large = True
                    del body[max_body + 1 :]
                    break
            elif isinstance(event, h11.EndOfMessage):
                break
            elif event is h11.PAUSED:
                return None
    finally:
        limits.body_bytes -= reserved
    if head is None:  # h11 always yields Request first; be defensive anyway
        return None
    target = head.target.decode("latin-1")
    parts = urlsplit(target)
    return HTTPRequest(
        method=head.method.decode("latin-1").upper(),
        path=parts.path,
        query=parse_qs(parts.query, keep_blank_values=True),
        headers=[(bytes(k), bytes(v)) for k, v in head.headers],
        body=bytes(body),
        body_too_large=too_large,
    )

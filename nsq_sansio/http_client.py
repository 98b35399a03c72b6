"""One HTTP/1.1 client connection over h11, sans-IO: request bytes out, a bounded answer in.

:class:`HTTPClient` is what a transport drives to talk to nsqd's or nsqlookupd's HTTP API:
:meth:`HTTPClient.request` returns the bytes of a request to write, :meth:`HTTPClient.receive_data`
takes what the socket read (``b""`` at EOF) and returns an :class:`HTTPAnswer` once the answer
is complete. One request at a time; when the answer allows it (``keep_alive``) the same
connection sends the next one.

Everything read is bounded, so a hostile or broken server cannot take the process's memory:
the status line and headers by ``max_header_size`` (h11's limit), the body by
``max_body_size`` (checked against ``Content-Length`` before any of it arrives, and against
what has arrived for chunked or close-delimited bodies). A broken answer raises
:class:`~nsq_sansio.errors.RemoteProtocolError`, an answer cut short by EOF
:class:`~nsq_sansio.errors.ConnectionLost`; after either the connection must be closed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h11

from .errors import ConfigError, ConnectionLost, LocalProtocolError, RemoteProtocolError

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_HEADER_SIZE",
    "HTTPAnswer",
    "HTTPClient",
]

#: Largest answer body accepted by default (a /stats of thousands of channels fits).
DEFAULT_MAX_BODY_SIZE = 16 * 1024 * 1024
#: Largest status line plus headers accepted by default.
DEFAULT_MAX_HEADER_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class HTTPAnswer:
    """A complete HTTP answer: status, body, headers (lower-cased names) and reusability."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = field(default=(), compare=False)
    #: True when the connection may carry the next request.
    keep_alive: bool = True

    @property
    def ok(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status < 300


class HTTPClient:
    """The client side of one HTTP/1.1 connection (h11), one request at a time."""

    __slots__ = (
        "_body",
        "_conn",
        "_header_host",
        "_headers",
        "_max_body_size",
        "_started",
        "_status",
        "_user_agent",
    )

    def __init__(
        self,
        host_header: str,
        *,
        max_body_size: int = DEFAULT_MAX_BODY_SIZE,
        max_header_size: int = DEFAULT_MAX_HEADER_SIZE,
        user_agent: str = "nsq-sansio",
    ) -> None:
        if max_body_size < 0:
            raise ConfigError(f"max_body_size must be >= 0, got {max_body_size}")
        if max_header_size <= 0:
            raise ConfigError(f"max_header_size must be > 0, got {max_header_size}")
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_header_size)
        self._header_host = (
            host_header.encode("idna") if not host_header.isascii() else (host_header.encode())
        )
        self._user_agent = user_agent.encode("ascii", "replace")
        self._max_body_size = max_body_size
        self._status = 0
        self._headers: tuple[tuple[bytes, bytes], ...] = ()
        self._body = bytearray()
        self._started = False

    @property
    def answer_started(self) -> bool:
        """Whether any byte of the current answer arrived (a failure before that means the
        server most likely never saw the request, e.g. a kept-alive connection it had closed)."""
        return self._started

    @property
    def idle(self) -> bool:
        """Whether a request can be sent now (nothing outstanding, the connection usable)."""
        conn = self._conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            return True
        return conn.our_state is h11.IDLE and conn.their_state is h11.IDLE

    def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        *,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> bytes:
        """The bytes of one request (``Content-Length`` always set); raises
        :class:`~nsq_sansio.errors.LocalProtocolError` while an answer is outstanding."""
        conn = self._conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        if conn.our_state is not h11.IDLE or conn.their_state is not h11.IDLE:
            raise LocalProtocolError(
                f"cannot send a request now (client {conn.our_state}, server {conn.their_state})"
            )
        all_headers: list[tuple[bytes, bytes]] = [
            (b"Host", self._header_host),
            (b"User-Agent", self._user_agent),
            (b"Accept", b"application/vnd.nsq; version=1.0"),
            (b"Content-Length", str(len(body)).encode()),
        ]
        all_headers.extend((k.encode(), v.encode()) for k, v in headers)
        try:
            out = conn.send(h11.Request(method=method, target=target, headers=all_headers)) or b""
            if body:
                out += conn.send(h11.Data(data=body)) or b""
            out += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot send {method} {target!r}: {exc}") from exc
        self._status = 0
        self._headers = ()
        self._body = bytearray()
        self._started = False
        return out

    def receive_data(self, data: bytes) -> HTTPAnswer | None:
        """Feed bytes read (``b""`` at EOF); the answer once complete, else None."""
        if data:
            self._started = True
        try:
            self._conn.receive_data(data)
            while True:
                event = self._conn.next_event()
                if event is h11.NEED_DATA:
                    if not data:
                        raise ConnectionLost("the server closed the connection mid-answer")
                    return None
                if isinstance(event, h11.InformationalResponse):
                    continue
                if isinstance(event, h11.Response):
                    self._status = event.status_code
                    self._headers = tuple((bytes(k), bytes(v)) for k, v in event.headers)
                    self._check_length(self._headers)
                elif isinstance(event, h11.Data):
                    self._body += event.data
                    if len(self._body) > self._max_body_size:
                        self._body = bytearray()
                        raise RemoteProtocolError(
                            f"HTTP answer body over {self._max_body_size} bytes"
                        )
                elif isinstance(event, h11.EndOfMessage):
                    conn = self._conn
                    keep = conn.our_state is h11.DONE and conn.their_state is h11.DONE
                    # bytes after the answer belong to no request: never read them as the
                    # answer to the next one
                    keep = keep and not conn.trailing_data[0]
                    body, self._body = bytes(self._body), bytearray()
                    return HTTPAnswer(self._status, body, self._headers, keep)
                else:  # ConnectionClosed (or PAUSED) before the end of the answer
                    raise ConnectionLost("the server closed the connection mid-answer")
        except h11.RemoteProtocolError as exc:
            if not data:
                raise ConnectionLost("the server closed the connection mid-answer") from exc
            raise RemoteProtocolError(f"broken HTTP answer: {exc}") from exc

    def _check_length(self, headers: tuple[tuple[bytes, bytes], ...]) -> None:
        for name, value in headers:
            if name == b"content-length" and int(value) > self._max_body_size:
                raise RemoteProtocolError(
                    f"HTTP answer announces {int(value)} bytes, over {self._max_body_size}"
                )

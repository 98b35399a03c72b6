"""nsqd's HTTP publish API as bytes in and bytes out: ``/pub``, binary ``/mpub``, ``defer``.

:class:`HTTPPublishClient` is a sans-IO keep-alive client over h11 that both HTTP producers
(anyio and blocking) drive with their own sockets; :class:`PubResponse` is an answer and
:class:`~nsq_sansio.errors.HTTPPublishError` the error an answer other than 2xx raises.
Nothing here opens a socket.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

import h11

from nsq_sansio.errors import HTTPPublishError, LocalProtocolError

from .arguments import check_seconds

__all__ = [
    "HTTPPublishClient",
    "HTTPPublishError",
    "PubResponse",
    "build_mpub_request",
    "build_pub_request",
    "parse_pub_response",
]


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
            check_seconds("DPUB delay", defer)
            target += f"&defer={round(defer * 1000)}"
        return self._request(target, body)

    def mpub(self, topic: str, bodies: Sequence[bytes]) -> bytes:
        """``POST /mpub?topic=...&binary=true``: bodies are length-prefixed, so any byte goes."""
        if not bodies:
            raise LocalProtocolError("multi_publish needs at least one message body")
        parts = [struct.pack(">i", len(bodies))]
        for body in bodies:
            parts.append(struct.pack(">i", len(body)))
            parts.append(body)
        return self._request(f"/mpub?topic={quote(topic, safe='')}&binary=true", b"".join(parts))

    def receive_data(self, data: bytes) -> PubResponse | None:
        """Feed response bytes; returns the response once complete. Raises
        :class:`~nsq_sansio.errors.RemoteProtocolError` for a broken answer or EOF mid-answer."""
        from nsq_sansio.errors import ConnectionLost, RemoteProtocolError

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
            raise RemoteProtocolError(f"bad HTTP answer from nsqd: {exc}") from exc


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

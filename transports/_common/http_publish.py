"""nsqd's HTTP publish API, ``/pub``, binary ``/mpub`` and ``defer``, over the project's one
HTTP client (:class:`~nsq_sansio.http_client.HTTPClient`, bounded).

:class:`HTTPPublishClient` is the sans-IO side both HTTP producers (anyio and blocking) drive
with their own sockets: request bytes out, a :class:`PubResponse` in, the answer read no
further than :data:`MAX_ANSWER_SIZE`. What the producers share about *when* a request may go
again is here too: :func:`idle_socket_closed` (a kept-alive connection nsqd closed while it
sat in the pool: nothing was sent, so a fresh connection is safe) and :func:`lost_after_sending`
(a request written and then lost may have been stored, so it is never sent again).
"""

from __future__ import annotations

import json
import select
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import quote

from nsq_sansio.errors import ConnectionLost, HTTPPublishError, LocalProtocolError
from nsq_sansio.http_client import HTTPAnswer, HTTPClient

from .arguments import check_seconds
from .failures import describe, seconds

__all__ = [
    "MAX_ANSWER_SIZE",
    "HTTPPublishClient",
    "HTTPPublishError",
    "PubResponse",
    "idle_socket_closed",
    "lost_after_sending",
    "not_reached_in_time",
]

#: The largest answer body a publish reads: nsqd answers ``OK`` or a short JSON error, and a
#: proxy's error page fits; anything longer is a broken answer (RemoteProtocolError).
MAX_ANSWER_SIZE = 64 * 1024
#: The largest status line and headers of a publish answer.
MAX_ANSWER_HEADER_SIZE = 16 * 1024


@dataclass(frozen=True, slots=True)
class PubResponse:
    """An answer of nsqd's HTTP API to ``/pub`` or ``/mpub``."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = field(default=(), compare=False)
    #: True when the connection may carry the next request.
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
    """One keep-alive HTTP connection's publishes (one request at a time), sans-IO.

    ``pub()`` / ``mpub()`` return the bytes of a request to write; feed what the socket reads
    to ``receive_data()`` (``b""`` at EOF) until it returns a :class:`PubResponse`. When the
    response says ``keep_alive`` the same client (and socket) can send the next request. A
    broken or oversized answer raises :class:`~nsq_sansio.errors.RemoteProtocolError`, an
    answer cut short :class:`~nsq_sansio.errors.ConnectionLost`; the socket is then closed.
    """

    __slots__ = ("_http", "_prefix")

    def __init__(
        self,
        host: str,
        path_prefix: str = "",
        user_agent: str | None = None,
        *,
        max_answer_size: int = MAX_ANSWER_SIZE,
    ) -> None:
        self._http = HTTPClient(
            host,
            max_body_size=max_answer_size,
            max_header_size=MAX_ANSWER_HEADER_SIZE,
            user_agent=user_agent or "nsq-sansio",
        )
        self._prefix = path_prefix.rstrip("/")

    def _request(self, target: str, body: bytes) -> bytes:
        return self._http.request(
            "POST",
            self._prefix + target,
            body,
            headers=(("Content-Type", "application/octet-stream"),),
        )

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
        """Feed response bytes (``b""`` at EOF); the response once complete, else None."""
        answer: HTTPAnswer | None = self._http.receive_data(data)
        if answer is None:
            return None
        return PubResponse(answer.status, answer.body, answer.headers, answer.keep_alive)


def idle_socket_closed(fileno: int) -> bool:
    """Whether an idle kept-alive connection is unusable: closed (``fileno`` < 0), or with
    something to read while no request is outstanding (nsqd's FIN or reset after an idle
    timeout or a restart, or stray bytes). Checked before a pooled connection carries a
    request, so that one nsqd closed is dropped before anything is written to it."""
    if fileno < 0:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fileno, select.POLLIN | select.POLLPRI)
            return bool(poller.poll(0))
        readable, _, errored = select.select([fileno], [], [fileno], 0)
        return bool(readable or errored)
    except (OSError, ValueError):
        return True


def lost_after_sending(kind: str, topic: str, address: str, error: BaseException) -> ConnectionLost:
    """A request written to ``address`` whose connection failed before the answer: nsqd may
    have stored it, so it is not sent again (chained to ``error``)."""
    lost = ConnectionLost(
        f"{address}: {kind} to {topic!r} was sent, then the connection failed before the "
        f"answer ({describe(error)}); it may have been stored, so it is not sent again"
    )
    lost.__cause__ = error
    return lost


def not_reached_in_time(address: str, timeout: float) -> ConnectionLost:
    """No connection to ``address`` carried the request before the publish's timeout."""
    return ConnectionLost(
        f"{address}: not reached within the publish's timeout ({seconds(timeout)})"
    )

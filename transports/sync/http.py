"""Blocking publish over nsqd's HTTP API (``/pub``, ``/mpub``), h11 on keep-alive sockets.

An alternative to the TCP :class:`~transports.sync.producer.Producer` where only the HTTP port is
reachable, or for a few publishes from scripts::

    with HTTPProducer(["http://127.0.0.1:4151", "http://127.0.0.1:4251"]) as p:
        p.publish("events", b"hello")
        p.multi_publish("events", [b"a", b"b"])          # binary /mpub: any byte goes
        p.deferred_publish("events", b"later", delay=5.0)

Thread-safe: each call borrows an idle keep-alive connection (or opens one). Failover: when an
nsqd cannot be reached (connect error, connection lost) the next URL is tried; an HTTP error
answer (``400 INVALID_TOPIC``...) raises :class:`~transports._common.HTTPPublishError` at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from nsq_sansio.errors import ConnectionLost, NSQError, RemoteProtocolError
from nsq_sansio.frames import encode_dpub, encode_mpub, encode_pub
from transports._common import (
    DEFAULT_HTTP_PORT,
    HTTPURL,
    ConnectionLogger,
    HTTPPublishClient,
    HTTPPublishError,
    PubResponse,
    parse_http_url,
    split_options,
)

__all__ = ["HTTPProducer", "HTTPPublishError"]

_log = logging.getLogger("nsq_sansio.sync.http")


class _HTTPConn:
    def __init__(self, url: HTTPURL, sock: socket.socket) -> None:
        self.url = url
        self.sock = sock
        self.client = HTTPPublishClient(url.host_header, url.path)

    def exchange(self, request: bytes) -> PubResponse:
        self.sock.sendall(request)
        while True:
            data = self.sock.recv(65536)
            response = self.client.receive_data(data)
            if response is not None:
                return response

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class HTTPProducer:
    """Publish through nsqd's HTTP API, with failover over several nsqd."""

    def __init__(
        self,
        urls: str | Sequence[str] = "http://127.0.0.1:4151",
        *,
        timeout: float = 30.0,
        **options: Any,
    ) -> None:
        texts = [urls] if isinstance(urls, str) else list(urls)
        if not texts:
            raise ValueError("HTTPProducer needs at least one nsqd HTTP URL")
        self._urls = [parse_http_url(u, DEFAULT_HTTP_PORT) for u in texts]
        self._config, self._options = split_options(None, options)
        self._timeout = timeout
        self._idle: dict[HTTPURL, list[_HTTPConn]] = {u: [] for u in self._urls}
        self._lock = threading.Lock()
        self._rr = itertools.count()
        self._closed = False

    def publish(self, topic: str, body: bytes) -> None:
        encode_pub(topic, body)
        self._send(lambda c: c.pub(topic, body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        bodies = list(bodies)
        encode_mpub(topic, bodies)
        self._send(lambda c: c.mpub(topic, bodies))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        encode_dpub(topic, round(delay * 1000), body)
        self._send(lambda c: c.pub(topic, body, defer=delay))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            for idle in self._idle.values():
                idle.clear()
        for conn in conns:
            conn.close()

    def __enter__(self) -> HTTPProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------

    def _send(self, build: Callable[[HTTPPublishClient], bytes]) -> None:
        if self._closed:
            raise RuntimeError("HTTPProducer is closed")
        start = next(self._rr)
        errors: list[str] = []
        for i in range(len(self._urls)):
            url = self._urls[(start + i) % len(self._urls)]
            log = ConnectionLogger(_log, url.address)
            # A pooled keep-alive connection may have been closed by nsqd: one fresh retry.
            for fresh in (False, True):
                try:
                    conn = self._borrow(url, fresh)
                except OSError as exc:
                    errors.append(f"{url.address}: {exc}")
                    log.warning("cannot connect: %s", exc)
                    break
                try:
                    response = conn.exchange(build(conn.client))
                except (OSError, ConnectionLost, RemoteProtocolError) as exc:
                    conn.close()
                    if fresh:
                        errors.append(f"{url.address}: {exc}")
                        log.warning("publish failed: %s", exc)
                        break
                    continue
                if response.keep_alive:
                    self._give_back(conn)
                else:
                    conn.close()
                response.raise_for_status()
                return
        raise NSQError("HTTP publish failed on every nsqd: " + "; ".join(errors))

    def _borrow(self, url: HTTPURL, fresh: bool) -> _HTTPConn:
        if not fresh:
            with self._lock:
                idle = self._idle[url]
                if idle:
                    return idle.pop()
        sock = socket.create_connection((url.host, url.port), timeout=self._config.connect_timeout)
        sock.settimeout(self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if url.scheme == "https":
            context: ssl.SSLContext = self._options.ssl_context()
            sock = context.wrap_socket(
                sock, server_hostname=self._options.tls.server_hostname(url.host)
            )
        return _HTTPConn(url, sock)

    def _give_back(self, conn: _HTTPConn) -> None:
        with self._lock:
            if not self._closed:
                self._idle[conn.url].append(conn)
                return
        conn.close()

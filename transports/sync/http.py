"""Blocking publish over nsqd's HTTP API (``/pub``, ``/mpub``), h11 on keep-alive sockets.

An alternative to the TCP :class:`~transports.sync.producer.Producer` where only the HTTP port is
reachable, or for a few publishes from scripts::

    with HTTPProducer(["http://127.0.0.1:4151", "http://127.0.0.1:4251"]) as p:
        p.publish("events", b"hello")
        p.multi_publish("events", [b"a", b"b"])          # binary /mpub: any byte goes
        p.deferred_publish("events", b"later", delay=5.0)

Thread-safe: each call borrows an idle keep-alive connection (or opens one, at most
``max_connections`` at once). Failover: when an nsqd cannot be reached (connect error,
connection lost) the next URL is tried; an HTTP error answer (``400 INVALID_TOPIC``...) raises
:class:`~nsq_sansio.errors.HTTPPublishError` at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from nsq_sansio.errors import (
    ConfigError,
    LocalProtocolError,
    NoNSQDAvailable,
    NSQError,
)
from transports._common import (
    DEFAULT_HTTP_PORT,
    HTTPURL,
    READ_SIZE,
    ConnectionLogger,
    HTTPPublishClient,
    PubResponse,
    parse_http_url,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.failures import (
    at_address,
    connect_failed,
    connect_timed_out,
    seconds,
    tls_failed,
    without_address,
)
from transports._common.publishing import check_batch, check_deferred, check_publish

__all__ = ["HTTPProducer"]

_log = logging.getLogger("nsq_sansio.sync.http")


class _HTTPConn:
    def __init__(self, url: HTTPURL, sock: socket.socket) -> None:
        self.url = url
        self.sock = sock
        self.client = HTTPPublishClient(url.host_header, url.path)
        #: A byte of the answer arrived (a failure after that is not a stale connection).
        self.answered = False

    def exchange(self, request: bytes, deadline: float) -> PubResponse:
        """Send ``request`` and read the answer, by ``deadline`` (``socket.timeout``)."""
        sock = self.sock
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(request)
        self.answered = False
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = sock.recv(READ_SIZE)
            if data:
                self.answered = True
            response = self.client.receive_data(data)
            if response is not None:
                return response

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Unreachable(Exception):
    """No connection could be made to a URL (``error``: its ``ConnectionLost``)."""

    def __init__(self, error: NSQError) -> None:
        super().__init__(str(error))
        self.error = error


class HTTPProducer:
    """Publish through nsqd's HTTP API (``/pub``, binary ``/mpub``, ``/pub?defer=``) over h11,
    with keep-alive connections (at most ``max_connections`` at once) and failover over
    several nsqd on connection errors. ``timeout`` bounds one publish; when no nsqd can be
    connected it raises :class:`~nsq_sansio.errors.NoNSQDAvailable` (each URL's cause), when
    the answer does not come in time ``TimeoutError``."""

    def __init__(
        self,
        urls: str | Sequence[str] = "http://127.0.0.1:4151",
        *,
        timeout: float = 30.0,
        max_connections: int = 16,
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> None:
        texts = [urls] if isinstance(urls, str) else list(urls)
        if not texts:
            raise ConfigError("HTTPProducer needs at least one nsqd HTTP URL")
        check_seconds("HTTPProducer timeout", timeout, zero=False, error=ConfigError)
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ConfigError(f"max_connections={max_connections!r} must be an int >= 1")
        self._urls = [parse_http_url(u, DEFAULT_HTTP_PORT) for u in texts]
        self._config, self._options = split_options(None, options)
        self._timeout = timeout
        self._logger = logger or _log
        self._idle: dict[HTTPURL, list[_HTTPConn]] = {u: [] for u in self._urls}
        self._lock = threading.Lock()
        self._limit = threading.BoundedSemaphore(max_connections)
        self._rr = itertools.count()
        self._valid_topics: set[str] = set()
        self._closed = False

    def publish(self, topic: str, body: bytes) -> None:
        """``POST /pub``: returns once nsqd answered 200."""
        check_publish(self._valid_topics, topic, body)
        self._send("PUB", topic, lambda c: c.pub(topic, body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``POST /mpub?binary=true``: all or nothing (bodies may hold any byte)."""
        batch = check_batch(self._valid_topics, topic, bodies)
        self._send("MPUB", topic, lambda c: c.mpub(topic, batch))

    def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """``POST /pub?defer=``: deliverable after ``delay`` seconds."""
        check_deferred(self._valid_topics, topic, body, delay)
        self._send("DPUB", topic, lambda c: c.pub(topic, body, defer=delay))

    def close(self) -> None:
        """Close the idle connections; a publish after this raises LocalProtocolError."""
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

    def _send(self, kind: str, topic: str, build: Callable[[HTTPPublishClient], bytes]) -> None:
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        deadline = time.monotonic() + self._timeout
        if not self._limit.acquire(timeout=self._timeout):
            raise TimeoutError(
                f"{kind} to {topic!r}: no HTTP connection free within {seconds(self._timeout)}"
            )
        try:
            self._send_limited(kind, topic, build, deadline)
        finally:
            self._limit.release()

    def _send_limited(
        self, kind: str, topic: str, build: Callable[[HTTPPublishClient], bytes], deadline: float
    ) -> None:
        start = next(self._rr)
        errors: list[BaseException] = []
        for i in range(len(self._urls)):
            url = self._urls[(start + i) % len(self._urls)]
            log = ConnectionLogger(self._logger, url.address)
            # A pooled keep-alive connection may have been closed by nsqd: one fresh retry.
            for fresh in (False, True):
                try:
                    conn = self._borrow(url, fresh, deadline)
                except _Unreachable as exc:
                    errors.append(exc.error)
                    log.warning("cannot connect: %s", without_address(url.address, exc.error))
                    break
                try:
                    response = conn.exchange(build(conn.client), deadline)
                except TimeoutError:
                    conn.close()
                    raise TimeoutError(
                        f"{kind} to {topic!r}: no answer from {url.address} within "
                        f"{seconds(self._timeout)}"
                    ) from None
                except (OSError, NSQError) as exc:
                    conn.close()
                    if fresh or conn.answered:
                        errors.append(at_address(url.address, exc))
                        log.warning("publish failed: %s", without_address(url.address, exc))
                        break
                    continue
                if response.keep_alive:
                    self._give_back(conn)
                else:
                    conn.close()
                response.raise_for_status()
                return
        raise NoNSQDAvailable(errors)

    def _borrow(self, url: HTTPURL, fresh: bool, deadline: float) -> _HTTPConn:
        if not fresh:
            with self._lock:
                idle = self._idle[url]
                if idle:
                    return idle.pop()
        timeout = min(self._config.connect_timeout, max(deadline - time.monotonic(), 0.001))
        try:
            sock = socket.create_connection((url.host, url.port), timeout=timeout)
        except TimeoutError:
            raise _Unreachable(connect_timed_out(url.address, timeout)) from None
        except OSError as exc:
            raise _Unreachable(connect_failed(url.address, exc)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if url.scheme == "https":
            context: ssl.SSLContext = self._options.ssl_context()
            try:
                sock = context.wrap_socket(
                    sock, server_hostname=self._options.tls.server_hostname(url.host)
                )
            except (ssl.SSLError, OSError) as exc:
                sock.close()
                raise _Unreachable(tls_failed(url.address, exc)) from exc
        return _HTTPConn(url, sock)

    def _give_back(self, conn: _HTTPConn) -> None:
        with self._lock:
            if not self._closed:
                self._idle[conn.url].append(conn)
                return
        conn.close()

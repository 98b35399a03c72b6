"""Blocking publish over nsqd's HTTP API (``/pub``, ``/mpub``) on keep-alive sockets.

An alternative to the TCP :class:`~transports.sync.producer.Producer` where only the HTTP port is
reachable, or for a few publishes from scripts::

    with HTTPProducer(["http://127.0.0.1:4151", "http://127.0.0.1:4251"]) as p:
        p.publish("events", b"hello")
        p.multi_publish("events", [b"a", b"b"])          # binary /mpub: any byte goes
        p.deferred_publish("events", b"later", delay=5.0)

Thread-safe: each call borrows an idle keep-alive connection (or opens one, at most
``max_connections`` at once). A request is sent once: on to the next URL only while it
provably reached no nsqd (no connection could be made, or one failed before any byte of it
was written); a pooled connection nsqd closed is dropped before it is used. A request written
and then lost raises :class:`~nsq_sansio.errors.ConnectionLost` (it may have been stored), no
answer within ``timeout`` ``TimeoutError``, an HTTP error answer (``400 INVALID_TOPIC``...)
:class:`~nsq_sansio.errors.HTTPPublishError`. ``timeout`` bounds the whole call.
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
from typing import Any, NoReturn

from nsq_sansio.errors import (
    ConfigError,
    LocalProtocolError,
    NoNSQDAvailable,
    NSQError,
    RemoteProtocolError,
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
    check_enter_once,
    connect_failed,
    connect_timed_out,
    no_answer,
    seconds,
    tls_failed,
    without_address,
)
from transports._common.http_publish import (
    idle_socket_closed,
    lost_after_sending,
    not_reached_in_time,
)
from transports._common.logs import fields
from transports._common.publishing import check_batch, check_deferred, check_publish

__all__ = ["HTTPProducer"]

_log = logging.getLogger("nsq_sansio.sync.http")


class _HTTPConn:
    """One keep-alive connection to an nsqd's HTTP port, its socket and its HTTP state."""

    def __init__(self, url: HTTPURL, sock: socket.socket) -> None:
        self.url = url
        self.sock = sock
        self.client = HTTPPublishClient(url.host_header, url.path)
        #: It carried a request before (it came from the pool).
        self.reused = False

    def closed_by_peer(self) -> bool:
        """An idle connection nsqd closed (or wrote to) while it sat in the pool."""
        try:
            fileno = self.sock.fileno()
        except OSError:
            return True
        return idle_socket_closed(fileno)

    def send(self, request: bytes, deadline: float) -> None:
        """Write ``request`` by ``deadline``; :class:`_NotSent` when it failed before any
        byte went out (nsqd cannot have seen it), else the socket's error."""
        sock = self.sock
        view = memoryview(request)
        sent = 0
        while sent < len(view):
            sock.settimeout(_left(deadline))
            try:
                sent += sock.send(view[sent:])
            except TimeoutError:
                raise
            except OSError as exc:
                if sent == 0:
                    raise _NotSent(exc) from exc
                raise

    def read_answer(self, deadline: float) -> PubResponse:
        """Read the answer by ``deadline`` (``TimeoutError`` after it)."""
        sock = self.sock
        while True:
            sock.settimeout(_left(deadline))
            response = self.client.receive_data(sock.recv(READ_SIZE))
            if response is not None:
                return response

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` for a socket timeout; TimeoutError once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the publish's timeout passed")
    return left


class _NotSent(Exception):
    """Writing a request failed before any byte of it went out (``error`` says how)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _Unreachable(Exception):
    """No connection could be made to a URL (``error``: its ``ConnectionLost``)."""

    def __init__(self, error: NSQError) -> None:
        super().__init__(str(error))
        self.error = error


class HTTPProducer:
    """Publish through nsqd's HTTP API (``/pub``, binary ``/mpub``, ``/pub?defer=``), on
    keep-alive connections (at most ``max_connections`` at once), round robin over the URLs.

    A request is sent once; it goes on to the next URL only while it provably reached no nsqd.
    ``timeout`` bounds the whole call. Raises :class:`~nsq_sansio.errors.NoNSQDAvailable` when
    no nsqd could be reached (each URL's cause), ``TimeoutError`` when the answer did not come
    in time and :class:`~nsq_sansio.errors.ConnectionLost` when the connection failed after
    the request was written (both: it may have been stored), and
    :class:`~nsq_sansio.errors.HTTPPublishError` for nsqd's refusal."""

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
        #: The block was entered (once: a nested block's end would close it).
        self._entered = False

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
        check_deferred(self._valid_topics, topic, body, delay, self._config.max_req_timeout)
        self._send("DPUB", topic, lambda c: c.pub(topic, body, defer=delay))

    def _enter(self) -> None:
        with self._lock:
            check_enter_once(self._closed, self._entered, "with")
            self._entered = True

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
        self._enter()
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
        """Send the request once; on to the next nsqd only while it provably reached none
        (no connection could be made, or one failed before any byte of it was written)."""
        start = next(self._rr)
        count = len(self._urls)
        errors: list[BaseException] = []
        for i in range(count):
            url = self._urls[(start + i) % count]
            if time.monotonic() >= deadline:
                errors.extend(
                    not_reached_in_time(self._urls[(start + j) % count].address, self._timeout)
                    for j in range(i, count)
                )
                break
            log = ConnectionLogger(self._logger, url.address)
            while True:
                conn = self._pooled(url)
                if conn is None:
                    try:
                        conn = self._open(url, deadline)
                    except _Unreachable as exc:
                        errors.append(exc.error)
                        text = without_address(url.address, exc.error)
                        log.warning("cannot connect: %s", text, extra=fields(error=text))
                        break
                try:
                    conn.send(build(conn.client), deadline)
                except _NotSent as exc:
                    conn.close()
                    if conn.reused:
                        continue  # nsqd closed it in the pool: nothing was sent, a fresh one
                    errors.append(at_address(url.address, exc.error))
                    text = without_address(url.address, exc.error)
                    log.warning("cannot connect: %s", text, extra=fields(error=text))
                    break
                except BaseException as exc:
                    conn.close()
                    self._raise_sent(kind, topic, url, exc)
                try:
                    response = conn.read_answer(deadline)
                except BaseException as exc:
                    conn.close()
                    self._raise_sent(kind, topic, url, exc)
                if response.keep_alive:
                    self._give_back(conn)
                else:
                    conn.close()
                response.raise_for_status()
                return
        raise NoNSQDAvailable(errors)

    def _raise_sent(self, kind: str, topic: str, url: HTTPURL, error: BaseException) -> NoReturn:
        """A request (maybe partly) written failed: it may have been stored, so it is raised,
        not sent again anywhere."""
        if isinstance(error, TimeoutError):
            raise no_answer(kind, topic, url.address, self._timeout) from None
        if isinstance(error, RemoteProtocolError):
            raise RemoteProtocolError(f"{url.address}: {kind} to {topic!r}: {error}") from error
        if isinstance(error, OSError | NSQError):
            raise lost_after_sending(kind, topic, url.address, error) from error
        raise error

    def _pooled(self, url: HTTPURL) -> _HTTPConn | None:
        """An idle kept-alive connection to ``url`` that nsqd has not closed, or None."""
        while True:
            with self._lock:
                idle = self._idle[url]
                if not idle:
                    return None
                conn = idle.pop()
            if not conn.closed_by_peer():
                conn.reused = True
                return conn
            conn.close()

    def _open(self, url: HTTPURL, deadline: float) -> _HTTPConn:
        """A new connection (TLS for ``https``), within ``connect_timeout`` and ``deadline``."""
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
            # the handshake, as a whole, within what is left of the connect timeout
            sock.settimeout(
                min(self._config.connect_timeout, max(deadline - time.monotonic(), 0.001))
            )
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

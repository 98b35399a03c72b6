"""The anyio HTTP producer: :class:`HTTPProducer`, publishing through nsqd's HTTP API.

``/pub``, binary ``/mpub`` and ``/pub?defer=`` (:class:`~transports._common.HTTPPublishClient`)
on keep-alive connections kept per URL, round robin over the URLs. A request is sent once: on
to the next URL only while no connection could be made; a pooled connection nsqd closed is
dropped before it is used. ``timeout`` bounds the whole call; an error answer raises
:class:`~nsq_sansio.errors.HTTPPublishError` at once.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

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
from transports._common.failures import check_enter_once, no_answer, seconds, without_address
from transports._common.http_publish import (
    idle_socket_closed,
    lost_after_sending,
    not_reached_in_time,
)
from transports._common.logs import fields
from transports._common.publishing import check_batch, check_deferred, check_publish

from ._net import SOCKET_ERRORS, connect, start_tls

__all__ = ["HTTPProducer"]

_log = logging.getLogger("nsq_sansio.anyio.http")


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
        config, self._options = split_options(None, options)
        #: nsqd's --max-req-timeout (its default hour unless configured): the longest defer.
        self._max_req_timeout = config.max_req_timeout
        self._timeout = timeout
        self._logger = logger or _log
        self._idle: dict[HTTPURL, list[tuple[anyio.abc.ByteStream, HTTPPublishClient]]] = {
            u: [] for u in self._urls
        }
        self._limit = anyio.Semaphore(max_connections)
        self._rr = itertools.count()
        self._valid_topics: set[str] = set()
        self._closed = False
        #: The block was entered (once: a nested block's end would close it).
        self._entered = False

    async def __aenter__(self) -> HTTPProducer:
        self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _enter(self) -> None:
        check_enter_once(self._closed, self._entered, "async with")
        self._entered = True

    async def close(self) -> None:
        """Close the idle connections; a publish after this raises LocalProtocolError."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            for idle in self._idle.values():
                while idle:
                    stream, _ = idle.pop()
                    await anyio.aclose_forcefully(stream)

    async def publish(self, topic: str, body: bytes) -> None:
        """``POST /pub``: returns once nsqd answered 200."""
        check_publish(self._valid_topics, topic, body)
        await self._send("PUB", topic, lambda c: c.pub(topic, body))

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``POST /mpub?binary=true``: all or nothing (bodies may hold any byte)."""
        batch = check_batch(self._valid_topics, topic, bodies)
        await self._send("MPUB", topic, lambda c: c.mpub(topic, batch))

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """``POST /pub?defer=``: deliverable after ``delay`` seconds."""
        check_deferred(self._valid_topics, topic, body, delay, self._max_req_timeout)
        await self._send("DPUB", topic, lambda c: c.pub(topic, body, defer=delay))

    async def _send(
        self, kind: str, topic: str, build: Callable[[HTTPPublishClient], bytes]
    ) -> None:
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        attempt = _Attempt()
        # One deadline for the whole call: a free connection slot, connecting, the answer.
        with anyio.move_on_after(self._timeout):
            async with self._limit:
                attempt.has_slot = True
                await self._send_limited(kind, topic, build, attempt)
                return
        raise attempt.timed_out(kind, topic, self._timeout)

    async def _send_limited(
        self,
        kind: str,
        topic: str,
        build: Callable[[HTTPPublishClient], bytes],
        attempt: _Attempt,
    ) -> None:
        """Send the request once; on to the next nsqd only while it provably reached none
        (no connection could be made to it)."""
        start = next(self._rr) % len(self._urls)
        attempt.order = self._urls[start:] + self._urls[:start]
        for index, url in enumerate(attempt.order):
            attempt.index = index
            log = ConnectionLogger(self._logger, url.address)
            pooled = await self._pooled(url)
            if pooled is not None:
                stream, client = pooled
            else:
                try:
                    stream = await self._open(url)
                except _Unreachable as exc:
                    attempt.errors.append(exc.error)
                    text = without_address(url.address, exc.error)
                    log.warning("cannot connect: %s", text, extra=fields(error=text))
                    continue
                client = HTTPPublishClient(url.host_header, url.path)
            request = build(client)
            attempt.sent_to = url  # from here on it may reach nsqd: never sent again
            keep = False
            try:
                response = await _round_trip(stream, client, request)
                keep = response.keep_alive and not self._closed
            except RemoteProtocolError as exc:
                raise RemoteProtocolError(f"{url.address}: {kind} to {topic!r}: {exc}") from exc
            except (*SOCKET_ERRORS, NSQError) as exc:
                raise lost_after_sending(kind, topic, url.address, exc) from exc
            finally:
                if keep:
                    self._idle[url].append((stream, client))
                else:
                    await _close(stream)
            response.raise_for_status()
            return
        raise NoNSQDAvailable(attempt.errors)

    async def _pooled(self, url: HTTPURL) -> tuple[anyio.abc.ByteStream, HTTPPublishClient] | None:
        """An idle kept-alive connection to ``url`` that nsqd has not closed, or None (the
        closed ones are dropped: nothing was sent on them)."""
        idle = self._idle[url]
        while idle:
            stream, client = idle.pop()
            if not _closed_by_peer(stream):
                return stream, client
            await _close(stream)
        return None

    async def _open(self, url: HTTPURL) -> anyio.abc.ByteStream:
        """A new connection (TLS for ``https``) within ``connect_timeout``."""
        try:
            stream: anyio.abc.ByteStream = await connect(
                url.host, url.port, self._options.connect_timeout
            )
            if url.scheme == "https":
                stream = await start_tls(
                    stream,
                    self._options.ssl_context(),
                    self._options.tls.server_hostname(url.host),
                    b"",
                    self._options.connect_timeout,
                    address=url.address,
                )
        except NSQError as exc:
            raise _Unreachable(exc) from exc
        return stream


async def _round_trip(
    stream: anyio.abc.ByteStream, client: HTTPPublishClient, request: bytes
) -> PubResponse:
    """Write ``request`` on ``stream`` and read its answer."""
    await stream.send(request)
    while True:
        try:
            data = await stream.receive(READ_SIZE)
        except anyio.EndOfStream:
            data = b""
        response = client.receive_data(data)
        if response is not None:
            return response


async def _close(stream: anyio.abc.ByteStream) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.aclose_forcefully(stream)


def _closed_by_peer(stream: anyio.abc.ByteStream) -> bool:
    """An idle connection nsqd closed (or wrote to) while it sat in the pool. Between two
    requests nothing reads the socket (anyio's asyncio streams pause reading between
    ``receive()`` calls), so nsqd's FIN or reset is still there to see."""
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is None:
        return False  # cannot tell: used as it is
    try:
        fileno = raw.fileno()
    except OSError:
        return True
    return idle_socket_closed(fileno)


class _Attempt:
    """How far one call got, for what its timeout says."""

    __slots__ = ("errors", "has_slot", "index", "order", "sent_to")

    def __init__(self) -> None:
        self.has_slot = False
        self.order: list[HTTPURL] = []
        self.index = 0
        self.errors: list[BaseException] = []
        #: The URL the request was written to (None: written nowhere).
        self.sent_to: HTTPURL | None = None

    def timed_out(self, kind: str, topic: str, timeout: float) -> BaseException:
        if not self.has_slot:
            return TimeoutError(
                f"{kind} to {topic!r}: no HTTP connection free within {seconds(timeout)}"
            )
        if self.sent_to is not None:
            return no_answer(kind, topic, self.sent_to.address, timeout)
        left = [not_reached_in_time(url.address, timeout) for url in self.order[self.index :]]
        return NoNSQDAvailable([*self.errors, *left])


class _Unreachable(Exception):
    """No connection could be made to a URL (``error``: its ``ConnectionLost``)."""

    def __init__(self, error: NSQError) -> None:
        super().__init__(str(error))
        self.error = error

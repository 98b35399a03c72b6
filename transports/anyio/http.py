"""The anyio HTTP producer: :class:`HTTPProducer`, publishing through nsqd's HTTP API.

``/pub``, binary ``/mpub`` and ``/pub?defer=`` over h11
(:class:`~transports._common.HTTPPublishClient`), on keep-alive connections kept per URL,
round-robin over the URLs and on to the next one on a connection error; an error answer raises
:class:`~nsq_sansio.errors.HTTPPublishError` at once.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from nsq_sansio.errors import ConfigError, LocalProtocolError, NoNSQDAvailable, NSQError
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
from transports._common.failures import at_address, seconds, without_address
from transports._common.publishing import check_batch, check_deferred, check_publish

from ._net import SOCKET_ERRORS, connect, start_tls

__all__ = ["HTTPProducer"]

_log = logging.getLogger("nsq_sansio.anyio.http")


class _StaleConnection(Exception):
    """An HTTP connection failed before any byte of the answer (``error`` says how)."""

    def __init__(self, error: BaseException) -> None:
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
        _config, self._options = split_options(None, options)
        self._timeout = timeout
        self._logger = logger or _log
        self._idle: dict[HTTPURL, list[tuple[anyio.abc.ByteStream, HTTPPublishClient]]] = {
            u: [] for u in self._urls
        }
        self._limit = anyio.Semaphore(max_connections)
        self._rr = itertools.count()
        self._valid_topics: set[str] = set()
        self._closed = False

    async def __aenter__(self) -> HTTPProducer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

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
        check_deferred(self._valid_topics, topic, body, delay)
        await self._send("DPUB", topic, lambda c: c.pub(topic, body, defer=delay))

    async def _send(
        self, kind: str, topic: str, build: Callable[[HTTPPublishClient], bytes]
    ) -> None:
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        errors: list[BaseException] = []
        start = next(self._rr) % len(self._urls)
        deadline = monotonic() + self._timeout
        async with self._limit:
            for url in self._urls[start:] + self._urls[:start]:
                log = ConnectionLogger(self._logger, url.address)
                response: PubResponse | None = None
                with anyio.move_on_after(max(deadline - monotonic(), 0)) as scope:
                    try:
                        response = await self._exchange(url, build)
                    except _Unreachable as exc:
                        errors.append(at_address(url.address, exc.error))
                        log.warning("cannot connect: %s", without_address(url.address, exc.error))
                        continue
                    except (*SOCKET_ERRORS, NSQError) as exc:
                        errors.append(at_address(url.address, exc))
                        log.warning("publish failed: %s", without_address(url.address, exc))
                        continue
                if scope.cancelled_caught or response is None:
                    raise TimeoutError(
                        f"{kind} to {topic!r}: no answer from {url.address} within "
                        f"{seconds(self._timeout)}"
                    )
                response.raise_for_status()
                return
        raise NoNSQDAvailable(errors)

    async def _exchange(
        self, url: HTTPURL, build: Callable[[HTTPPublishClient], bytes]
    ) -> PubResponse:
        idle = self._idle[url]
        if idle:
            # A kept-alive connection may have been closed by nsqd (restart, idle timeout)
            # while it sat in the pool: when it fails before any byte of an answer, the
            # request is sent once more, on a fresh connection (the other idle ones are
            # dropped: they are most likely stale too).
            stream, client = idle.pop()
            try:
                return await self._round_trip(idle, stream, client, build)
            except _StaleConnection:
                with anyio.CancelScope(shield=True):
                    while idle:
                        await anyio.aclose_forcefully(idle.pop()[0])
        try:
            stream = await connect(url.host, url.port, self._options.connect_timeout)
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
        client = HTTPPublishClient(url.host_header, url.path)
        try:
            return await self._round_trip(idle, stream, client, build)
        except _StaleConnection as exc:
            raise exc.error from None

    async def _round_trip(
        self,
        idle: list[tuple[anyio.abc.ByteStream, HTTPPublishClient]],
        stream: anyio.abc.ByteStream,
        client: HTTPPublishClient,
        build: Callable[[HTTPPublishClient], bytes],
    ) -> PubResponse:
        """One request on ``stream``; :class:`_StaleConnection` when it failed before any
        byte of the answer arrived (safe to send again elsewhere)."""
        keep = False
        answered = False
        try:
            try:
                await stream.send(build(client))
                while True:
                    try:
                        data = await stream.receive(READ_SIZE)
                    except anyio.EndOfStream:
                        data = b""
                    if data:
                        answered = True
                    response = client.receive_data(data)
                    if response is not None:
                        keep = response.keep_alive
                        return response
            except (*SOCKET_ERRORS, NSQError) as exc:
                if answered:
                    raise
                raise _StaleConnection(exc) from exc
        finally:
            if keep and not self._closed:
                idle.append((stream, client))
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)


class _Unreachable(Exception):
    """No connection could be made to a URL (``error``: its ``ConnectionLost``)."""

    def __init__(self, error: NSQError) -> None:
        super().__init__(str(error))
        self.error = error

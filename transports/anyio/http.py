"""The anyio HTTP producer: :class:`HTTPProducer`, publishing through nsqd's HTTP API.

``/pub``, binary ``/mpub`` and ``/pub?defer=`` over h11
(:class:`~transports._common.HTTPPublishClient`), on keep-alive connections kept per URL,
round-robin over the URLs and on to the next one on a connection error; an error answer raises
:class:`~transports._common.HTTPPublishError` at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.abc

from nsq_sansio.errors import NSQError
from nsq_sansio.names import validate_topic
from transports._common import (
    DEFAULT_HTTP_PORT,
    HTTPURL,
    READ_SIZE,
    HTTPPublishClient,
    PubResponse,
    parse_http_url,
    split_options,
)

from ._net import SOCKET_ERRORS, connect, start_tls
from .producer import NoNSQDAvailable

__all__ = ["HTTPProducer"]


class _StaleConnection(Exception):
    """An HTTP connection failed before any byte of the answer (``error`` says how)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class HTTPProducer:
    """Publish through nsqd's HTTP API (``/pub``, binary ``/mpub``, ``/pub?defer=``) over h11,
    with keep-alive connections and failover over several nsqd on connection errors."""

    def __init__(
        self,
        urls: str | Sequence[str] = "http://127.0.0.1:4151",
        *,
        timeout: float = 30.0,
        max_connections: int = 16,
        **options: Any,
    ) -> None:
        texts = [urls] if isinstance(urls, str) else list(urls)
        if not texts:
            raise ValueError("HTTPProducer needs at least one nsqd HTTP URL")
        self._urls = [parse_http_url(u, DEFAULT_HTTP_PORT) for u in texts]
        _config, self._options = split_options(None, options)
        self._timeout = timeout
        self._idle: dict[HTTPURL, list[tuple[anyio.abc.ByteStream, HTTPPublishClient]]] = {
            u: [] for u in self._urls
        }
        self._limit = anyio.Semaphore(max_connections)
        self._rr = itertools.count()

    async def __aenter__(self) -> HTTPProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for idle in self._idle.values():
            while idle:
                stream, _ = idle.pop()
                await anyio.aclose_forcefully(stream)

    async def publish(self, topic: str, body: bytes) -> None:
        validate_topic(topic)
        await self._send(lambda c: c.pub(topic, body))

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        validate_topic(topic)
        await self._send(lambda c: c.mpub(topic, bodies))

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        validate_topic(topic)
        await self._send(lambda c: c.pub(topic, body, defer=delay))

    async def _send(self, build: Callable[[HTTPPublishClient], bytes]) -> None:
        errors: list[BaseException] = []
        start = next(self._rr) % len(self._urls)
        async with self._limit:
            with anyio.fail_after(self._timeout):
                for url in self._urls[start:] + self._urls[:start]:
                    try:
                        response = await self._exchange(url, build)
                    except (*SOCKET_ERRORS, NSQError) as exc:
                        errors.append(exc)
                        continue
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
        stream = await connect(url.host, url.port, self._options.connect_timeout)
        if url.scheme == "https":
            stream = await start_tls(
                stream,
                self._options.ssl_context(),
                self._options.tls.server_hostname(url.host),
                b"",
                self._options.connect_timeout,
            )
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
            if keep:
                idle.append((stream, client))
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)

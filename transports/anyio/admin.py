"""Operate nsqd and nsqlookupd from async code (asyncio or trio): :class:`NSQDAdmin` and
:class:`LookupdAdmin` over their HTTP API.

::

    async with NSQDAdmin("http://127.0.0.1:4151") as nsqd:
        lag = (await nsqd.channel_stats("orders", "billing")).lag
        await nsqd.pause_channel("orders", "billing")

Every call is built and read by :mod:`nsq_sansio.admin` (typed answers, typed errors), over one
keep-alive connection while inside ``async with`` (a connection per call outside it). A call
that takes longer than ``timeout`` raises :class:`TimeoutError`; a connection that cannot be
made or breaks raises :class:`~nsq_sansio.errors.ConnectionLost`. The blocking twins, same
names and signatures, are in :mod:`transports.sync.admin`.
"""

from __future__ import annotations

import ssl
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import anyio
import anyio.abc

from nsq_sansio.admin import (
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_NSQD_HTTP_PORT,
    NSQDAPI,
    AdminEndpoint,
    AdminRequest,
    ChannelStats,
    LookupdAPI,
    LookupdInfo,
    LookupdNode,
    LookupdProducer,
    NSQDInfo,
    NSQDStats,
    TopicLookup,
    TopicStats,
)
from nsq_sansio.errors import ConfigError, ConnectionLost
from nsq_sansio.http_client import DEFAULT_MAX_BODY_SIZE, HTTPAnswer, HTTPClient
from transports._common.tls import TLSOptions

__all__ = ["LookupdAdmin", "NSQDAdmin"]

T = TypeVar("T")
_Self = TypeVar("_Self", bound="_AdminClient")

_READ_SIZE = 64 * 1024
# What a broken or closed connection raises from an anyio stream.
_STREAM_ERRORS = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
)


class _Stale(Exception):
    """The request failed before any byte of an answer (``error`` says how): on a kept-alive
    connection that the server had closed, sending it again on a fresh one is safe."""

    def __init__(self, error: ConnectionLost) -> None:
        super().__init__(str(error))
        self.error = error


class _Connection:
    __slots__ = ("http", "stream")

    def __init__(self, stream: anyio.abc.ByteStream, http: HTTPClient) -> None:
        self.stream = stream
        self.http = http


class _AdminClient:
    """What both admin clients share: the endpoint, the connection, timeouts and TLS."""

    _default_port: ClassVar[int]

    def __init__(
        self,
        url: str | AdminEndpoint,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        tls: TLSOptions | ssl.SSLContext | None = None,
        max_response_size: int = DEFAULT_MAX_BODY_SIZE,
        user_agent: str = "nsq-sansio",
    ) -> None:
        self.endpoint = AdminEndpoint.parse(url, self._default_port)
        if not timeout > 0 or not connect_timeout > 0:
            raise ConfigError(
                f"timeout={timeout!r} and connect_timeout={connect_timeout!r} must be > 0"
            )
        if (
            isinstance(max_response_size, bool)
            or not isinstance(max_response_size, int)
            or (max_response_size <= 0)
        ):
            raise ConfigError(f"max_response_size={max_response_size!r} must be an int > 0")
        if tls is not None and not self.endpoint.tls:
            raise ConfigError(f"tls= is given but {url!r} is not an https:// URL")
        options = TLSOptions(ssl_context=tls) if isinstance(tls, ssl.SSLContext) else tls
        self._tls = options or TLSOptions()
        self._ssl_context = self._tls.context() if self.endpoint.tls else None
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_response_size = max_response_size
        self._user_agent = user_agent
        self._lock = anyio.Lock()
        self._conn: _Connection | None = None
        self._keep_alive = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.endpoint)!r})"

    async def __aenter__(self: _Self) -> _Self:
        self._keep_alive = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the kept-alive connection (calls after this open a connection each)."""
        self._keep_alive = False
        conn, self._conn = self._conn, None
        if conn is not None:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(conn.stream)

    async def _call(self, request: AdminRequest[T]) -> T:
        with anyio.fail_after(self._timeout):  # waiting for another call's turn included
            async with self._lock:
                answer = await self._exchange(request)
        return request.read(answer, self.endpoint)

    async def _exchange(self, request: AdminRequest[Any]) -> HTTPAnswer:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                return await self._round_trip(conn, request)
            except _Stale:
                pass  # the server closed it while it was idle: once more, on a fresh one
        conn = await self._connect()
        try:
            return await self._round_trip(conn, request)
        except _Stale as exc:
            raise exc.error from None

    async def _connect(self) -> _Connection:
        endpoint = self.endpoint
        context = self._ssl_context
        try:
            with anyio.fail_after(self._connect_timeout):
                stream: anyio.abc.ByteStream
                if context is None:
                    stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
                else:
                    stream = await anyio.connect_tcp(
                        endpoint.host,
                        endpoint.port,
                        ssl_context=context,
                        tls_hostname=self._tls.server_hostname(endpoint.host) or endpoint.host,
                        tls_standard_compatible=False,
                    )
        except TimeoutError:
            raise ConnectionLost(
                f"connecting to {endpoint} timed out after {self._connect_timeout:g}s"
            ) from None
        except (*_STREAM_ERRORS, anyio.EndOfStream) as exc:
            raise ConnectionLost(f"cannot connect to {endpoint}: {exc}") from exc
        http = HTTPClient(
            endpoint.host_header,
            max_body_size=self._max_response_size,
            user_agent=self._user_agent,
        )
        return _Connection(stream, http)

    async def _round_trip(self, conn: _Connection, request: AdminRequest[Any]) -> HTTPAnswer:
        keep = False
        try:
            data = conn.http.request(request.method, request.target(self.endpoint.path_prefix))
            try:
                await conn.stream.send(data)
                while True:
                    try:
                        chunk = await conn.stream.receive(_READ_SIZE)
                    except anyio.EndOfStream:
                        chunk = b""
                    answer = conn.http.receive_data(chunk)
                    if answer is not None:
                        keep = answer.keep_alive and self._keep_alive
                        return answer
            except _STREAM_ERRORS as exc:
                error = ConnectionLost(f"{self.endpoint}: {str(exc) or type(exc).__name__}")
                if conn.http.answer_started:
                    raise error from exc
                raise _Stale(error) from exc
            except ConnectionLost as exc:
                if conn.http.answer_started:
                    raise
                raise _Stale(exc) from exc
        finally:
            if keep:
                self._conn = conn
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(conn.stream)


class NSQDAdmin(_AdminClient):
    """nsqd's HTTP API: stats (with each channel's lag), topics and channels (create,
    delete, empty, pause, unpause), ping and info. ``url`` is nsqd's HTTP address
    (``http://host:4151``, or ``https://host:4152`` with ``tls=TLSOptions(...)``)."""

    _default_port = DEFAULT_NSQD_HTTP_PORT

    def __init__(
        self,
        url: str | AdminEndpoint = "http://127.0.0.1:4151",
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        tls: TLSOptions | ssl.SSLContext | None = None,
        max_response_size: int = DEFAULT_MAX_BODY_SIZE,
        user_agent: str = "nsq-sansio",
    ) -> None:
        super().__init__(
            url,
            timeout=timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            max_response_size=max_response_size,
            user_agent=user_agent,
        )

    async def ping(self) -> None:
        """Returns when nsqd is healthy; :class:`~nsq_sansio.admin.AdminHTTPError` (500, its
        health text) when it is not."""
        await self._call(NSQDAPI.ping())

    async def info(self) -> NSQDInfo:
        """Version, addresses and limits (``/info``)."""
        return await self._call(NSQDAPI.info())

    async def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        *,
        include_clients: bool = True,
        include_memory: bool = False,
    ) -> NSQDStats:
        """``/stats``, optionally only ``topic`` (and ``channel``); an unknown topic gives
        no topics, not an error."""
        request = NSQDAPI.stats(
            topic, channel, include_clients=include_clients, include_memory=include_memory
        )
        return await self._call(request)

    async def topic_stats(self, topic: str) -> TopicStats:
        """One topic's stats; :class:`~nsq_sansio.admin.TopicNotFound` if nsqd has none."""
        return await self._call(NSQDAPI.topic_stats(topic))

    async def channel_stats(self, topic: str, channel: str) -> ChannelStats:
        """One channel's stats and :attr:`~nsq_sansio.admin.ChannelStats.lag`;
        ``TopicNotFound`` / ``ChannelNotFound`` when it does not exist."""
        return await self._call(NSQDAPI.channel_stats(topic, channel))

    async def create_topic(self, topic: str) -> None:
        """Create the topic (nothing changes if it exists)."""
        await self._call(NSQDAPI.create_topic(topic))

    async def delete_topic(self, topic: str) -> None:
        """Delete the topic, its channels and their messages."""
        await self._call(NSQDAPI.delete_topic(topic))

    async def empty_topic(self, topic: str) -> None:
        """Drop the messages waiting in the topic (not those already in its channels)."""
        await self._call(NSQDAPI.empty_topic(topic))

    async def pause_topic(self, topic: str) -> None:
        """Hold published messages in the topic; no channel gets them until unpaused."""
        await self._call(NSQDAPI.pause_topic(topic))

    async def unpause_topic(self, topic: str) -> None:
        """Let the topic's messages flow to its channels again."""
        await self._call(NSQDAPI.unpause_topic(topic))

    async def create_channel(self, topic: str, channel: str) -> None:
        """Create a channel on an existing topic; it gets every message published from now."""
        await self._call(NSQDAPI.create_channel(topic, channel))

    async def delete_channel(self, topic: str, channel: str) -> None:
        """Delete the channel and its messages; its consumers are disconnected."""
        await self._call(NSQDAPI.delete_channel(topic, channel))

    async def empty_channel(self, topic: str, channel: str) -> None:
        """Drop the channel's queued messages (memory and disk)."""
        await self._call(NSQDAPI.empty_channel(topic, channel))

    async def pause_channel(self, topic: str, channel: str) -> None:
        """Stop deliveries to the channel's consumers; messages keep queueing."""
        await self._call(NSQDAPI.pause_channel(topic, channel))

    async def unpause_channel(self, topic: str, channel: str) -> None:
        """Resume deliveries to the channel's consumers."""
        await self._call(NSQDAPI.unpause_channel(topic, channel))


class LookupdAdmin(_AdminClient):
    """nsqlookupd's HTTP API: nodes, topics, channels, the producers of a topic, tombstones,
    registering and forgetting topics and channels. ``url`` is its HTTP address
    (``http://host:4161``)."""

    _default_port = DEFAULT_LOOKUPD_HTTP_PORT

    def __init__(
        self,
        url: str | AdminEndpoint = "http://127.0.0.1:4161",
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        tls: TLSOptions | ssl.SSLContext | None = None,
        max_response_size: int = DEFAULT_MAX_BODY_SIZE,
        user_agent: str = "nsq-sansio",
    ) -> None:
        super().__init__(
            url,
            timeout=timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            max_response_size=max_response_size,
            user_agent=user_agent,
        )

    async def ping(self) -> None:
        """Returns when nsqlookupd answers ``/ping``."""
        await self._call(LookupdAPI.ping())

    async def info(self) -> LookupdInfo:
        """nsqlookupd's version."""
        return await self._call(LookupdAPI.info())

    async def nodes(self) -> tuple[LookupdNode, ...]:
        """Every nsqd registered, with its topics and which of them are tombstoned."""
        return await self._call(LookupdAPI.nodes())

    async def topics(self) -> tuple[str, ...]:
        """Every topic known, sorted."""
        return await self._call(LookupdAPI.topics())

    async def channels(self, topic: str) -> tuple[str, ...]:
        """The topic's channels, sorted (none for an unknown topic)."""
        return await self._call(LookupdAPI.channels(topic))

    async def lookup(self, topic: str) -> TopicLookup:
        """The nsqd producing ``topic`` and its channels; ``TopicNotFound`` if unknown."""
        return await self._call(LookupdAPI.lookup(topic))

    async def create_topic(self, topic: str) -> None:
        """Register a topic that no nsqd has yet."""
        await self._call(LookupdAPI.create_topic(topic))

    async def delete_topic(self, topic: str) -> None:
        """Forget the topic here (delete it on its nsqd too, or they register it again)."""
        await self._call(LookupdAPI.delete_topic(topic))

    async def create_channel(self, topic: str, channel: str) -> None:
        """Register a channel (and its topic)."""
        await self._call(LookupdAPI.create_channel(topic, channel))

    async def delete_channel(self, topic: str, channel: str) -> None:
        """Forget the channel here; ``ChannelNotFound`` when it is not registered."""
        await self._call(LookupdAPI.delete_channel(topic, channel))

    async def tombstone(self, topic: str, node: str | LookupdProducer) -> None:
        """Hide one nsqd (``broadcast_address:http_port``, or a producer or node from
        :meth:`lookup` / :meth:`nodes`) from the topic's lookups for the tombstone lifetime."""
        await self._call(LookupdAPI.tombstone(topic, node))

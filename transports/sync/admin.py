"""Operate nsqd and nsqlookupd from blocking code: :class:`NSQDAdmin` and
:class:`LookupdAdmin` over their HTTP API.

::

    with NSQDAdmin("http://127.0.0.1:4151") as nsqd:
        lag = nsqd.channel_stats("orders", "billing").lag
        nsqd.pause_channel("orders", "billing")

Every call is built and read by :mod:`nsq_sansio.admin` (typed answers, typed errors), over one
keep-alive connection while inside ``with`` (a connection per call outside it). A call that
takes longer than ``timeout`` raises :class:`TimeoutError`; a connection that cannot be made
or breaks raises :class:`~nsq_sansio.errors.ConnectionLost`. Thread-safe: calls from several
threads take turns on the connection. The async twins, same names and signatures, are in
:mod:`transports.anyio.admin`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any, ClassVar, TypeVar

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


class _Stale(Exception):
    """The request failed before any byte of an answer (``error`` says how): on a kept-alive
    connection that the server had closed, sending it again on a fresh one is safe."""

    def __init__(self, error: ConnectionLost) -> None:
        super().__init__(str(error))
        self.error = error


class _Connection:
    __slots__ = ("http", "sock")

    def __init__(self, sock: socket.socket, http: HTTPClient) -> None:
        self.sock = sock
        self.http = http

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def _remaining(deadline: float, timeout: float) -> float:
    """Seconds left before ``deadline``; :class:`TimeoutError` when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"no answer in {timeout:g}s")
    return left


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
        self._lock = threading.Lock()
        self._conn: _Connection | None = None
        self._keep_alive = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.endpoint)!r})"

    def __enter__(self: _Self) -> _Self:
        self._keep_alive = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the kept-alive connection (calls after this open a connection each)."""
        with self._lock:
            self._keep_alive = False
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _call(self, request: AdminRequest[T]) -> T:
        deadline = time.monotonic() + self._timeout  # waiting for another call's turn included
        if not self._lock.acquire(timeout=self._timeout):
            raise TimeoutError(f"no answer in {self._timeout:g}s")
        try:
            answer = self._exchange(request, deadline)
        finally:
            self._lock.release()
        return request.read(answer, self.endpoint)

    def _exchange(self, request: AdminRequest[Any], deadline: float) -> HTTPAnswer:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                return self._round_trip(conn, request, deadline)
            except _Stale:
                pass  # the server closed it while it was idle: once more, on a fresh one
        conn = self._connect(deadline)
        try:
            return self._round_trip(conn, request, deadline)
        except _Stale as exc:
            raise exc.error from None

    def _connect(self, deadline: float) -> _Connection:
        endpoint = self.endpoint
        limit = min(self._connect_timeout, _remaining(deadline, self._timeout))
        sock: socket.socket | None = None
        try:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=limit)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl_context is not None:
                sock = self._ssl_context.wrap_socket(
                    sock, server_hostname=self._tls.server_hostname(endpoint.host)
                )
        except TimeoutError:
            if sock is not None:
                sock.close()
            if limit < self._connect_timeout:
                raise TimeoutError(f"no answer in {self._timeout:g}s") from None
            raise ConnectionLost(
                f"connecting to {endpoint} timed out after {self._connect_timeout:g}s"
            ) from None
        except OSError as exc:  # ssl.SSLError is one
            if sock is not None:
                sock.close()
            raise ConnectionLost(f"cannot connect to {endpoint}: {exc}") from exc
        http = HTTPClient(
            endpoint.host_header,
            max_body_size=self._max_response_size,
            user_agent=self._user_agent,
        )
        return _Connection(sock, http)

    def _round_trip(
        self, conn: _Connection, request: AdminRequest[Any], deadline: float
    ) -> HTTPAnswer:
        keep = False
        try:
            data = conn.http.request(request.method, request.target(self.endpoint.path_prefix))
            try:
                conn.sock.settimeout(_remaining(deadline, self._timeout))
                conn.sock.sendall(data)
                while True:
                    conn.sock.settimeout(_remaining(deadline, self._timeout))
                    answer = conn.http.receive_data(conn.sock.recv(_READ_SIZE))
                    if answer is not None:
                        keep = answer.keep_alive and self._keep_alive
                        return answer
            except TimeoutError:
                raise TimeoutError(f"no answer in {self._timeout:g}s") from None
            except OSError as exc:
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
                conn.close()


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

    def ping(self) -> None:
        """Returns when nsqd is healthy; :class:`~nsq_sansio.admin.AdminHTTPError` (500, its
        health text) when it is not."""
        self._call(NSQDAPI.ping())

    def info(self) -> NSQDInfo:
        """Version, addresses and limits (``/info``)."""
        return self._call(NSQDAPI.info())

    def stats(
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
        return self._call(request)

    def topic_stats(self, topic: str) -> TopicStats:
        """One topic's stats; :class:`~nsq_sansio.admin.TopicNotFound` if nsqd has none."""
        return self._call(NSQDAPI.topic_stats(topic))

    def channel_stats(self, topic: str, channel: str) -> ChannelStats:
        """One channel's stats and :attr:`~nsq_sansio.admin.ChannelStats.lag`;
        ``TopicNotFound`` / ``ChannelNotFound`` when it does not exist."""
        return self._call(NSQDAPI.channel_stats(topic, channel))

    def create_topic(self, topic: str) -> None:
        """Create the topic (nothing changes if it exists)."""
        self._call(NSQDAPI.create_topic(topic))

    def delete_topic(self, topic: str) -> None:
        """Delete the topic, its channels and their messages."""
        self._call(NSQDAPI.delete_topic(topic))

    def empty_topic(self, topic: str) -> None:
        """Drop the messages waiting in the topic (not those already in its channels)."""
        self._call(NSQDAPI.empty_topic(topic))

    def pause_topic(self, topic: str) -> None:
        """Hold published messages in the topic; no channel gets them until unpaused."""
        self._call(NSQDAPI.pause_topic(topic))

    def unpause_topic(self, topic: str) -> None:
        """Let the topic's messages flow to its channels again."""
        self._call(NSQDAPI.unpause_topic(topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Create a channel on an existing topic; it gets every message published from now."""
        self._call(NSQDAPI.create_channel(topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Delete the channel and its messages; its consumers are disconnected."""
        self._call(NSQDAPI.delete_channel(topic, channel))

    def empty_channel(self, topic: str, channel: str) -> None:
        """Drop the channel's queued messages (memory and disk)."""
        self._call(NSQDAPI.empty_channel(topic, channel))

    def pause_channel(self, topic: str, channel: str) -> None:
        """Stop deliveries to the channel's consumers; messages keep queueing."""
        self._call(NSQDAPI.pause_channel(topic, channel))

    def unpause_channel(self, topic: str, channel: str) -> None:
        """Resume deliveries to the channel's consumers."""
        self._call(NSQDAPI.unpause_channel(topic, channel))


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

    def ping(self) -> None:
        """Returns when nsqlookupd answers ``/ping``."""
        self._call(LookupdAPI.ping())

    def info(self) -> LookupdInfo:
        """nsqlookupd's version."""
        return self._call(LookupdAPI.info())

    def nodes(self) -> tuple[LookupdNode, ...]:
        """Every nsqd registered, with its topics and which of them are tombstoned."""
        return self._call(LookupdAPI.nodes())

    def topics(self) -> tuple[str, ...]:
        """Every topic known, sorted."""
        return self._call(LookupdAPI.topics())

    def channels(self, topic: str) -> tuple[str, ...]:
        """The topic's channels, sorted (none for an unknown topic)."""
        return self._call(LookupdAPI.channels(topic))

    def lookup(self, topic: str) -> TopicLookup:
        """The nsqd producing ``topic`` and its channels; ``TopicNotFound`` if unknown."""
        return self._call(LookupdAPI.lookup(topic))

    def create_topic(self, topic: str) -> None:
        """Register a topic that no nsqd has yet."""
        self._call(LookupdAPI.create_topic(topic))

    def delete_topic(self, topic: str) -> None:
        """Forget the topic here (delete it on its nsqd too, or they register it again)."""
        self._call(LookupdAPI.delete_topic(topic))

    def create_channel(self, topic: str, channel: str) -> None:
        """Register a channel (and its topic)."""
        self._call(LookupdAPI.create_channel(topic, channel))

    def delete_channel(self, topic: str, channel: str) -> None:
        """Forget the channel here; ``ChannelNotFound`` when it is not registered."""
        self._call(LookupdAPI.delete_channel(topic, channel))

    def tombstone(self, topic: str, node: str | LookupdProducer) -> None:
        """Hide one nsqd (``broadcast_address:http_port``, or a producer or node from
        :meth:`lookup` / :meth:`nodes`) from the topic's lookups for the tombstone lifetime."""
        self._call(LookupdAPI.tombstone(topic, node))

"""anyio producers: TCP (a pool over several nsqd, pipelined) and HTTP (``/pub``, ``/mpub``).

:class:`Producer` keeps one connection per nsqd, opened on first use. Publishes go round-robin
over the nodes that are up; many are in flight on one connection at once and their answers
are matched in order by the core (:class:`~nsq_sansio.connection.ClientConnection`). When a
connection breaks, the publishes it had not confirmed are retried on the next node (so a
publish is at-least-once, like every NSQ publish); an error answer from nsqd (``E_BAD_TOPIC``,
``E_PUB_FAILED``...) is raised as is. Back-pressure: at most ``max_pending`` publishes wait for
their answer; the next ``await publish(...)`` waits for a slot, nothing buffers without bound.
"""

from __future__ import annotations

import itertools
import logging
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import ConnectionLost, LocalProtocolError, NSQError, ServerError
from nsq_sansio.events import (
    ConnectionClosed,
    ConnectionReady,
    PublishAcknowledged,
    PublishFailed,
    TLSUpgradeRequired,
)
from nsq_sansio.names import validate_topic
from transports._common import (
    DEFAULT_HTTP_PORT,
    DEFAULT_TCP_PORT,
    HTTPURL,
    READ_SIZE,
    ConnectionLogger,
    ConnectionStats,
    HTTPPublishClient,
    ProducerStats,
    PubResponse,
    format_address,
    parse_address,
    parse_http_url,
    split_options,
)

from ._net import connect, start_tls

__all__ = ["HTTPProducer", "NoNSQDAvailable", "Producer"]

_log = logging.getLogger("nsq_sansio.anyio.producer")

_SOCKET_ERRORS = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)


class NoNSQDAvailable(NSQError):
    """Every nsqd of the pool failed for this publish; ``errors`` says why, node by node."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        detail = "; ".join(str(e) for e in errors) or "no nsqd configured"
        super().__init__(f"no nsqd could take the publish: {detail}")
        self.errors = tuple(errors)


class _Pending:
    __slots__ = ("deadline", "error", "event")

    def __init__(self, deadline: float) -> None:
        self.event = anyio.Event()
        self.error: NSQError | TimeoutError | None = None
        self.deadline = deadline


class _Node:
    """One nsqd and its (at most one) connection."""

    def __init__(self, host: str, port: int, log: ConnectionLogger) -> None:
        self.host = host
        self.port = port
        self.address = format_address(host, port)
        self.log = log
        self.proto: ClientConnection | None = None
        self.stream: anyio.abc.ByteStream | None = None
        self.ready = False
        self.connecting: anyio.Event | None = None
        self.scope: anyio.CancelScope | None = None
        self.pending: dict[int, _Pending] = {}
        self.wake = anyio.Event()
        self.last_error: str | None = None
        self.down_until = 0.0
        self.connects = 0
        self.published = 0
        self.bytes_in = 0
        self.bytes_out = 0


class Producer:
    """Publish to one or several nsqd over TCP; use as ``async with``.

    Keyword arguments are Config fields (``snappy``, ``deflate``, ``auth_secret``,
    ``heartbeat_interval``...) or transport options (``connect_timeout``, ``tls=...``,
    ``tls_ca_file=...``). ``timeout`` bounds one publish (waiting for the answer included).
    """

    def __init__(
        self,
        nsqd: str | Sequence[str] = "127.0.0.1:4150",
        *,
        config: Config | None = None,
        max_pending: int = 10_000,
        timeout: float = 30.0,
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending!r} must be >= 1")
        self._config, self._options = split_options(config, options)
        self._identify = self._config.identify_body()
        self._logger = logger or _log
        self._nodes = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            self._nodes.append(
                _Node(host, port, ConnectionLogger(self._logger, format_address(host, port)))
            )
        self._timeout = timeout
        self._free = max_pending
        self._slot_waiters: deque[anyio.Event] = deque()
        self._watchdog: anyio.Event | None = None
        self._max_pending = max_pending
        self._rr = itertools.count()
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._published = 0
        self._failed = 0
        self._retried = 0

    # --- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        if tg is None:
            return None
        try:
            await self.close()
        finally:
            tg.cancel_scope.cancel()
        return await tg.__aexit__(exc_type, exc, tb)

    async def close(self, timeout: float | None = 5.0) -> None:
        """Wait (up to ``timeout``) for publishes in flight, then close every connection."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                for node in self._nodes:
                    while node.pending:
                        await next(iter(node.pending.values())).event.wait()
            for node in self._nodes:
                self._disconnect(node, ConnectionLost("producer closed"))

    # --- publishing ----------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes) -> None:
        """``PUB``: returns once nsqd confirmed it."""
        validate_topic(topic)
        await self._request(lambda proto: proto.publish(topic, body))

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``MPUB``: all or nothing, one answer."""
        validate_topic(topic)
        if not bodies:
            raise ValueError("multi_publish needs at least one body")
        await self._request(lambda proto: proto.multi_publish(topic, bodies))

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """``DPUB``: deliverable after ``delay`` seconds."""
        validate_topic(topic)
        if not delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        await self._request(lambda proto: proto.deferred_publish(topic, body, delay))

    def _candidates(self) -> list[_Node]:
        start = next(self._rr) % len(self._nodes)
        ordered = self._nodes[start:] + self._nodes[:start]
        now = monotonic()
        # Nodes that are up (or not known to be down) first; then the rest, as a last resort.
        return [n for n in ordered if n.down_until <= now] + [
            n for n in ordered if n.down_until > now
        ]

    async def _request(self, build: Callable[[ClientConnection], int]) -> None:
        if self._tg is None:
            raise LocalProtocolError("use the Producer as `async with Producer(...) as p:`")
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        # Back-pressure without a checkpoint per publish while slots are free.
        if self._free > 0:
            self._free -= 1
        else:
            await self._wait_for_slot()
        try:
            deadline = monotonic() + self._timeout
            errors: list[BaseException] = []
            node = self._nodes[next(self._rr) % len(self._nodes)]
            candidates = [node] if node.ready else self._candidates()
            sent = 0
            i = 0
            while i < len(candidates):
                node = candidates[i]
                i += 1
                if errors:
                    self._retried += 1
                try:
                    with anyio.fail_after(max(deadline - monotonic(), 0)):
                        proto = await self._ensure(node)
                except (NSQError, TimeoutError) as exc:
                    errors.append(exc)
                    if len(candidates) == 1 and len(self._nodes) > 1:
                        candidates = [node, *(n for n in self._candidates() if n is not node)]
                    continue
                pending = _Pending(deadline)
                request_id = build(proto)
                sent += 1
                node.pending[request_id] = pending
                node.wake.set()
                if self._watchdog is None:
                    self._watchdog = anyio.Event()
                    assert self._tg is not None
                    self._tg.start_soon(self._expire_pending)
                await pending.event.wait()
                error = pending.error
                if error is None:
                    node.published += 1
                    self._published += 1
                    return
                if isinstance(error, ServerError | TimeoutError):
                    self._failed += 1
                    raise error
                errors.append(error)
                if len(candidates) == 1 and len(self._nodes) > 1:
                    candidates = [node, *(n for n in self._candidates() if n is not node)]
                if i >= len(candidates) and sent <= len(self._nodes):
                    # The connection died with this publish unanswered, maybe not the node
                    # (nsqd closes it after a fatal error for another publish pipelined
                    # before ours, which it then never read): send it again after a
                    # reconnect, like the blocking producer (at most one more send).
                    candidates.append(node)
            self._failed += 1
            raise NoNSQDAvailable(errors)
        finally:
            self._release_slot()

    async def _wait_for_slot(self) -> None:
        event = anyio.Event()
        self._slot_waiters.append(event)
        try:
            await event.wait()
        except BaseException:
            if event.is_set():  # the slot was handed to us: pass it on
                self._release_slot()
            else:
                self._slot_waiters.remove(event)
            raise

    def _release_slot(self) -> None:
        if self._slot_waiters:
            self._slot_waiters.popleft().set()  # hand the slot over directly
        else:
            self._free += 1

    async def _expire_pending(self) -> None:
        """Fail publishes unanswered past their deadline (one cheap timer, not one per call)."""
        tick = min(max(self._timeout / 4, 0.01), 1.0)
        while True:
            await anyio.sleep(tick)
            now = monotonic()
            for node in self._nodes:
                for request_id, pending in list(node.pending.items()):
                    if now >= pending.deadline:
                        del node.pending[request_id]
                        pending.error = TimeoutError(
                            f"no answer from {node.address} after {self._timeout:g}s"
                        )
                        pending.event.set()

    # --- connections ---------------------------------------------------------------------------

    async def _ensure(self, node: _Node) -> ClientConnection:
        while True:
            if node.ready and node.proto is not None:
                return node.proto
            if node.connecting is None:
                node.connecting = anyio.Event()
                assert self._tg is not None
                self._tg.start_soon(self._connection, node)
            event = node.connecting
            await event.wait()
            if not node.ready:
                raise ConnectionLost(f"{node.address}: {node.last_error or 'connect failed'}")

    async def _connection(self, node: _Node) -> None:
        options = self._options
        scope = node.scope = anyio.CancelScope()
        stream: anyio.abc.ByteStream | None = None
        error: NSQError | None = None
        try:
            with scope:
                try:
                    with anyio.fail_after(options.connect_timeout + 5):
                        stream, proto = await self._handshake(node)
                except TimeoutError:
                    raise ConnectionLost("handshake timed out") from None
                node.stream = stream
                node.proto = proto
                node.ready = True
                node.connects += 1
                if node.connects > 1:
                    node.log.info("reconnected")
                node.last_error = None
                node.down_until = 0.0
                if node.connecting is not None:
                    node.connecting.set()
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer, node, stream, proto)
                    error = await self._reader(node, stream, proto)
                    tg.cancel_scope.cancel()
        except (*_SOCKET_ERRORS, NSQError) as exc:
            error = exc if isinstance(exc, NSQError) else ConnectionLost(str(exc))
        finally:
            if error is not None:
                node.log.warning("connection lost: %s", error)
            self._disconnect(node, error or ConnectionLost("connection closed"))
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)

    async def _handshake(self, node: _Node) -> tuple[anyio.abc.ByteStream, ClientConnection]:
        options = self._options
        stream: anyio.abc.ByteStream = await connect(node.host, node.port, options.connect_timeout)
        proto = ClientConnection(self._identify, auth_secret=self._config.auth_secret)
        try:
            await stream.send(proto.data_to_send())
            while True:
                try:
                    data = await stream.receive(READ_SIZE)
                except anyio.EndOfStream:
                    data = b""
                for event in proto.receive_data(data, monotonic()):
                    if isinstance(event, TLSUpgradeRequired):
                        stream = await start_tls(
                            stream,
                            options.ssl_context(),
                            options.tls.server_hostname(node.host),
                            event.trailing_data,
                            options.connect_timeout,
                        )
                        proto.tls_established()
                    elif isinstance(event, ConnectionReady):
                        out = proto.data_to_send()
                        if out:
                            await stream.send(out)
                        return stream, proto
                    elif isinstance(event, ConnectionClosed):
                        raise event.error or ConnectionLost("closed during the handshake")
                out = proto.data_to_send()
                if out:
                    await stream.send(out)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(stream)
            raise

    async def _reader(
        self, node: _Node, stream: anyio.abc.ByteStream, proto: ClientConnection
    ) -> NSQError | None:
        while True:
            deadline = proto.next_deadline()
            data: bytes | None = None
            with anyio.move_on_after(
                max(deadline - monotonic(), 0) if deadline is not None else float("inf")
            ):
                try:
                    data = await stream.receive(READ_SIZE)
                except anyio.EndOfStream:
                    data = b""
            now = monotonic()
            events = proto.handle_timer(now) if data is None else proto.receive_data(data, now)
            node.bytes_in += len(data or b"")
            for event in events:
                if isinstance(event, PublishAcknowledged):
                    pending = node.pending.pop(event.request_id, None)
                    if pending is not None:
                        pending.event.set()
                elif isinstance(event, PublishFailed):
                    pending = node.pending.pop(event.request_id, None)
                    if pending is not None:
                        pending.error = event.error
                        pending.event.set()
                elif isinstance(event, ConnectionClosed):
                    return event.error or ConnectionLost("nsqd closed the connection")
            node.wake.set()  # NOP for heartbeats

    async def _writer(
        self, node: _Node, stream: anyio.abc.ByteStream, proto: ClientConnection
    ) -> None:
        while True:
            await node.wake.wait()
            node.wake = anyio.Event()
            data = proto.data_to_send()
            if data:
                await stream.send(data)
                node.bytes_out += len(data)

    def _disconnect(self, node: _Node, error: NSQError) -> None:
        was_ready = node.ready
        node.ready = False
        if node.proto is not None:
            node.proto.close()
            node.proto = None
        if error is not None and not isinstance(error, ConnectionLost | ServerError):
            error = ConnectionLost(str(error))
        node.last_error = str(error)
        if not self._closed:
            node.down_until = monotonic() + 1.0
        del was_ready
        for pending in node.pending.values():
            pending.error = (
                error if not isinstance(error, ServerError) else ConnectionLost(str(error))
            )
            pending.event.set()
        node.pending.clear()
        if node.connecting is not None:
            node.connecting.set()
            node.connecting = None
        if node.scope is not None:
            node.scope.cancel()
            node.scope = None

    # --- stats ---------------------------------------------------------------------------------

    def stats(self) -> ProducerStats:
        """A snapshot of the counters and connections. Safe to call from another thread (a
        metrics scrape) while the event loop runs: it only reads fields and sizes."""
        return ProducerStats(
            published=self._published,
            failed=self._failed,
            pending=sum(len(n.pending) for n in self._nodes),
            reconnects=sum(max(n.connects - 1, 0) for n in self._nodes),
            connections=tuple(
                ConnectionStats(
                    address=n.address,
                    state="ready" if n.ready else "down" if n.last_error else "idle",
                    connected=n.ready,
                    reconnects=max(n.connects - 1, 0),
                    bytes_received=n.bytes_in,
                    bytes_sent=n.bytes_out,
                    last_error=n.last_error,
                )
                for n in self._nodes
            ),
        )

    @property
    def retried(self) -> int:
        """Publishes sent again to another nsqd after a connection failure."""
        return self._retried


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
                    except (*_SOCKET_ERRORS, NSQError) as exc:
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
            except (*_SOCKET_ERRORS, NSQError) as exc:
                if answered:
                    raise
                raise _StaleConnection(exc) from exc
        finally:
            if keep:
                idle.append((stream, client))
            else:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)

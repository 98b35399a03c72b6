"""The anyio producer's connections: one per nsqd (:class:`Node`), its handshake, reads and
writes, and what happens to the publishes it held when it breaks.

:class:`ProducerConnections` is a part of :class:`~transports.anyio.producer.Producer` (its
base class). A connection is opened on first use (``_ensure``); on asyncio with plain TCP the
event loop calls ``_on_readable`` when the socket has data (no reader task), elsewhere a reader
task reads; a writer task sends what direct writes could not. ``_disconnect`` tears one down
once and hands its unanswered publishes (:class:`Call`) back for failover.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import (
    CoalescedPublishRefused,
    ConnectionLost,
    IncompatibleNSQD,
    NSQError,
    ServerError,
)
from nsq_sansio.events import (
    ConnectionClosed,
    ConnectionReady,
    Heartbeat,
    PublishAcknowledged,
    PublishFailed,
    TLSUpgradeRequired,
)
from transports._common import READ_SIZE, ConnectionLogger, TransportOptions, format_address
from transports._common.failures import at_address, describe, handshake_timed_out
from transports._common.logs import fields
from transports._common.reports import (
    log_coalesced_refused,
    log_producer_disconnect,
    log_publish_refused,
)

from ._backend import Backend
from ._net import SOCKET_ERRORS, connect, plain_socket, start_tls

__all__ = ["Call", "Node", "NotRead", "ProducerConnections", "SendAlone"]

_wait_writable: Callable[[socket.socket], Any] = getattr(
    anyio, "wait_writable", anyio.wait_socket_writable
)


class NotRead(ConnectionLost):
    """The connection closed after nsqd refused a publish ahead of this one: nsqd stopped
    reading there, so this one was never read (not stored): safe to send again, and it does
    not count against the publish's retries (another publish's refusal is not its fault)."""


def _as_nsq_error(exc: BaseException) -> NSQError:
    """A socket error as the ``ConnectionLost`` it means (chained); an ``NSQError`` as it is."""
    if isinstance(exc, NSQError):
        return exc
    lost = ConnectionLost(describe(exc))
    lost.__cause__ = exc
    return lost


class SendAlone(NotRead):
    """nsqd refused the MPUB this PUB was coalesced into (all or nothing: not stored): send it
    again as a PUB of its own, so that only a publish at fault itself fails."""


class Call:
    """One publish waiting for its answer (one per call, reused by its failover attempts).

    ``waker`` is what the publishing task parks on: an asyncio future, or a trio task; an
    answer that comes before the task parked is kept in ``result`` (``done``). ``orphan`` is
    set when the caller stopped waiting (cancelled): the answer is still matched to this
    request, then reported to the observer. ``suspect``: it was lost with other publishes
    unanswered on a connection that broke (a reset), so its next send goes alone (see
    :attr:`Node.suspects`); ``bound`` is the node it counts there as a suspect of.
    """

    __slots__ = (
        "bound",
        "count",
        "deadline",
        "done",
        "kind",
        "orphan",
        "result",
        "start",
        "suspect",
        "topic",
        "waker",
    )

    def __init__(self, kind: str, topic: str, count: int, start: float, deadline: float) -> None:
        self.kind = kind
        self.topic = topic
        self.count = count
        self.start = start
        self.deadline = deadline
        self.waker: Any = None
        self.done = False
        self.result: BaseException | None = None
        self.orphan = False
        self.suspect = False
        self.bound: Node | None = None


class Node:
    """One nsqd and its (at most one) connection."""

    def __init__(self, host: str, port: int, log: ConnectionLogger) -> None:
        self.host = host
        self.port = port
        self.address = format_address(host, port)
        self.log = log
        self.proto: ClientConnection | None = None
        self.stream: anyio.abc.ByteStream | None = None
        self.ready = False
        #: The TCP connection is up and the handshake (IDENTIFY, TLS, AUTH) under way.
        self.handshaking = False
        #: Bumped for every connection attempt: a finished attempt only tears down its own.
        self.generation = 0
        self.down_generation = -1  # the last attempt torn down (teardown happens once)
        self.reader_fd: int | None = None  # asyncio: the descriptor the loop watches for us
        self.connecting: anyio.Event | None = None
        self.scope: anyio.CancelScope | None = None
        self.pending: dict[int, Call] = {}
        #: Suspect publishes (lost in a reset with others) bound for this node: while there
        #: are any, it sends one publish at a time, each once nothing else is in flight.
        self.suspects = 0
        #: Publishes waiting for their turn to be sent alone, first come first served.
        self.turns: deque[anyio.Event] = deque()
        #: A turn was handed to the first waiter, which has not yet taken it.
        self.granted = False
        self.wake = anyio.Event()
        self.wake_set = False
        #: Plain TCP: the socket, written directly (no task switch); bytes the kernel did not
        #: take wait in ``out`` for the writer task. None with TLS: the writer task sends.
        self.sock: socket.socket | None = None
        self.sock_owned = False  # ``sock`` is our duplicate of the stream's descriptor
        self.out = bytearray()
        self.flush_scheduled = False
        self.last_error: str | None = None
        #: Why the last attempt or connection failed (``last_error`` is its text).
        self.last_exc: NSQError | None = None
        #: The last attempt's error when it was a configuration error (a refused IDENTIFY).
        self.config_error: IncompatibleNSQD | None = None
        self.down_until = 0.0
        self.connects = 0
        self.published = 0
        self.bytes_in = 0
        self.bytes_out = 0

    @property
    def state(self) -> str:
        """The stats' name for where it is (see ``transports._common.stats``)."""
        if self.ready:
            return "ready"
        if self.connecting is not None:
            return "handshaking" if self.handshaking else "connecting"
        return "closed"


class ProducerConnections:
    """The producer's connections (a base class of ``Producer``)."""

    # What they use of the producer (set by Producer.__init__ and __aenter__):
    _config: Config
    _options: TransportOptions
    _closed: bool
    _shut: bool
    _tg: anyio.abc.TaskGroup | None
    _backend: Backend | None
    _timer_started: bool

    if TYPE_CHECKING:

        async def _timer(self) -> None: ...

        def _resolve(self, call: Call, error: BaseException | None) -> None: ...

        def _write_now(self, node: Node, proto: ClientConnection) -> None: ...

    # --- connections ---------------------------------------------------------------------------

    async def _ensure(self, node: Node) -> ClientConnection:
        while True:
            if node.ready and node.proto is not None:
                return node.proto
            if self._shut:  # a closed producer never connects again
                raise ConnectionLost(f"{node.address}: the producer is closed")
            if node.connecting is None:
                node.connecting = anyio.Event()
                node.config_error = None
                node.generation += 1
                assert self._tg is not None
                self._tg.start_soon(self._connection, node, node.generation)
            event = node.connecting
            await event.wait()
            if not node.ready:
                if node.config_error is not None:
                    raise node.config_error
                error = node.last_exc or ConnectionLost("connection failed")
                raise at_address(node.address, error)

    async def _connection(self, node: Node, generation: int) -> None:
        options = self._options
        scope = node.scope = anyio.CancelScope()
        stream: anyio.abc.ByteStream | None = None
        error: NSQError | None = None
        try:
            with scope:
                stream, proto = await self._handshake(node, options.connect_timeout)
                node.stream = stream
                node.proto = proto
                node.out.clear()
                node.flush_scheduled = False
                node.sock, node.sock_owned = plain_socket(stream)
                add_reader = self._backend.add_reader  # type: ignore[union-attr]
                if add_reader is not None and node.sock is not None:
                    # asyncio, plain TCP: the loop calls _on_readable; _disconnect stops it.
                    try:
                        fd = node.sock.fileno()
                        add_reader(fd, self._on_readable, node, proto, generation)
                        node.reader_fd = fd
                    except NotImplementedError:  # a loop without readiness callbacks
                        if node.sock_owned:
                            node.sock.close()
                        node.sock = None  # the stream, a reader and a writer task do it all
                node.ready = True
                node.connects += 1
                if node.connects > 1:
                    node.log.info("reconnected", extra=fields(state="ready"))
                node.last_error = None
                node.down_until = 0.0
                if node.connecting is not None:
                    node.connecting.set()
                    node.connecting = None
                if not self._timer_started:
                    self._timer_started = True
                    assert self._tg is not None
                    self._tg.start_soon(self._timer)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._writer, node, stream, proto, generation)
                    try:
                        if node.reader_fd is not None:
                            await anyio.sleep_forever()
                        await self._reader(node, stream, proto, generation)
                    except (*SOCKET_ERRORS, NSQError) as exc:
                        # Caught here, not around the task group, which would wrap it in an
                        # ExceptionGroup that no ``except`` below matches (a reset by nsqd
                        # would then end the whole producer).
                        error = _as_nsq_error(exc)
                    tg.cancel_scope.cancel()
        except (*SOCKET_ERRORS, NSQError) as exc:
            error = _as_nsq_error(exc)
        finally:
            self._disconnect(node, error or ConnectionLost("connection closed"), generation)
            if stream is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.aclose_forcefully(stream)

    async def _handshake(
        self, node: Node, timeout: float
    ) -> tuple[anyio.abc.ByteStream, ClientConnection]:
        """Connect and handshake (IDENTIFY, TLS, AUTH), all within ``timeout`` seconds."""
        deadline = monotonic() + timeout
        node.handshaking = False
        stream: anyio.abc.ByteStream = await connect(node.host, node.port, timeout)
        node.handshaking = True
        try:
            with anyio.fail_after(max(deadline - monotonic(), 0)):
                return await self._identify_on(node, stream, deadline)
        except TimeoutError:
            with anyio.CancelScope(shield=True):
                await anyio.aclose_forcefully(stream)
            raise handshake_timed_out(node.address, timeout) from None
        finally:
            node.handshaking = False

    async def _identify_on(
        self, node: Node, stream: anyio.abc.ByteStream, deadline: float
    ) -> tuple[anyio.abc.ByteStream, ClientConnection]:
        options = self._options
        proto = ClientConnection.from_config(self._config, peer=node.address)
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
                            max(deadline - monotonic(), 0.001),
                            address=node.address,
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
        self,
        node: Node,
        stream: anyio.abc.ByteStream,
        proto: ClientConnection,
        generation: int,
    ) -> None:
        """Read until the connection closes (TLS, or trio: a task reading the stream)."""
        sock = node.sock
        wait_readable = self._backend.wait_readable  # type: ignore[union-attr]
        if sock is not None and wait_readable is not None:
            await self._read_socket(node, sock, proto, generation, wait_readable)
            return
        receive = stream.receive
        while True:
            try:
                data = await receive(READ_SIZE)
            except anyio.EndOfStream:
                data = b""
            if self._feed(node, proto, generation, data):
                return

    async def _read_socket(
        self,
        node: Node,
        sock: socket.socket,
        proto: ClientConnection,
        generation: int,
        wait_readable: Callable[[socket.socket], Awaitable[None]],
    ) -> None:
        """trio, plain TCP: wait for the socket to be readable, then read it (no failed read
        first, none of the stream's layers)."""
        recv = sock.recv
        while True:
            try:
                await wait_readable(sock)
            except Exception:
                if node.sock is sock:
                    raise
                return  # _disconnect closed it (trio's ClosedResourceError): torn down already
            try:
                data = recv(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                raise ConnectionLost(str(exc)) from exc
            if self._feed(node, proto, generation, data):
                return

    def _on_readable(self, node: Node, proto: ClientConnection, generation: int) -> None:
        """asyncio, plain TCP: the loop calls this when the socket is readable (no reader
        task, no per-read future: answers resolve their publishes straight from here)."""
        sock = node.sock
        if sock is None or node.generation != generation:
            return
        try:
            data = sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._disconnect(node, _as_nsq_error(exc), generation)
            return
        self._feed(node, proto, generation, data)

    def _feed(self, node: Node, proto: ClientConnection, generation: int, data: bytes) -> bool:
        """Hand ``data`` to the core and each answer to its publish; True once closed."""
        node.bytes_in += len(data)
        pending = node.pending
        answer_heartbeat = False
        refused_group: BaseException | None = None  # the coalesced MPUB refused last
        send_alone: SendAlone | None = None
        for event in proto.receive_data(data, monotonic()):
            if type(event) is PublishAcknowledged:
                call = pending.pop(event.request_id, None)
                if call is not None:
                    self._resolve(call, None)
            elif isinstance(event, PublishFailed):
                call = pending.pop(event.request_id, None)
                if call is None:
                    continue
                error = event.error
                if isinstance(error, CoalescedPublishRefused):
                    # Not stored; maybe another message's fault: each goes again on its own.
                    if error is not refused_group:  # the core makes one error per group
                        refused_group = error
                        send_alone = SendAlone(f"{node.address}: {error}")
                        log_coalesced_refused(node.log, call.topic, error.error)
                    self._resolve(call, send_alone)
                else:
                    log_publish_refused(node.log, call.kind, call.topic, error)
                    self._resolve(call, error)
            elif isinstance(event, ConnectionClosed):
                # Mark the node gone before any woken caller runs, so the next publish
                # reconnects (or fails over) instead of writing to a closed connection.
                error = event.error or ConnectionLost("nsqd closed the connection")
                self._disconnect(node, error, generation)
                return True
            elif type(event) is Heartbeat:
                answer_heartbeat = True
        if node.turns and not pending:
            self._next_turn(node)
        if answer_heartbeat:  # the core queued a NOP
            if node.sock is not None:
                self._write_now(node, proto)
            elif not node.wake_set:
                node.wake_set = True
                node.wake.set()
        return False

    async def _writer(
        self, node: Node, stream: anyio.abc.ByteStream, proto: ClientConnection, generation: int
    ) -> None:
        """Write what direct writes could not; a failed write tears down this connection
        (``generation``) like a failed read, instead of escaping its task group."""
        try:
            await self._write_loop(node, stream, proto)
        except (*SOCKET_ERRORS, NSQError) as exc:
            self._send_failed(node, proto, exc, generation)

    def _send_failed(
        self, node: Node, proto: ClientConnection, error: BaseException, generation: int
    ) -> None:
        """A write failed: nsqd closed the connection (after refusing a publish, say). What it
        sent before closing is still in the socket's receive buffer: its answers, and the
        error that made it close, are matched first, or publishes nsqd stored would be sent
        again and stored twice. Then the connection is torn down."""
        if node.proto is not proto:
            return  # torn down already (``proto`` is this connection's until then)
        sock = node.sock
        while sock is not None and node.proto is proto:
            try:
                data = sock.recv(READ_SIZE)
            except OSError:  # nothing more (would block), or the reset after the last bytes
                break
            if self._feed(node, proto, generation, data):  # b"" (end of stream) closes it
                return
        self._disconnect(node, ConnectionLost(f"send failed: {error}"), generation)

    async def _write_loop(
        self, node: Node, stream: anyio.abc.ByteStream, proto: ClientConnection
    ) -> None:
        sock = node.sock
        while True:
            if not node.wake_set:
                await node.wake.wait()
            node.wake = anyio.Event()
            node.wake_set = False
            node.flush_scheduled = False
            if sock is None:  # TLS: the stream encrypts
                data = proto.data_to_send()
                if data:
                    await stream.send(data)
                    node.bytes_out += len(data)
                continue
            if not node.out:
                self._write_now(node, proto)
            while node.out:  # the kernel's buffer was full: wait until it takes more
                await _wait_writable(sock)
                try:
                    sent = sock.send(node.out)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                del node.out[:sent]

    def _next_turn(self, node: Node) -> None:
        """Nothing is in flight on ``node``: the first publish waiting for its turn goes."""
        if node.granted or node.pending or not node.turns:
            return
        node.granted = True
        node.turns.popleft().set()

    def _disconnect(self, node: Node, error: NSQError, generation: int) -> None:
        """Tear down connection attempt ``generation`` of ``node`` (not a newer one) and fail
        what was waiting on it."""
        if node.generation != generation or node.down_generation == generation:
            return
        node.down_generation = generation
        was_ready = node.ready
        node.ready = False
        backend = self._backend
        assert backend is not None  # connections exist only once the producer is entered
        if node.reader_fd is not None:
            backend.remove_reader(node.reader_fd)  # type: ignore[misc]
            node.reader_fd = None
        if node.sock is not None:
            if node.sock_owned:
                if backend.notify_closing is not None:
                    # trio: wake whoever waits on it first, so that trio's epoll does not keep
                    # this descriptor's registration for the next socket given its number
                    # (seen against the real nsqd: later connections reset, publishes lost).
                    backend.notify_closing(node.sock)
                node.sock.close()
            node.sock = None
        node.out.clear()
        if node.proto is not None:
            node.proto.close()
            node.proto = None
        if isinstance(error, IncompatibleNSQD):
            node.config_error = error
        elif not isinstance(error, ConnectionLost | ServerError):
            error = ConnectionLost(str(error))
        node.last_error = str(error)
        node.last_exc = error
        if not self._closed:
            if not (was_ready and isinstance(error, ServerError)):
                # Publishes prefer other nsqd for a second; not after nsqd closed a working
                # connection over a refused publish (it is up: the next publish reconnects).
                node.down_until = monotonic() + 1.0
            log_producer_disconnect(
                node.log, error, was_ready=was_ready, unanswered=len(node.pending)
            )
        if node.pending:
            lost = (
                error
                if isinstance(error, ConnectionLost)
                else NotRead(f"{node.address} closed after refusing a publish: {error}")
                if isinstance(error, ServerError)
                else ConnectionLost(str(error))
            )
            calls = list(node.pending.values())
            node.pending.clear()
            # Lost with others unanswered and no answer saying why (a reset, say, after nsqd
            # refused one of them: its answers may be gone with it): any of them may be at
            # fault, so each goes again alone. Lost alone: its own fault, or the node's.
            suspect = len(calls) > 1 and not isinstance(lost, NotRead)
            for call in calls:
                call.suspect = suspect
                self._resolve(call, lost)
        if node.turns:
            self._next_turn(node)
        if node.connecting is not None:
            node.connecting.set()
            node.connecting = None
        if node.scope is not None:
            node.scope.cancel()
            node.scope = None

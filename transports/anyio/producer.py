"""anyio producers: TCP (a pool over several nsqd, pipelined) and HTTP (``/pub``, ``/mpub``).

:class:`Producer` keeps one connection per nsqd, opened on first use. Publishes go round-robin
over the nodes that are up; many are in flight on one connection at once and their answers
are matched in order by the core (:class:`~nsq_sansio.connection.ClientConnection`). When a
connection breaks, the publishes it had not confirmed are retried on the next node (so a
publish is at-least-once, like every NSQ publish); an error answer from nsqd (``E_BAD_TOPIC``,
``E_PUB_FAILED``...) is raised as is, for that publish only. Back-pressure: at most
``max_pending`` publishes wait for their answer; the next ``await publish(...)`` waits for a
slot, nothing buffers without bound.

Cost per publish: no cancel scope and no :class:`anyio.Event`. A waiting publish parks on the
cheapest primitive of the running loop (an asyncio future, or trio's
``wait_task_rescheduled``); one writer task per connection sends everything queued since it last
ran in one write; one timer task enforces every publish's deadline and the heartbeat checks.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import anyio.streams.tls
import sniffio

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection, ConnectionState
from nsq_sansio.errors import (
    ConnectionLost,
    IdentifyRejected,
    LocalProtocolError,
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
    check_connections_per_nsqd,
    format_address,
    parse_address,
    parse_http_url,
    split_options,
)

from ._net import connect, start_tls

__all__ = ["HTTPProducer", "NoNSQDAvailable", "Producer", "PublishObserver"]

_log = logging.getLogger("nsq_sansio.anyio.producer")

_SOCKET_ERRORS = (
    OSError,
    ssl.SSLError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
)

#: ``publish_observer(topic, messages, seconds, error)``: called once per PUB/MPUB/DPUB when it
#: completes (``error`` is None on success).
PublishObserver = Callable[[str, int, float, "BaseException | None"], None]

_PUB, _MPUB, _DPUB = 0, 1, 2
#: ``errors`` of a publish until it has one (no list per publish); never appended to.
_NO_ERRORS: list[BaseException] = []
_TRIO_ABORT_SUCCEEDED: Any = None  # trio.lowlevel.Abort.SUCCEEDED, once a producer runs on trio
_wait_writable: Callable[[socket.socket], Any] = getattr(
    anyio, "wait_writable", anyio.wait_socket_writable
)
#: Topic names validated once are remembered (up to this many) so a publish does not re-check.
_VALID_TOPICS_KEPT = 1024


def _plain_socket(stream: anyio.abc.ByteStream) -> tuple[socket.socket | None, bool]:
    """The stream's socket when it is plain TCP (TLS: None, the stream must encrypt), and
    whether it is a duplicate to close. The producer writes to it directly (never through the
    stream, so nothing can overtake), which saves a task switch per write."""
    if stream.extra(anyio.streams.tls.TLSAttribute.ssl_object, None) is not None:
        return None, False
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is None:
        return None, False
    if isinstance(raw, socket.socket):
        return raw, False
    # asyncio hands out a TransportSocket (no send()): duplicate the descriptor instead. The
    # transport never writes (the producer never calls stream.send on plain TCP), and must not
    # read either: anyio pauses it between receive() calls; where that cannot be seen, the
    # producer stays on the stream.
    transport = getattr(stream, "_transport", None)
    is_reading = getattr(transport, "is_reading", None)
    if is_reading is None or is_reading():
        return None, False
    try:
        dup = socket.socket(raw.family, raw.type, raw.proto, fileno=os.dup(raw.fileno()))
    except (OSError, AttributeError):
        return None, False
    dup.setblocking(False)
    return dup, True


class NoNSQDAvailable(NSQError):
    """Every nsqd of the pool failed for this publish; ``errors`` says why, node by node."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        detail = "; ".join(str(e) for e in errors) or "no nsqd configured"
        super().__init__(f"no nsqd could take the publish: {detail}")
        self.errors = tuple(errors)


class _NotRead(ConnectionLost):
    """The connection closed after nsqd refused a publish ahead of this one: nsqd stopped
    reading there, so this one was never read (not stored): safe to send again, and it does
    not count against the publish's retries (another publish's refusal is not its fault)."""


class _Call:
    """One publish waiting for its answer (one per call, reused by its failover attempts).

    ``waker`` is what the publishing task parks on: an asyncio future, or a trio task; an
    answer that comes before the task parked is kept in ``result`` (``done``). ``orphan`` is
    set when the caller stopped waiting (cancelled): the answer is still matched to this
    request, then reported to the observer.
    """

    __slots__ = ("count", "deadline", "done", "orphan", "result", "start", "topic", "waker")

    def __init__(self, topic: str, count: int, start: float, deadline: float) -> None:
        self.topic = topic
        self.count = count
        self.start = start
        self.deadline = deadline
        self.waker: Any = None
        self.done = False
        self.result: BaseException | None = None
        self.orphan = False

    def abort(self, _: object) -> Any:
        """trio: the parked caller is cancelled. Its answer still comes, matched to it."""
        self.waker = None
        self.orphan = True
        return _TRIO_ABORT_SUCCEEDED


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
        #: Bumped for every connection attempt: a finished attempt only tears down its own.
        self.generation = 0
        self.down_generation = -1  # the last attempt torn down (teardown happens once)
        self.reader_fd: int | None = None  # asyncio: the descriptor the loop watches for us
        self.connecting: anyio.Event | None = None
        self.scope: anyio.CancelScope | None = None
        self.pending: dict[int, _Call] = {}
        self.wake = anyio.Event()
        self.wake_set = False
        #: Plain TCP: the socket, written directly (no task switch); bytes the kernel did not
        #: take wait in ``out`` for the writer task. None with TLS: the writer task sends.
        self.sock: socket.socket | None = None
        self.sock_owned = False  # ``sock`` is our duplicate of the stream's descriptor
        self.out = bytearray()
        self.flush_scheduled = False
        self.last_error: str | None = None
        #: The last attempt's error when it was a configuration error (a refused IDENTIFY).
        self.config_error: IdentifyRejected | None = None
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
    ``publish_observer(topic, messages, seconds, error)``, if given, is called once per
    PUB/MPUB/DPUB when it completes (for metrics; it must not block).
    ``connections_per_nsqd`` opens that many connections to each nsqd and spreads the
    publishes over them (see docs/producers.md for when it helps).
    """

    def __init__(
        self,
        nsqd: str | Sequence[str] = "127.0.0.1:4150",
        *,
        config: Config | None = None,
        max_pending: int = 10_000,
        timeout: float = 30.0,
        logger: logging.Logger | None = None,
        publish_observer: PublishObserver | None = None,
        connections_per_nsqd: int = 1,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        if max_pending < 1:
            raise ValueError(f"max_pending={max_pending!r} must be >= 1")
        if not timeout > 0 or timeout == float("inf"):
            raise ValueError(f"timeout={timeout!r} must be a finite number of seconds > 0")
        check_connections_per_nsqd(connections_per_nsqd)
        self._config, self._options = split_options(config, options)
        self._identify = self._config.identify_body()
        self._logger = logger or _log
        #: One node per connection: ``connections_per_nsqd`` for each nsqd address.
        self._nodes = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            for _ in range(connections_per_nsqd):
                self._nodes.append(
                    _Node(host, port, ConnectionLogger(self._logger, format_address(host, port)))
                )
        #: Distinct nsqd (failover tries each once, plus one resend after a reconnect).
        self._nsqd_count = len({node.address for node in self._nodes})
        self._timeout = timeout
        self._free = max_pending
        self._slot_waiters: deque[anyio.Event] = deque()
        self._timer_started = False
        self._max_pending = max_pending
        self._rr = itertools.count()
        self._tg: anyio.abc.TaskGroup | None = None
        self._trio = False
        self._loop: Any = None  # the asyncio loop (None on trio)
        self._current_task: Any = None  # trio.lowlevel's, on trio
        self._wait_rescheduled: Any = None
        self._wait_readable: Any = None  # trio.lowlevel's, on trio
        self._reschedule: Any = None
        self._value: Any = None
        self._closed = False
        self._published = 0
        self._failed = 0
        self._retried = 0
        self._valid_topics: set[str] = set()
        #: Called once per publish request when it completes; None costs nothing.
        self.publish_observer: PublishObserver | None = publish_observer

    # --- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self._trio = sniffio.current_async_library() == "trio"
        if self._trio:
            import outcome
            import trio

            global _TRIO_ABORT_SUCCEEDED
            _TRIO_ABORT_SUCCEEDED = trio.lowlevel.Abort.SUCCEEDED
            self._current_task = trio.lowlevel.current_task
            self._wait_rescheduled = trio.lowlevel.wait_task_rescheduled
            self._wait_readable = trio.lowlevel.wait_readable
            self._reschedule = trio.lowlevel.reschedule
            self._value = outcome.Value
        else:
            import asyncio

            self._loop = asyncio.get_running_loop()
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
                while any(node.pending for node in self._nodes):
                    await anyio.sleep(0.005)
            for node in self._nodes:
                self._disconnect(node, ConnectionLost("producer closed"), node.generation)

    # --- publishing ----------------------------------------------------------------------------

    async def publish(self, topic: str, body: bytes) -> None:
        """``PUB``: returns once nsqd confirmed it."""
        if topic not in self._valid_topics:
            self._remember_topic(topic)
        await self._request(_PUB, topic, body, 1)

    async def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        """``MPUB``: all or nothing, one answer."""
        if topic not in self._valid_topics:
            self._remember_topic(topic)
        if not bodies:
            raise ValueError("multi_publish needs at least one body")
        await self._request(_MPUB, topic, bodies, len(bodies))

    async def deferred_publish(self, topic: str, body: bytes, delay: float) -> None:
        """``DPUB``: deliverable after ``delay`` seconds."""
        if topic not in self._valid_topics:
            self._remember_topic(topic)
        if not delay >= 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        await self._request(_DPUB, topic, (body, delay), 1)

    def _remember_topic(self, topic: str) -> None:
        validate_topic(topic)
        if len(self._valid_topics) >= _VALID_TOPICS_KEPT:
            self._valid_topics.clear()
        self._valid_topics.add(topic)

    def _candidates(self) -> list[_Node]:
        """One connection per nsqd (a connected one first), starting at the next in turn:
        those up (or not known to be down) first, then the rest as a last resort."""
        start = next(self._rr) % len(self._nodes)
        ordered = self._nodes[start:] + self._nodes[:start]
        now = monotonic()
        best: dict[str, _Node] = {}
        for n in ordered:
            other = best.get(n.address)
            if other is None or (other.down_until > now, not other.ready) > (
                n.down_until > now,
                not n.ready,
            ):
                best[n.address] = n
        return [n for n in best.values() if n.down_until <= now] + [
            n for n in best.values() if n.down_until > now
        ]

    def _others(self, node: _Node) -> list[_Node]:
        """Failover targets after ``node`` failed: one connection of every other nsqd."""
        return [n for n in self._candidates() if n.address != node.address]

    async def _request(self, kind: int, topic: str, payload: Any, count: int) -> None:
        """Send the request, failing over to other nodes while connections break, and wait
        for its answer (one coroutine: this is the hot path of every publish)."""
        if self._tg is None:
            raise LocalProtocolError("use the Producer as `async with Producer(...) as p:`")
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        start = monotonic()
        # Back-pressure without a checkpoint per publish while slots are free.
        if self._free > 0:
            self._free -= 1
        else:
            try:
                with anyio.fail_after(self._timeout):  # the call's deadline covers the wait
                    await self._wait_for_slot()
            except BaseException as exc:
                observer = self.publish_observer
                if observer is not None:
                    self._observe(observer, topic, count, start, exc)
                raise
        call = _Call(topic, count, start, start + self._timeout)
        try:
            nodes = self._nodes
            node = nodes[0] if len(nodes) == 1 else nodes[next(self._rr) % len(nodes)]
            if node.ready or (node.connects == 0 and node.down_until <= start):
                candidates = [node]  # up, or never tried: connect it (a pool spreads out)
            else:
                candidates = self._candidates()
            errors: list[BaseException] = _NO_ERRORS  # a list of its own on the first one
            sent = 0
            i = 0
            while i < len(candidates):
                node = candidates[i]
                i += 1
                if errors:
                    self._retried += 1
                proto = node.proto
                if not node.ready or proto is None:
                    try:
                        with anyio.fail_after(max(call.deadline - monotonic(), 0)):
                            proto = await self._ensure(node)
                    except IdentifyRejected:
                        self._failed += 1
                        raise  # the configuration's fault: no other node will take it either
                    except (NSQError, TimeoutError) as exc:
                        if errors is _NO_ERRORS:
                            errors = []
                        errors.append(exc)
                        if len(candidates) == 1 and self._nsqd_count > 1:
                            candidates = [node, *self._others(node)]
                        continue
                try:
                    if kind == _PUB:
                        request_id = proto.publish(topic, payload)
                    elif kind == _MPUB:
                        request_id = proto.multi_publish(topic, payload)
                    else:
                        request_id = proto.deferred_publish(topic, payload[0], payload[1])
                except LocalProtocolError:
                    if proto.state is not ConnectionState.CLOSED:
                        self._failed += 1
                        raise  # the arguments are wrong, not the connection
                    # The connection died and its task has not yet been told: treat as lost.
                    self._disconnect(node, ConnectionLost("connection closed"), node.generation)
                    if errors is _NO_ERRORS:
                        errors = []
                    errors.append(ConnectionLost(f"{node.address}: connection closed"))
                    if i >= len(candidates) and sent <= self._nsqd_count:
                        candidates.append(node)
                    continue
                if call.done:  # a resend: the last attempt's outcome is not this one's
                    call.done = False
                    call.result = None
                sent += 1
                node.pending[request_id] = call
                self._send_soon(node, proto)
                # Park until the reader, the timer or a disconnect resolves the call.
                if call.done:
                    error = call.result
                elif self._trio:
                    call.waker = self._current_task()
                    error = await self._wait_rescheduled(call.abort)
                else:
                    future = self._loop.create_future()
                    call.waker = future
                    try:
                        error = await future
                    except BaseException:
                        call.waker = None
                        if future.cancelled() or not future.done():
                            call.orphan = True  # its answer still comes, matched to it
                        raise
                if error is None:
                    node.published += 1
                    self._published += 1
                    break
                if isinstance(error, ServerError | TimeoutError):
                    self._failed += 1
                    raise error
                if isinstance(error, _NotRead):
                    sent -= 1
                    self._retried += 1
                    candidates.append(node)  # nsqd never read it: the same node again
                    continue
                if errors is _NO_ERRORS:
                    errors = []
                errors.append(error)
                if len(candidates) == 1 and self._nsqd_count > 1:
                    candidates = [node, *self._others(node)]
                if i >= len(candidates) and sent <= self._nsqd_count:
                    # The connection died with this publish unanswered, maybe not the node
                    # (nsqd closes it after a fatal error for another publish pipelined
                    # before ours, which it then never read): send it again after a
                    # reconnect, like the blocking producer (at most one more send).
                    candidates.append(node)
            else:
                self._failed += 1
                raise NoNSQDAvailable(errors)
        except BaseException as exc:
            self._release_slot()
            observer = self.publish_observer
            if observer is not None and not call.orphan:  # an orphan is observed on its answer
                self._observe(observer, topic, count, start, exc)
            raise
        self._release_slot()
        observer = self.publish_observer
        if observer is not None:
            self._observe(observer, topic, count, start, None)

    def _observe(
        self,
        observer: PublishObserver,
        topic: str,
        count: int,
        start: float,
        error: BaseException | None,
    ) -> None:
        try:
            observer(topic, count, monotonic() - start, error)
        except Exception:
            self._logger.exception("publish_observer failed")

    def _resolve(self, call: _Call, error: BaseException | None) -> None:
        """Hand ``call`` its outcome (None: nsqd said OK) and wake its caller."""
        if call.orphan:
            observer = self.publish_observer
            if observer is not None:
                self._observe(observer, call.topic, call.count, call.start, error)
            return
        call.done = True
        call.result = error
        waker = call.waker
        if waker is None:
            return  # not parked yet: it finds the result itself
        call.waker = None
        if self._trio:
            self._reschedule(waker, self._value(error))
        elif not waker.done():
            waker.set_result(error)

    # --- writing -------------------------------------------------------------------------------

    def _send_soon(self, node: _Node, proto: ClientConnection) -> None:
        """Get what ``proto`` queued onto the wire: now when nothing else is waiting for an
        answer (the one-by-one case: no task switch), else once for everything queued in this
        loop iteration."""
        if node.sock is not None and len(node.pending) == 1 and not node.out:
            self._write_now(node, proto)
        elif not node.flush_scheduled:
            node.flush_scheduled = True
            if self._loop is not None and node.sock is not None:
                self._loop.call_soon(self._flush_scheduled, node, proto)
            elif not node.wake_set:
                node.wake_set = True
                node.wake.set()

    def _flush_scheduled(self, node: _Node, proto: ClientConnection) -> None:
        node.flush_scheduled = False
        if node.proto is proto:
            self._write_now(node, proto)

    def _write_now(self, node: _Node, proto: ClientConnection) -> None:
        """Plain TCP: write what ``proto`` queued straight to the socket; what the kernel does
        not take now waits in ``node.out`` for the writer task."""
        data = proto.data_to_send()
        if not data:
            return
        node.bytes_out += len(data)
        if node.out:
            node.out += data
            return
        sock = node.sock
        assert sock is not None
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._disconnect(node, ConnectionLost(f"send failed: {exc}"), node.generation)
            return
        if sent < len(data):
            node.out += memoryview(data)[sent:]
            if not node.wake_set:
                node.wake_set = True
                node.wake.set()

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

    async def _timer(self) -> None:
        """Fail publishes unanswered past their deadline and close connections whose
        heartbeats stopped: one timer for the whole producer, not one per call or read."""
        tick = min(max(self._timeout / 4, 0.01), 1.0)
        while True:
            await anyio.sleep(tick)
            now = monotonic()
            for node in self._nodes:
                proto = node.proto
                if proto is not None and node.ready:
                    deadline = proto.next_deadline()
                    if deadline is not None and now >= deadline:
                        for event in proto.handle_timer(now):
                            if isinstance(event, ConnectionClosed):
                                error = event.error or ConnectionLost("heartbeats stopped")
                                node.log.warning("connection lost: %s", error)
                                self._disconnect(node, error, node.generation)
                if not node.pending:
                    continue
                expired = [rid for rid, call in node.pending.items() if now >= call.deadline]
                for request_id in expired:
                    call = node.pending.pop(request_id)
                    message = f"no answer from {node.address} after {self._timeout:g}s"
                    self._resolve(call, TimeoutError(message))

    # --- connections ---------------------------------------------------------------------------

    async def _ensure(self, node: _Node) -> ClientConnection:
        while True:
            if node.ready and node.proto is not None:
                return node.proto
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
                raise ConnectionLost(f"{node.address}: {node.last_error or 'connect failed'}")

    async def _connection(self, node: _Node, generation: int) -> None:
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
                node.out.clear()
                node.flush_scheduled = False
                node.sock, node.sock_owned = _plain_socket(stream)
                if self._loop is not None and node.sock is not None:
                    # asyncio, plain TCP: the loop calls _on_readable; _disconnect stops it.
                    try:
                        fd = node.sock.fileno()
                        self._loop.add_reader(fd, self._on_readable, node, proto, generation)
                        node.reader_fd = fd
                    except NotImplementedError:  # a loop without readiness callbacks
                        if node.sock_owned:
                            node.sock.close()
                        node.sock = None  # the stream, a reader and a writer task do it all
                node.ready = True
                node.connects += 1
                if node.connects > 1:
                    node.log.info("reconnected")
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
                    tg.start_soon(self._writer, node, stream, proto)
                    if node.reader_fd is not None:
                        await anyio.sleep_forever()
                    await self._reader(node, stream, proto, generation)
                    tg.cancel_scope.cancel()
        except (*_SOCKET_ERRORS, NSQError) as exc:
            error = exc if isinstance(exc, NSQError) else ConnectionLost(str(exc))
        finally:
            if error is not None and node.generation == generation:
                node.log.warning("connection lost: %s", error)
            self._disconnect(node, error or ConnectionLost("connection closed"), generation)
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
        self,
        node: _Node,
        stream: anyio.abc.ByteStream,
        proto: ClientConnection,
        generation: int,
    ) -> None:
        """Read until the connection closes (TLS, or trio: a task reading the stream)."""
        sock = node.sock
        if sock is not None and self._wait_readable is not None:
            await self._read_socket(node, sock, proto, generation)
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
        self, node: _Node, sock: socket.socket, proto: ClientConnection, generation: int
    ) -> None:
        """trio, plain TCP: wait for the socket to be readable, then read it (no failed read
        first, none of the stream's layers)."""
        wait_readable = self._wait_readable
        recv = sock.recv
        while True:
            await wait_readable(sock)
            try:
                data = recv(READ_SIZE)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                raise ConnectionLost(str(exc)) from exc
            if self._feed(node, proto, generation, data):
                return

    def _on_readable(self, node: _Node, proto: ClientConnection, generation: int) -> None:
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
            node.log.warning("connection lost: %s", exc)
            self._disconnect(node, ConnectionLost(str(exc)), generation)
            return
        self._feed(node, proto, generation, data)

    def _feed(
        self, node: _Node, proto: ClientConnection, generation: int, data: bytes
    ) -> bool:
        """Hand ``data`` to the core and each answer to its publish; True once closed."""
        node.bytes_in += len(data)
        pending = node.pending
        answer_heartbeat = False
        for event in proto.receive_data(data, monotonic()):
            if type(event) is PublishAcknowledged:
                call = pending.pop(event.request_id, None)
                if call is not None:
                    self._resolve(call, None)
            elif isinstance(event, PublishFailed):
                call = pending.pop(event.request_id, None)
                if call is not None:
                    node.log.warning("publish to %r refused: %s", call.topic, event.error)
                    self._resolve(call, event.error)
            elif isinstance(event, ConnectionClosed):
                # Mark the node gone before any woken caller runs, so the next publish
                # reconnects (or fails over) instead of writing to a closed connection.
                error = event.error or ConnectionLost("nsqd closed the connection")
                node.log.warning("connection lost: %s", error)
                self._disconnect(node, error, generation)
                return True
            elif type(event) is Heartbeat:
                answer_heartbeat = True
        if answer_heartbeat:  # the core queued a NOP
            if node.sock is not None:
                self._write_now(node, proto)
            elif not node.wake_set:
                node.wake_set = True
                node.wake.set()
        return False

    async def _writer(
        self, node: _Node, stream: anyio.abc.ByteStream, proto: ClientConnection
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

    def _disconnect(self, node: _Node, error: NSQError, generation: int) -> None:
        """Tear down connection attempt ``generation`` of ``node`` (not a newer one) and fail
        what was waiting on it."""
        if node.generation != generation or node.down_generation == generation:
            return
        node.down_generation = generation
        node.ready = False
        if node.reader_fd is not None:
            self._loop.remove_reader(node.reader_fd)
            node.reader_fd = None
        if node.sock is not None:
            if node.sock_owned:
                node.sock.close()
            node.sock = None
        node.out.clear()
        if node.proto is not None:
            node.proto.close()
            node.proto = None
        if isinstance(error, IdentifyRejected):
            node.config_error = error
        elif not isinstance(error, ConnectionLost | ServerError):
            error = ConnectionLost(str(error))
        node.last_error = str(error)
        if not self._closed:
            node.down_until = monotonic() + 1.0
        if node.pending:
            lost = (
                error
                if isinstance(error, ConnectionLost)
                else _NotRead(f"{node.address} closed after refusing a publish: {error}")
                if isinstance(error, ServerError)
                else ConnectionLost(str(error))
            )
            calls = list(node.pending.values())
            node.pending.clear()
            for call in calls:
                self._resolve(call, lost)
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

"""Blocking producer: a pool of nsqd connections with failover, pipelining and back-pressure.

::

    with Producer(["127.0.0.1:4150", "127.0.0.1:4250"]) as p:
        p.publish("events", b"hello")                     # waits for nsqd's OK
        p.multi_publish("events", [b"a", b"b"])           # atomic MPUB
        p.deferred_publish("events", b"later", delay=5.0)
        futures = [p.publish_async("events", b"%d" % i) for i in range(10_000)]
        for f in futures:
            f.result()

One IO thread owns every socket. Publishes from any number of threads are handed to it and
pipelined: many PUBs are in flight on one connection and nsqd's answers are matched to them in
order by the core. ``max_pending`` bounds the publishes not yet answered: a call beyond it blocks
(back-pressure) instead of buffering without limit.

Failover: each publish goes to the next connected nsqd (round robin). When a connection dies with
publishes unanswered, they are sent again, preferring an nsqd they were not tried on, at most
``len(nsqd) + 1`` times in all and only until their ``timeout``; while no nsqd is connected they
wait (reconnection follows the config's capped exponential ``reconnect_delay``). A publish that
nsqd *refused* (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...) fails at once with that error (the
others pipelined on that connection are retried). A publish whose answer was lost may be
delivered twice: NSQ is at-least-once.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from nsq_sansio.backoff import reconnect_delay
from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection, ConnectionState
from nsq_sansio.errors import (
    ConfigError,
    ConnectionLost,
    IdentifyRejected,
    NSQError,
    ServerError,
)
from nsq_sansio.events import (
    ConnectionClosed,
    ConnectionReady,
    PublishAcknowledged,
    PublishFailed,
    TLSUpgradeRequired,
)
from nsq_sansio.frames import encode_dpub, encode_mpub, encode_pub
from nsq_sansio.names import validate_topic
from transports._common import (
    DEFAULT_TCP_PORT,
    ConnectionLogger,
    ConnectionStats,
    ProducerStats,
    format_address,
    parse_address,
    split_options,
)

from ._args import check_seconds
from ._loop import IOLoop, Link

__all__ = ["NoNSQDAvailable", "Producer", "PublishFuture"]

_log = logging.getLogger("nsq_sansio.sync.producer")


class NoNSQDAvailable(NSQError):
    """No nsqd of the pool could take the publish before its deadline."""


_FUTURE_LOCK = threading.Lock()
#: The largest body a command's 4-byte size field can announce (frames refuses more).
_MAX_FRAMED = 0x7FFFFFFF


class PublishFuture:
    """The answer to one publish: a light ``concurrent.futures.Future`` look-alike
    (``done()``, ``result(timeout)``, ``exception(timeout)``, ``add_done_callback(fn)``).

    Set once, by the producer's IO thread; a waiter lock is only made when someone waits for
    it before it is done, so the pipelined path costs a few attribute writes.
    """

    __slots__ = ("_callbacks", "_done", "_error", "_waiter")

    def __init__(self) -> None:
        self._done = False
        self._error: BaseException | None = None
        #: A held lock, released when the future is done (cheaper than a threading.Event).
        self._waiter: Any = None
        self._callbacks: list[Callable[[PublishFuture], object]] | None = None

    def done(self) -> bool:
        return self._done

    def _wait(self, timeout: float | None) -> None:
        if self._done:
            return
        waiter = self._waiter
        if waiter is None:
            with _FUTURE_LOCK:
                waiter = self._waiter
                if waiter is None:
                    waiter = _allocate_lock()
                    waiter.acquire()
                    self._waiter = waiter
        # The IO thread writes _done before it reads _waiter: one of us sees the other.
        if self._done:
            return
        if not waiter.acquire(True, -1 if timeout is None else max(timeout, 0.0)):
            raise TimeoutError(f"no answer from nsqd within {timeout}s")
        waiter.release()  # let any other waiter through too

    def result(self, timeout: float | None = None) -> None:
        """None once nsqd said OK; raises nsqd's error, NoNSQDAvailable or TimeoutError."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._error

    def add_done_callback(self, fn: Callable[[PublishFuture], object]) -> None:
        """Call ``fn(future)`` when done (at once if it is; else on the IO thread)."""
        with _FUTURE_LOCK:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                return
        fn(self)

    def _set(self, error: BaseException | None) -> None:
        self._error = error
        if self._callbacks is None:
            self._done = True
            callbacks = None
        else:
            with _FUTURE_LOCK:
                self._done = True
                callbacks = self._callbacks
        waiter = self._waiter  # read after _done is written: see _wait()
        if waiter is not None:
            waiter.release()
        if callbacks:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    _log.exception("publish future callback failed")


#: ``publish_observer(topic, messages, seconds, error)``: called once per PUB/MPUB/DPUB when it
#: completes (``error`` is None on success), on the producer's IO thread.
PublishObserver = Callable[[str, int, float, "BaseException | None"], None]


class _Request:
    __slots__ = ("attempts", "deadline", "future", "kind", "payload", "start", "topic", "tried")

    def __init__(self, kind: str, topic: str, payload: Any, start: float, deadline: float) -> None:
        self.kind = kind
        self.topic = topic
        self.payload = payload
        self.start = start
        self.deadline = deadline
        self.future = PublishFuture()
        self.tried: set[str] | None = None  # nsqd addresses it was sent to
        self.attempts = 0


@dataclass
class _Node:
    address: str
    host: str
    port: int
    link: Link | None = None
    conn: ClientConnection | None = None
    ready: bool = False
    failures: int = 0
    retry_at: float = 0.0
    #: Not READY (IDENTIFY/TLS/AUTH answered) by then: give up on this attempt.
    ready_by: float | None = None
    #: Inside IOLoop.connect(), which may report a failure before it returns.
    connecting: bool = False
    last_error: str | None = None
    #: nsqd refused IDENTIFY on the last attempt: no reconnect until a publish asks for one.
    config_error: IdentifyRejected | None = None
    published: int = 0
    failed: int = 0
    connects: int = 0

    def __post_init__(self) -> None:
        self.inflight: dict[int, _Request] = {}
        #: Bytes a caller's direct send did not get out; the IO thread writes them first.
        self.out_pending = bytearray()
        #: A caller is sending on the socket right now (outside the lock): hands off.
        self.sending = False
        self.log = ConnectionLogger(_log, self.address)


def _connection_stats(node: _Node) -> ConnectionStats:
    conn, link = node.conn, node.link  # read once: the IO thread may replace them
    return ConnectionStats(
        address=node.address,
        state=conn.state.name if conn is not None else "DISCONNECTED",
        connected=node.ready,
        in_flight=len(node.inflight),
        reconnects=max(node.connects - 1, 0),
        bytes_received=link.bytes_in if link is not None else 0,
        bytes_sent=link.bytes_out if link is not None else 0,
        last_error=node.last_error,
    )


class Producer:
    """Publish to one or several nsqd over TCP. See the module docstring."""

    def __init__(
        self,
        nsqd: str | Sequence[str] = "127.0.0.1:4150",
        *,
        config: Config | None = None,
        max_pending: int = 10_000,
        timeout: float = 30.0,
        publish_observer: PublishObserver | None = None,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        #: Called once per publish request when it completes (IO thread); None costs nothing.
        self.publish_observer: PublishObserver | None = publish_observer
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending={max_pending!r} must be an int >= 1")
        check_seconds("Producer timeout", timeout, zero=False, error=ConfigError)
        self._config, self._options = split_options(config, options)
        self._timeout = timeout
        self._nodes: list[_Node] = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            node = _Node(format_address(host, port), host, port)
            self._nodes.append(node)
        self._ssl_context = self._options.ssl_context() if self._config.tls_v1 else None
        # Back-pressure: publishes handed over minus publishes answered, bounded.
        self._space = threading.Condition(threading.Lock())
        self._submitted = 0
        self._completed = 0  # IO thread only
        self._space_waiters = 0
        self._max_pending = max_pending
        self._waiting: deque[_Request] = deque()
        self._rr = itertools.count()
        self._rng = random.Random()
        self._loop = IOLoop(self, name="nsq-sync-producer")
        #: Serializes the IO thread's callbacks and callers publishing directly (a publish
        #: to a connected nsqd is written by the calling thread: no hand-over to the IO thread).
        self._io_lock = threading.RLock()
        self._started = False
        self._closing = False
        self._closed = False
        self._lock = threading.Lock()
        self._published = 0
        self._failed = 0
        self._retried = 0
        self._valid_topics: set[str] = set()
        #: When the IO thread next looks for publishes past their deadline (None: none sent).
        self._expiry_check: float | None = None
        self._expiry_tick = min(max(timeout / 4, 0.01), 1.0)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Producer:
        """Start the IO thread and connect to every nsqd (publishes wait for the first)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Producer is closed")
            if not self._started:
                self._started = True
                self._loop.start()
                self._loop.call_soon(lambda: self._locked(self._connect_all))
        return self

    def close(self, timeout: float | None = 10.0) -> None:
        """Wait up to ``timeout`` for unanswered publishes, then close every connection."""
        if timeout is not None:
            check_seconds("close timeout", timeout)
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if not self._started:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending_count() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.005)
        done = threading.Event()

        def shut() -> None:
            self._closing = True
            error = NSQError("Producer closed before nsqd answered")
            for request in list(self._waiting):
                self._fail_request(request, error)
            self._waiting.clear()
            for node in self._nodes:
                for request in list(node.inflight.values()):
                    self._fail_request(request, error)
                node.inflight.clear()
                if node.link is not None:
                    self._loop.close_link_when_flushed(node.link)
                node.ready = False
            done.set()

        self._loop.call_soon(lambda: self._locked(shut))
        done.wait(5.0)
        self._loop.stop()

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- publishing (any thread) --------------------------------------------------------------

    def publish(self, topic: str, body: bytes, *, timeout: float | None = None) -> None:
        """``PUB`` and wait for nsqd's OK; raises the server's error or a timeout."""
        self._wait(self.publish_async(topic, body, timeout=timeout), timeout)

    def multi_publish(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> None:
        """``MPUB`` (all or nothing) and wait for nsqd's OK."""
        self._wait(self.multi_publish_async(topic, bodies, timeout=timeout), timeout)

    def deferred_publish(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> None:
        """``DPUB``: delivered after ``delay`` seconds; waits for nsqd's OK."""
        self._wait(self.deferred_publish_async(topic, body, delay, timeout=timeout), timeout)

    def publish_async(
        self, topic: str, body: bytes, *, timeout: float | None = None
    ) -> PublishFuture:
        """Queue a ``PUB``; the future resolves with nsqd's answer. Blocks while
        ``max_pending`` publishes are unanswered (back-pressure)."""
        # Validate here, in the caller's thread (cheaply: topics are remembered).
        if topic not in self._valid_topics or type(body) is not bytes or not body:
            encode_pub(topic, body)
            self._valid_topics.add(topic)
        return self._submit("PUB", topic, body, timeout)

    def multi_publish_async(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> PublishFuture:
        if isinstance(bodies, (bytes, bytearray, str)):
            encode_mpub(topic, bodies)  # raises: one body, not a list of them
        bodies = list(bodies)
        # Validate here, in the caller's thread, without encoding twice: only a body that is
        # not plain non-empty bytes (or a batch too big to frame) takes the full encoder,
        # which says what is wrong.
        if topic not in self._valid_topics:
            validate_topic(topic)
            self._valid_topics.add(topic)
        plain = bool(bodies)
        for body in bodies:
            if type(body) is not bytes or not body:
                plain = False
                break
        if not plain or sum(map(len, bodies)) + 4 * (len(bodies) + 1) > _MAX_FRAMED:
            encode_mpub(topic, bodies)
        return self._submit("MPUB", topic, bodies, timeout)

    def deferred_publish_async(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> PublishFuture:
        check_seconds("DPUB delay", delay)
        encode_dpub(topic, round(delay * 1000), body)
        return self._submit("DPUB", topic, (body, delay), timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish handed over so far was answered."""
        if timeout is not None:
            check_seconds("flush timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._pending_count():
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self._pending_count()} publishes still unanswered")
            time.sleep(0.002)

    # --- introspection --------------------------------------------------------------------------

    def stats(self) -> ProducerStats:
        """A snapshot (plain dataclass) of the pool's state and counters. Safe to call from
        any thread while the IO thread runs (each connection's socket and state are read
        once, so one replaced meanwhile cannot break it)."""
        connections = tuple(map(_connection_stats, list(self._nodes)))
        return ProducerStats(
            published=self._published,
            failed=self._failed,
            pending=self._pending_count(),
            reconnects=sum(max(n.connects - 1, 0) for n in self._nodes),
            connections=connections,
        )

    @property
    def retried(self) -> int:
        """Publishes sent again on another nsqd after their connection died."""
        return self._retried

    @property
    def config(self) -> Config:
        return self._config

    # --- internals: caller side -------------------------------------------------------------

    def _pending_count(self) -> int:
        return self._submitted - self._completed

    def _wait(self, future: PublishFuture, timeout: float | None) -> None:
        limit = self._timeout if timeout is None else timeout
        try:
            future.result(limit + 1.0)
        except TimeoutError:
            raise TimeoutError(f"nsqd did not answer within {limit}s") from None

    def _submit(self, kind: str, topic: str, payload: Any, timeout: float | None) -> PublishFuture:
        if timeout is not None:
            check_seconds(f"{kind} timeout", timeout, zero=False)
            if timeout / 4 < self._expiry_tick:
                self._expiry_tick = max(timeout / 4, 0.01)
        if self._closed:
            raise RuntimeError("Producer is closed")
        if not self._started:
            self.start()
        failure = self._loop.failure
        if failure is not None:
            raise RuntimeError(f"the producer's IO thread crashed: {failure!r}") from failure
        limit = self._timeout if timeout is None else timeout
        if self.publish_observer is None:
            self._reserve(limit)
        else:
            started = time.monotonic()
            try:
                self._reserve(limit)
            except TimeoutError as exc:
                count = len(payload) if kind == "MPUB" else 1
                try:
                    self.publish_observer(topic, count, time.monotonic() - started, exc)
                except Exception:
                    _log.exception("publish_observer failed")
                raise
        now = time.monotonic()
        request = _Request(kind, topic, payload, now, now + limit)
        if not self._dispatch_now(request):
            self._loop.call_soon(lambda: self._locked(self._dispatch, request))
        return request.future

    def _locked(self, fn: Callable[..., None], *args: Any) -> None:
        with self._io_lock:
            fn(*args)

    def _dispatch_now(self, request: _Request) -> bool:
        """Caller's thread: send ``request`` to a connected nsqd now, writing it to the socket
        when nothing else waits for an answer there (one-by-one publishing: no thread switch
        on the way out), else leaving it for the IO thread's next write (pipelining). False
        when it must go through the IO thread (nothing connected, publishes waiting)."""
        with self._io_lock:
            if self._closing or self._waiting:
                return False
            nodes = self._nodes
            if len(nodes) == 1:
                node = nodes[0]
                if not node.ready:
                    return False
            else:
                ready = [n for n in nodes if n.ready]
                if not ready:
                    return False
                node = ready[next(self._rr) % len(ready)]
            if not self._send_to(node, request):
                return True  # failed (the future says why)
            conn, link = node.conn, node.link
            assert conn is not None and link is not None
            if len(node.inflight) > 1 or node.out_pending or node.sending:
                self._loop.wake()  # the IO thread writes everything queued, in one go
                return True
            data = conn.data_to_send()
            sock = link.direct_socket
            if sock is None:
                node.out_pending += data
                self._loop.wake()
                return True
            node.sending = True  # the IO thread leaves this node's output alone meanwhile
        # The send happens outside the lock, so the IO thread can already take the answer.
        try:
            sent = sock.send(data)
        except OSError:  # would block, or broken: the IO thread takes it from here
            sent = 0
        with self._io_lock:
            node.sending = False
            if node.conn is not conn:  # the connection died meanwhile: its bytes go with it
                return True
            link.bytes_out += sent
            if sent < len(data):
                node.out_pending[:0] = memoryview(data)[sent:]
                self._loop.wake()
            elif len(node.inflight) > 1:
                self._loop.wake()  # others queued while we were sending
            return True

    def _reserve(self, limit: float) -> None:
        """Count one more publish in flight; block while max_pending are unanswered."""
        space = self._space
        with space:
            if self._submitted - self._completed < self._max_pending:
                self._submitted += 1
                return
            deadline = time.monotonic() + limit
            self._space_waiters += 1
            try:
                while self._submitted - self._completed >= self._max_pending:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"{self._max_pending} publishes unanswered for {limit}s "
                            "(max_pending reached)"
                        )
                    # Short waits: a completion may race past a waiter registering.
                    space.wait(min(remaining, 0.05))
                self._submitted += 1
            finally:
                self._space_waiters -= 1

    def _complete(self, request: _Request, error: BaseException | None) -> None:
        """IO thread: resolve ``request`` once and free its back-pressure slot."""
        if request.future._done:
            return
        self._completed += 1
        request.future._set(error)
        if self._space_waiters:
            with self._space:
                self._space.notify()
        observer = self.publish_observer
        if observer is not None:
            count = len(request.payload) if request.kind == "MPUB" else 1
            try:
                observer(request.topic, count, time.monotonic() - request.start, error)
            except Exception:
                _log.exception("publish_observer failed")

    # --- internals: IO thread -------------------------------------------------------------------

    def _connect_all(self) -> None:
        for node in self._nodes:
            self._connect(node)

    def _connect(self, node: _Node) -> None:
        if self._closing or node.link is not None:
            return
        node.config_error = None
        node.connects += 1
        node.conn = ClientConnection(
            self._config.identify_body(), auth_secret=self._config.auth_secret
        )
        node.ready_by = time.monotonic() + self._config.connect_timeout
        node.connecting = True
        link = self._loop.connect(node, node.host, node.port, self._config.connect_timeout)
        node.connecting = False
        if node.conn is not None:  # not failed at once (name resolution, refused...)
            node.link = link

    def _ready_nodes(self) -> list[_Node]:
        return [n for n in self._nodes if n.ready]

    def _dispatch(self, request: _Request) -> None:
        if request.future._done:
            return
        if self._closing:
            self._fail_request(request, NSQError("Producer closed"))
            return
        if request.attempts > len(self._nodes):
            self._fail_request(
                request,
                NoNSQDAvailable(
                    f"{request.kind} to {request.topic!r}: sent {request.attempts} times, every "
                    f"connection died before answering "
                    f"({'; '.join(f'{n.address}: {n.last_error}' for n in self._nodes)})"
                ),
            )
            return
        ready = self._ready_nodes()
        if ready:
            tried = request.tried
            if tried:
                ready = [n for n in ready if n.address not in tried] or ready
        else:
            self._waiting.append(request)
            now = time.monotonic()
            for node in self._nodes:
                # A node that refused IDENTIFY is tried again only for a new publish.
                if node.link is None and (now >= node.retry_at or node.config_error):
                    self._connect(node)
            return
        node = ready[next(self._rr) % len(ready)]
        self._send_to(node, request)

    def _send_to(self, node: _Node, request: _Request) -> bool:
        """Queue ``request`` on ``node``'s connection; False when the core refused it."""
        conn = node.conn
        assert conn is not None and node.link is not None
        if request.tried is None:
            request.tried = {node.address}
        else:
            request.tried.add(node.address)
        request.attempts += 1
        try:
            if request.kind == "PUB":
                request_id = conn.publish(request.topic, request.payload)
            elif request.kind == "MPUB":
                request_id = conn.multi_publish(request.topic, request.payload)
            else:
                body, delay = request.payload
                request_id = conn.deferred_publish(request.topic, body, delay)
        except NSQError as exc:  # validated by the caller already; never crash the IO thread
            self._fail_request(request, exc)
            return False
        node.inflight[request_id] = request
        check = request.start + self._expiry_tick
        if self._expiry_check is None or check < self._expiry_check:
            self._expiry_check = check
        return True

    def _fail_request(self, request: _Request, error: BaseException) -> None:
        if not request.future._done:
            self._failed += 1
            self._complete(request, error)

    def _node_of(self, link: Link) -> _Node:
        node = link.key
        assert isinstance(node, _Node)
        return node

    def on_connected(self, link: Link, now: float) -> None:
        pass  # the connection's magic and IDENTIFY are flushed by the loop

    def on_data(self, link: Link, data: bytes, now: float) -> None:
        with self._io_lock:
            self._on_data(link, data, now)

    def _on_data(self, link: Link, data: bytes, now: float) -> None:
        node = self._node_of(link)
        if node.link is not link or node.conn is None:
            return
        for event in node.conn.receive_data(data, now):
            if type(event) is PublishAcknowledged:
                request = node.inflight.pop(event.request_id, None)
                if request is not None and not request.future._done:
                    node.published += 1
                    self._published += 1
                    self._complete(request, None)
            elif isinstance(event, PublishFailed):
                request = node.inflight.pop(event.request_id, None)
                node.failed += 1
                if request is not None:
                    node.log.warning(
                        "%s to %r refused: %s", request.kind, request.topic, event.error
                    )
                    self._fail_request(request, event.error)
            elif isinstance(event, ConnectionReady):
                node.ready = True
                node.ready_by = None
                node.failures = 0
                node.last_error = None
                node.log.debug("connected")
                self._drain_waiting()
            elif isinstance(event, TLSUpgradeRequired):
                assert self._ssl_context is not None
                self._loop.start_tls(
                    link,
                    self._ssl_context,
                    self._options.tls.server_hostname(node.host),
                    event.trailing_data,
                )
            elif isinstance(event, ConnectionClosed):
                self._on_closed(node, event.error, now)

    def on_tls_established(self, link: Link, now: float) -> None:
        with self._io_lock:
            self._on_tls_established(link, now)

    def _on_tls_established(self, link: Link, now: float) -> None:
        node = self._node_of(link)
        if node.conn is not None and node.link is link:
            node.conn.tls_established()

    def on_link_error(self, link: Link, error: BaseException, now: float) -> None:
        with self._io_lock:
            self._on_link_error(link, error, now)

    def _on_link_error(self, link: Link, error: BaseException, now: float) -> None:
        node = self._node_of(link)
        if node.link is not link and not node.connecting:
            return
        if node.conn is not None and node.conn.state is not ConnectionState.CLOSED:
            # The socket failed under the connection: let the core report what was pending.
            for event in node.conn.receive_data(b"", now):
                if isinstance(event, ConnectionClosed):
                    self._on_closed(node, ConnectionLost(f"{type(error).__name__}: {error}"), now)
                    return
        self._on_closed(node, ConnectionLost(f"{type(error).__name__}: {error}"), now)

    def _on_closed(self, node: _Node, error: NSQError | None, now: float) -> None:
        if node.link is not None:
            self._loop.close_link(node.link)
        node.link = None
        node.conn = None
        node.ready = False
        node.ready_by = None
        if self._closing:
            return
        if isinstance(error, IdentifyRejected):
            # The configuration's fault: reconnecting cannot help, so nothing retries it.
            # Publishes waiting for a connection fail with it; a later publish tries again.
            node.config_error = error
            node.last_error = str(error)
            node.retry_at = float("inf")
            node.log.error("%s", error)
            waiting, self._waiting = self._waiting, deque()
            for request in waiting:
                self._fail_request(request, error)
            orphans = list(node.inflight.values())
            node.inflight.clear()
            for request in orphans:
                self._fail_request(request, error)
            return
        node.failures += 1
        node.last_error = str(error) if error is not None else "closed"
        node.retry_at = now + reconnect_delay(
            node.failures,
            self._config.reconnect_delay,
            self._config.max_reconnect_delay,
            self._config.reconnect_jitter,
            self._rng,
        )
        node.log.warning(
            "connection lost (%s); %d publishes to retry elsewhere; reconnect in %.1fs",
            node.last_error,
            len(node.inflight),
            node.retry_at - now,
        )
        orphans = list(node.inflight.values())
        node.inflight.clear()
        node.out_pending.clear()
        not_read = isinstance(error, ServerError)
        for request in orphans:
            self._retried += 1
            if not_read:
                # nsqd closed the connection after refusing a publish ahead of this one and
                # never read this one: resending it is not a retry it should pay for.
                request.attempts -= 1
                if request.tried is not None:
                    request.tried.discard(node.address)
            self._dispatch(request)

    def _drain_waiting(self) -> None:
        waiting = self._waiting
        self._waiting = deque()
        for request in waiting:
            self._dispatch(request)

    def write_pending(self) -> None:
        with self._io_lock:
            for node in self._nodes:
                if node.conn is not None and node.link is not None and not node.sending:
                    if node.out_pending:
                        self._loop.write(node.link, bytes(node.out_pending))
                        node.out_pending.clear()
                    data = node.conn.data_to_send()
                    if data:
                        self._loop.write(node.link, data)

    def next_deadline(self) -> float | None:
        with self._io_lock:
            return self._next_deadline()

    def _next_deadline(self) -> float | None:
        deadlines: list[float] = []
        for node in self._nodes:
            if node.conn is not None:
                deadline = node.conn.next_deadline()
                if deadline is not None:
                    deadlines.append(deadline)
                if node.ready_by is not None:
                    deadlines.append(node.ready_by)
            elif not self._closing and node.config_error is None:
                deadlines.append(node.retry_at)
        if self._waiting:
            deadlines.append(min(r.deadline for r in self._waiting))
        if self._expiry_check is not None:
            deadlines.append(self._expiry_check)
        return min(deadlines) if deadlines else None

    def handle_timer(self, now: float) -> None:
        with self._io_lock:
            self._handle_timer(now)

    def _handle_timer(self, now: float) -> None:
        for node in self._nodes:
            if node.conn is not None:
                if node.ready_by is not None and now >= node.ready_by:
                    node.ready_by = None
                    self._on_closed(
                        node,
                        ConnectionLost(
                            f"no answer to IDENTIFY within {self._config.connect_timeout:g}s"
                        ),
                        now,
                    )
                    continue
                for event in node.conn.handle_timer(now):
                    if isinstance(event, ConnectionClosed):
                        self._on_closed(node, event.error, now)
            elif now >= node.retry_at and not self._closing:
                self._connect(node)
        if self._waiting:
            keep: deque[_Request] = deque()
            for request in self._waiting:
                if now >= request.deadline:
                    self._fail_request(
                        request,
                        NoNSQDAvailable(
                            f"{request.kind} to {request.topic!r}: no nsqd available "
                            f"({'; '.join(f'{n.address}: {n.last_error}' for n in self._nodes)})"
                        ),
                    )
                elif not request.future._done:
                    keep.append(request)
            self._waiting = keep
        if self._expiry_check is not None and now >= self._expiry_check:
            self._expire_inflight(now)

    def _expire_inflight(self, now: float) -> None:
        """Fail publishes unanswered past their deadline. They stay known to the core, which
        matches nsqd's late answer to them (and it is dropped): one periodic scan, not a timer
        per publish."""
        busy = False
        for node in self._nodes:
            if not node.inflight:
                continue
            expired = [rid for rid, r in node.inflight.items() if now >= r.deadline]
            for request_id in expired:
                request = node.inflight.pop(request_id)
                self._fail_request(
                    request,
                    TimeoutError(
                        f"{request.kind} to {request.topic!r}: no answer from {node.address} "
                        f"within {request.deadline - request.start:g}s"
                    ),
                )
            busy = busy or bool(node.inflight)
        self._expiry_check = now + self._expiry_tick if busy else None

"""Blocking producer: a pool of nsqd connections with failover, pipelining and back-pressure.

::

    with Producer(["127.0.0.1:4150", "127.0.0.1:4250"]) as p:
        p.publish("events", b"hello")                     # waits for nsqd's OK
        p.multi_publish("events", [b"a", b"b"])           # atomic MPUB
        p.deferred_publish("events", b"later", delay=5.0)
        futures = [p.publish_async("events", b"%d" % i) for i in range(10_000)]
        for f in futures:
            f.result()

Publishes from any number of threads are pipelined: many PUBs are in flight on one connection
and nsqd's answers are matched to them in order by the core. ``max_pending`` bounds the
publishes not yet answered: a call beyond it blocks (back-pressure) instead of buffering
without limit.

Who does the IO (plain TCP): a thread that publishes writes its request itself, together with
whatever other threads queued meanwhile (one writer at a time per connection). A thread that
waits for an answer (``publish()``, ``PublishFuture.result()``) reads the socket itself while
no other thread does (leader/followers): the leader reads every answer available, completes
the others' calls, and when its own answer is in, hands the read role to the oldest waiting
caller. The IO thread reads only when no caller does (it takes the socket back after a short
idle time, so heartbeats are answered on an idle producer), and it connects, fails over,
enforces deadlines and writes what no caller wrote. With TLS the IO thread does all the IO.

``connections_per_nsqd`` (default 1) opens that many connections to each nsqd; publishes go
round robin over all of them, each connection keeping every guarantee below.

Failover: each publish goes to the next connected nsqd (round robin). When a connection dies with
publishes unanswered, they are sent again, preferring an nsqd they were not tried on, at most
``len(nsqd) + 1`` times in all and only until their ``timeout``; while no nsqd is connected they
wait (reconnection follows the config's capped exponential ``reconnect_delay``). A publish that
nsqd *refused* (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...) fails at once with that error (the
others pipelined on that connection are retried). A publish whose answer was lost may be
delivered twice: NSQ is at-least-once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import random
import select
import socket
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
    Heartbeat,
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
    check_connections_per_nsqd,
    format_address,
    parse_address,
    split_options,
)
from transports._common.arguments import check_seconds

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


class _Request(PublishFuture):
    """One publish: what to send, where it is, and the future its caller gets.

    Every field is read and written under the producer's ``_io_lock``. A thread waiting for it
    parks on ``_waiter`` (a lock held while not ``_signaled``), released when the request is
    done or when the thread is handed the connection's read role (``_Wire.leader``).
    """

    __slots__ = (
        "_signaled",
        "attempts",
        "deadline",
        "kind",
        "node",
        "payload",
        "producer",
        "promoted",
        "start",
        "topic",
        "tried",
        "waiting",
    )

    def __init__(
        self,
        producer: Producer,
        kind: str,
        topic: str,
        payload: Any,
        start: float,
        deadline: float,
    ) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._waiter: Any = None
        self._callbacks: list[Callable[[PublishFuture], object]] | None = None
        self._signaled = False
        self.producer = producer
        self.kind = kind
        self.topic = topic
        self.payload = payload
        self.start = start
        self.deadline = deadline
        self.tried: set[str] | None = None  # nsqd addresses it was sent to
        self.attempts = 0
        #: The node whose connection it is in flight on (None: not sent, or done).
        self.node: _Node | None = None
        #: Threads parked on ``_waiter`` (candidates for the read role).
        self.waiting = 0
        #: The node whose read role was handed to this request's thread, until it takes it.
        self.promoted: _Node | None = None

    def _wait(self, timeout: float | None) -> None:
        if not self._done:
            self.producer._await(self, timeout)

    def add_done_callback(self, fn: Callable[[PublishFuture], object]) -> None:
        """Call ``fn(future)`` when done: at once if it is, else on the thread that completes
        it (the one that read nsqd's answer, or the IO thread)."""
        producer = self.producer
        with producer._io_lock:
            if not self._done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(fn)
                producer._rescue_reads()  # nobody may be waiting to read its answer
                return
        fn(self)

    def _set(self, error: BaseException | None) -> None:
        """Under the producer's lock: done; wake the waiters; run the callbacks."""
        self._error = error
        self._done = True
        waiter = self._waiter
        if waiter is not None and not self._signaled:
            self._signaled = True
            wakes = self.producer._wakes
            if wakes is None:
                waiter.release()
            else:
                wakes.append(waiter)  # released once the lock is given up
        callbacks = self._callbacks
        if callbacks:
            self._callbacks = None
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:
                    _log.exception("publish future callback failed")


#: How long (seconds) a connection read by callers stays theirs with no caller reading, before
#: the IO thread watches it again; also how often the IO thread looks (only while callers read).
_DIRECT_IDLE = 0.02
#: Bytes asked of the kernel per read by a caller (answers are 10 bytes each).
_READ_SIZE = 64 * 1024
#: The most inflight requests looked at for a waiting caller to hand the read role to.
_HANDOFF_SCAN = 64
#: What :meth:`Producer._dispatch_now` did with a request.
_VIA_IO_THREAD, _SENT, _PARKED, _NO_SLOT = 0, 1, 2, 3


class _Wire:
    """Callers' direct access to one plain TCP connection: a duplicate of its socket (so the
    IO loop closing its own descriptor never pulls this one from under a reader) and who uses
    it. Retired with its connection; the descriptor is closed by its last user."""

    __slots__ = (
        "broken",
        "closed",
        "direct",
        "lead_end",
        "leader",
        "poll",
        "retired",
        "sending",
        "sock",
        "users",
        "want_direct",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        self.poll = poller.poll
        #: Callers read the socket (the IO loop's reads of it are paused).
        self.direct = False
        #: A caller waiting for an answer asked for ``direct`` (the IO thread switches).
        self.want_direct = False
        #: The request whose thread holds the read role (``direct`` only).
        self.leader: _Request | None = None
        self.lead_end = 0.0
        #: A caller is writing to the socket (outside the lock): the only writer meanwhile.
        self.sending = False
        #: Threads using ``sock`` outside the lock right now (the leader, the writer).
        self.users = 0
        self.retired = False
        self.closed = False
        #: The loop failed writing to the connection while a caller read it.
        self.broken: BaseException | None = None


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
        #: Plain TCP, ready: callers' direct access to the socket (None: the IO thread's only).
        self.wire: _Wire | None = None
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
        connections_per_nsqd: int = 1,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ValueError("Producer needs at least one nsqd address")
        #: Called once per publish request when it completes; None costs nothing.
        self.publish_observer: PublishObserver | None = publish_observer
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending={max_pending!r} must be an int >= 1")
        check_connections_per_nsqd(connections_per_nsqd)
        check_seconds("Producer timeout", timeout, zero=False, error=ConfigError)
        self._config, self._options = split_options(config, options)
        self._timeout = timeout
        #: One node per connection: ``connections_per_nsqd`` for each nsqd address.
        self._nodes: list[_Node] = []
        hosts = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            hosts.append(format_address(host, port))
            for _ in range(connections_per_nsqd):
                self._nodes.append(_Node(format_address(host, port), host, port))
        #: Distinct nsqd: a publish is sent at most this many times + 1 (failover).
        self._nsqd_count = len(set(hosts))
        self._ssl_context = self._options.ssl_context() if self._config.tls_v1 else None
        #: Serializes the IO thread's callbacks and the callers' own IO (see the module doc).
        self._io_lock = threading.RLock()
        # Back-pressure: publishes submitted minus publishes answered (both under _io_lock),
        # bounded by max_pending; callers over it wait on _space.
        self._space = threading.Condition(self._io_lock)
        self._submitted = 0
        self._completed = 0
        self._space_waiters = 0
        self._max_pending = max_pending
        self._waiting: deque[_Request] = deque()
        self._rr = itertools.count()
        self._rng = random.Random()
        self._loop = IOLoop(self, name="nsq-sync-producer")
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
        #: When the IO thread next looks at connections read by callers (None: there are none).
        self._direct_check: float | None = None
        #: While a leader completes a batch: the waiters to wake after it gives up the lock
        #: (so they do not wake straight into a lock it holds).
        self._wakes: list[Any] | None = None

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
        if self._pending_count():
            self._rescue_reads()
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
                if node.wire is not None:
                    self._retire(node.wire)
                    node.wire = None
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
        if topic not in self._valid_topics or type(body) is not bytes or not body:
            encode_pub(topic, body)
            self._valid_topics.add(topic)
        self._call("PUB", topic, body, timeout)

    def multi_publish(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> None:
        """``MPUB`` (all or nothing) and wait for nsqd's OK."""
        bodies = self._checked_batch(topic, bodies)
        self._call("MPUB", topic, bodies, timeout)

    def deferred_publish(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> None:
        """``DPUB``: delivered after ``delay`` seconds; waits for nsqd's OK."""
        check_seconds("DPUB delay", delay)
        encode_dpub(topic, round(delay * 1000), body)
        self._call("DPUB", topic, (body, delay), timeout)

    def publish_async(
        self, topic: str, body: bytes, *, timeout: float | None = None
    ) -> PublishFuture:
        """Queue a ``PUB``; the future resolves with nsqd's answer. Blocks while
        ``max_pending`` publishes are unanswered (back-pressure)."""
        # Validate here, in the caller's thread (cheaply: topics are remembered).
        if topic not in self._valid_topics or type(body) is not bytes or not body:
            encode_pub(topic, body)
            self._valid_topics.add(topic)
        return self._submit("PUB", topic, body, timeout, False)[0]

    def multi_publish_async(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> PublishFuture:
        bodies = self._checked_batch(topic, bodies)
        return self._submit("MPUB", topic, bodies, timeout, False)[0]

    def _checked_batch(self, topic: str, bodies: Sequence[bytes]) -> list[bytes]:
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
        return bodies

    def deferred_publish_async(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> PublishFuture:
        check_seconds("DPUB delay", delay)
        encode_dpub(topic, round(delay * 1000), body)
        return self._submit("DPUB", topic, (body, delay), timeout, False)[0]

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish handed over so far was answered."""
        if timeout is not None:
            check_seconds("flush timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pending_count():
            self._rescue_reads()
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

    def _call(self, kind: str, topic: str, payload: Any, timeout: float | None) -> None:
        """Publish and wait for the answer (the calling thread may write and read itself)."""
        request, parked = self._submit(kind, topic, payload, timeout, True)
        limit = self._timeout if timeout is None else timeout
        try:
            self._await(request, limit + 1.0, parked)
        except TimeoutError:
            raise TimeoutError(f"nsqd did not answer within {limit}s") from None
        if request._error is not None:
            raise request._error

    def _submit(
        self, kind: str, topic: str, payload: Any, timeout: float | None, sync: bool
    ) -> tuple[_Request, bool]:
        """A new request, sent (or handed to the IO thread); True when the caller (``sync``)
        is already registered as waiting for it (see :meth:`_dispatch_now`)."""
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
        now = time.monotonic()
        request = _Request(self, kind, topic, payload, now, now + limit)
        outcome = self._dispatch_now(request, sync, False)
        if outcome == _NO_SLOT:
            try:
                self._reserve(request)
            except TimeoutError as exc:
                observer = self.publish_observer
                if observer is not None:
                    count = len(payload) if kind == "MPUB" else 1
                    try:
                        observer(topic, count, time.monotonic() - now, exc)
                    except Exception:
                        _log.exception("publish_observer failed")
                raise
            outcome = self._dispatch_now(request, sync, True)
        if outcome == _VIA_IO_THREAD:
            self._loop.call_soon(lambda: self._locked(self._dispatch, request))
        return request, outcome == _PARKED

    def _locked(self, fn: Callable[..., None], *args: Any) -> None:
        with self._io_lock:
            fn(*args)

    def _dispatch_now(self, request: _Request, sync: bool, reserved: bool) -> int:
        """Caller's thread: queue ``request`` on a connected nsqd and get it written: by this
        thread when no other writes there (its own bytes and whatever others queued), else by
        the thread writing now. While another caller holds the read role, a ``sync`` caller
        only queues its request and parks (:data:`_PARKED`): the leader writes what was queued
        after each read and completes it. A ``publish_async`` behind others in flight is left
        queued for the next writer (a caller about to wait, or the IO thread) so a burst goes
        out in few writes. :data:`_VIA_IO_THREAD` when it must go through the IO thread
        (nothing connected, publishes waiting for a connection). :data:`_NO_SLOT` (nothing
        done) when ``max_pending`` publishes are unanswered and no slot is ``reserved``."""
        with self._io_lock:
            if not reserved:
                if self._submitted - self._completed >= self._max_pending:
                    return _NO_SLOT
                self._submitted += 1
            if self._closing or self._waiting:
                return _VIA_IO_THREAD
            nodes = self._nodes
            if len(nodes) == 1:
                node = nodes[0]
                if not node.ready:
                    return _VIA_IO_THREAD
            else:
                ready = [n for n in nodes if n.ready]
                if not ready:
                    return _VIA_IO_THREAD
                node = ready[next(self._rr) % len(ready)]
            if not self._send_to(node, request):
                return _SENT  # failed (the future says why)
            wire = node.wire
            if wire is None or wire.retired:  # TLS, or going down: the IO thread writes
                self._loop.wake()
                return _SENT
            if sync and wire.leader is not None:
                waiter = request._waiter = _allocate_lock()
                waiter.acquire()
                request.waiting = 1
                return _PARKED
            if wire.sending:
                return _SENT  # the thread writing now takes these bytes too
            link = node.link
            assert link is not None
            if node.out_pending or link.out:
                self._loop.wake()  # the kernel's buffer was full: the IO thread goes first
                return _SENT
            if not sync and len(node.inflight) > 1:
                if not wire.direct:
                    self._loop.wake()  # the IO thread writes the whole burst at once
                # else: written by the next caller that waits, or the IO thread's next look
                return _SENT
            conn = node.conn
            assert conn is not None
            data = conn.data_to_send()
            wire.sending = True
            wire.users += 1
        self._write_direct(node, wire, conn, data)
        return _SENT

    def _take_output(self, node: _Node, wire: _Wire, conn: ClientConnection) -> bytes:
        """Lock held: what ``conn`` queued, with the writer role, when it is free (else b"")."""
        if wire.sending or wire.retired or node.out_pending:
            return b""
        link = node.link
        if link is None or link.out:
            return b""
        data = conn.data_to_send()
        if data:
            wire.sending = True
            wire.users += 1
        return data

    def _write_direct(self, node: _Node, wire: _Wire, conn: ClientConnection, data: bytes) -> None:
        """Holding ``wire.sending``: send ``data``, then whatever others queued meanwhile, on
        this thread; what the kernel does not take goes to the IO thread."""
        send = wire.sock.send
        lock = self._io_lock
        while True:
            try:
                sent = send(data)
            except OSError:  # would block, or broken: the IO thread takes it from here
                sent = 0
            with lock:
                if wire.retired or node.conn is not conn:
                    wire.sending = False
                    self._unuse(wire)
                    return  # the connection died meanwhile: its bytes go with it
                link = node.link
                assert link is not None
                link.bytes_out += sent
                if sent < len(data):
                    node.out_pending[:0] = memoryview(data)[sent:]
                    wire.sending = False
                    self._unuse(wire)
                    self._loop.wake()
                    return
                data = conn.data_to_send()
                if not data:
                    wire.sending = False
                    self._unuse(wire)
                    return

    def _await(self, request: _Request, timeout: float | None, parked: bool = False) -> None:
        """Wait until ``request`` is done, or ``timeout`` (TimeoutError): reading its
        connection when no other thread does, else parked until its answer is in (or the read
        role is handed to it). ``parked``: already registered as waiting (``_dispatch_now``)."""
        until = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        lock = self._io_lock
        waiter = request._waiter if parked else None
        while True:
            if waiter is None:
                lead = False
                write = b""
                conn: ClientConnection | None = None
                with lock:
                    if request._done or (until is not None and time.monotonic() >= until):
                        self._drop_role(request)
                        if request._done:
                            return
                        raise TimeoutError(f"no answer from nsqd within {timeout}s")
                    node = request.node
                    wire = node.wire if node is not None else None
                    if node is not None and wire is not None and not wire.retired:
                        conn = node.conn
                        assert conn is not None
                        if wire.direct:
                            if wire.leader is None or wire.leader is request:
                                request.promoted = None
                                wire.leader = request
                                wire.users += 1
                                lead = True
                        else:
                            wire.want_direct = True  # the IO thread hands the reads over
                        if wire.leader is None or lead:
                            # What publish_async left queued (a leader writes the rest).
                            write = self._take_output(node, wire, conn)
                    if not lead and not write:
                        waiter = request._waiter
                        if waiter is None:
                            waiter = request._waiter = _allocate_lock()
                            waiter.acquire()
                        request.waiting += 1
                if write:
                    assert node is not None and wire is not None and conn is not None
                    self._write_direct(node, wire, conn, write)
                if lead:
                    assert node is not None and wire is not None
                    self._lead(node, wire, request, until)
                if waiter is None:
                    continue
            if until is None:
                got = waiter.acquire()
            else:
                remaining = until - time.monotonic()
                got = waiter.acquire(True, remaining) if remaining > 0 else waiter.acquire(False)
            if got and request._done and request.promoted is None:  # no lock needed
                waiter.release()  # let any other thread waiting for it through
                return
            with lock:
                request.waiting -= 1
                if got or request._signaled:
                    if not got:  # released between our time-out and now: take it back
                        waiter.acquire(False)
                    request._signaled = False
                if request._done or not got:
                    self._drop_role(request)
                if request._done:
                    request._signaled = True
                    waiter.release()
                    return
                if not got:
                    raise TimeoutError(f"no answer from nsqd within {timeout}s")
            waiter = None  # woken without an answer: handed the read role, or moved

    def _lead(self, node: _Node, wire: _Wire, request: _Request, until: float | None) -> None:
        """Holding the read role of ``node``'s connection: read and dispatch answers, and
        write what other callers queued meanwhile, until ``request``'s own answer is in, its
        deadline or ``until`` passes, or the connection goes."""
        conn = node.conn
        link = node.link
        assert conn is not None and link is not None
        poll = wire.poll
        recv = wire.sock.recv
        lock = self._io_lock
        monotonic = time.monotonic
        deadline = request.deadline
        limit = deadline if until is None or until > deadline else until
        wakes: list[Any] | None = None
        while True:
            wait = limit - monotonic()
            data = None
            error: OSError | None = None
            if wait > 0:
                try:
                    ready = poll(int(wait * 1000) + 1)
                except OSError as exc:  # pragma: no cover - EINTR is retried by Python
                    ready, error = [], exc
                if ready:
                    try:
                        data = recv(_READ_SIZE)
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError as exc:
                        error = exc
            stop = True
            with lock:
                if wire.retired or wire.leader is not request or node.conn is not conn:
                    pass
                elif error is not None:
                    self._lost_by_caller(node, wire, link, error)
                else:
                    now = monotonic()
                    if data is not None:
                        link.bytes_in += len(data)
                        self._wakes = wakes = []
                        try:
                            self._feed(node, wire, conn, data, now)
                        finally:
                            self._wakes = None
                    if request._done or wire.retired:
                        pass
                    elif now >= deadline:
                        self._expire(node, request, now)
                    elif until is None or now < until:
                        stop = False
                out = self._take_output(node, wire, conn)
                if stop:
                    self._unuse(wire)
                    if wire.leader is request:
                        self._release_lead(node, wire)
            if wakes:
                for waiter in wakes:
                    waiter.release()
                wakes = None
            if out:
                self._write_direct(node, wire, conn, out)
            if stop:
                return

    def _feed(
        self, node: _Node, wire: _Wire, conn: ClientConnection, data: bytes, now: float
    ) -> None:
        """A leader's read (lock held): answers complete their publishes here; what needs the
        IO loop (a closed connection, a NOP to write) is handed to the IO thread."""
        inflight = node.inflight
        for event in conn.receive_data(data, now):
            if type(event) is PublishAcknowledged:
                request = inflight.pop(event.request_id, None)
                if request is not None and not request._done:
                    node.published += 1
                    self._published += 1
                    self._complete(request, None)
            elif isinstance(event, PublishFailed):
                request = inflight.pop(event.request_id, None)
                node.failed += 1
                if request is not None:
                    node.log.warning(
                        "%s to %r refused: %s", request.kind, request.topic, event.error
                    )
                    self._fail_request(request, event.error)
            elif type(event) is Heartbeat:
                self._loop.wake()  # the IO thread writes the NOP the core queued
            elif isinstance(event, ConnectionClosed):
                node.ready = False  # nothing more goes there; the IO thread tears it down
                self._retire(wire)
                self._loop.call_soon(
                    functools.partial(self._locked, self._closed_by_caller, node, conn, event.error)
                )

    def _lost_by_caller(self, node: _Node, wire: _Wire, link: Link, error: OSError) -> None:
        """A leader's read failed (lock held): the IO thread tears the connection down."""
        node.ready = False
        self._retire(wire)
        self._loop.call_soon(
            lambda: self._locked(self._on_link_error, link, error, time.monotonic())
        )

    def _closed_by_caller(
        self, node: _Node, conn: ClientConnection, error: NSQError | None
    ) -> None:
        if node.conn is conn:
            self._on_closed(node, error, time.monotonic())

    def _expire(self, node: _Node, request: _Request, now: float) -> None:
        """Fail ``request`` (lock held) for its deadline; it stays known to the core, which
        matches nsqd's late answer to it (and drops it)."""
        for request_id, pending in node.inflight.items():
            if pending is request:
                del node.inflight[request_id]
                break
        self._fail_request(
            request,
            TimeoutError(
                f"{request.kind} to {request.topic!r}: no answer from {node.address} "
                f"within {request.deadline - request.start:g}s"
            ),
        )

    def _release_lead(self, node: _Node, wire: _Wire) -> None:
        """Give up the read role (lock held): to the oldest caller waiting for an answer on
        this connection; with publishes in flight and nobody waiting, to the IO thread."""
        wire.leader = None
        wire.lead_end = time.monotonic()
        if wire.broken is not None and not wire.retired:
            self._loop.call_soon(lambda: self._locked(self._finish_broken, node, wire))
            return
        if wire.retired or not node.inflight:
            return
        successor = self._waiter_of(node)
        if successor is not None:
            self._hand_role(node, wire, successor)
        else:
            self._loop.call_soon(lambda: self._locked(self._ensure_reader, node))

    def _finish_broken(self, node: _Node, wire: _Wire) -> None:
        """IO thread: the loop's write failed while a caller read; it left without seeing it."""
        link = node.link
        if node.wire is wire and wire.leader is None and link is not None and wire.broken:
            self._on_link_error(link, wire.broken, time.monotonic())

    def _hand_role(self, node: _Node, wire: _Wire, successor: _Request) -> None:
        """Lock held: make ``successor``'s (parked) thread the reader of ``wire``."""
        wire.leader = successor
        successor.promoted = node
        successor._signaled = True
        successor._waiter.release()

    def _drop_role(self, request: _Request) -> None:
        """Lock held: ``request``'s thread leaves without taking the read role it was
        handed (its answer came another way, or it gave up): hand it on."""
        node = request.promoted
        if node is not None:
            request.promoted = None
            wire = node.wire
            if wire is not None and wire.leader is request:
                self._release_lead(node, wire)

    def _waiter_of(self, node: _Node) -> _Request | None:
        """The oldest request in flight on ``node`` that a thread waits for (lock held)."""
        for request in itertools.islice(node.inflight.values(), _HANDOFF_SCAN):
            if request.waiting and not request._signaled:
                return request
        return None

    def _ensure_reader(self, node: _Node) -> None:
        """IO thread: answers are expected on ``node`` and no caller reads them: hand the read
        role to a waiting caller, else read them here."""
        wire = node.wire
        if wire is None or not wire.direct or wire.leader is not None or wire.retired:
            return
        if not node.inflight:
            return
        successor = self._waiter_of(node)
        if successor is not None:
            self._hand_role(node, wire, successor)
        else:
            self._leave_direct(node, wire)

    def _enter_direct(self, node: _Node, wire: _Wire) -> None:
        """IO thread: callers read this connection from now on (one waits for an answer)."""
        wire.want_direct = False
        if node.inflight:
            successor = self._waiter_of(node)
            if successor is None:
                return  # only publish_async in flight: keep reading here
            self._hand_role(node, wire, successor)
        link = node.link
        assert link is not None
        wire.direct = True
        wire.lead_end = time.monotonic()
        self._loop.pause_reading(link)
        if self._direct_check is None:
            self._direct_check = wire.lead_end + _DIRECT_IDLE

    def _leave_direct(self, node: _Node, wire: _Wire) -> None:
        """IO thread: watch this connection again (no caller reads it)."""
        wire.direct = False
        link = node.link
        if link is not None:
            self._loop.resume_reading(link)

    def _check_direct(self, now: float) -> None:
        """IO thread, while callers read some connections: take back the ones nobody reads
        (heartbeats must be answered on an idle producer) or whose answers nobody waits for."""
        busy = False
        for node in self._nodes:
            wire = node.wire
            if wire is None or not wire.direct:
                continue
            if wire.leader is None:
                if node.inflight:
                    self._ensure_reader(node)
                elif now - wire.lead_end >= _DIRECT_IDLE:
                    self._leave_direct(node, wire)
            busy = busy or wire.direct
        self._direct_check = now + _DIRECT_IDLE if busy else None

    def _rescue_reads(self) -> None:
        """Someone waits without reading (flush, close, a callback, back-pressure): make sure
        the answers in flight on connections read by callers get read."""
        with self._io_lock:
            for node in self._nodes:
                wire = node.wire
                if wire is not None and wire.direct and wire.leader is None and node.inflight:
                    self._loop.call_soon(lambda: self._locked(self._check_direct, time.monotonic()))
                    return

    def _retire(self, wire: _Wire) -> None:
        """The connection under ``wire`` is going (lock held): nobody starts using it; its
        users are woken (shutdown) and the last one closes it."""
        if wire.retired:
            return
        wire.retired = True
        wire.direct = False
        wire.leader = None
        if wire.users:
            with contextlib.suppress(OSError):
                wire.sock.shutdown(socket.SHUT_RDWR)
        else:
            wire.closed = True
            wire.sock.close()

    def _unuse(self, wire: _Wire) -> None:
        wire.users -= 1
        if wire.retired and not wire.users and not wire.closed:
            wire.closed = True
            wire.sock.close()

    def _reserve(self, request: _Request) -> None:
        """Block until one more publish may be in flight (``max_pending``), at most until
        ``request``'s deadline (TimeoutError), and count it."""
        self._rescue_reads()  # the answers that free slots must be read by someone
        space = self._space
        with space:
            self._space_waiters += 1
            try:
                while self._submitted - self._completed >= self._max_pending:
                    remaining = request.deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"{self._max_pending} publishes unanswered for "
                            f"{request.deadline - request.start:g}s (max_pending reached)"
                        )
                    # Short waits: a completion may race past a waiter registering.
                    space.wait(min(remaining, 0.05))
                self._submitted += 1
            finally:
                self._space_waiters -= 1

    def _complete(self, request: _Request, error: BaseException | None) -> None:
        """Lock held: resolve ``request`` once and free its back-pressure slot."""
        if request._done:
            return
        self._completed += 1
        request.node = None
        request._set(error)
        if self._space_waiters:
            self._space.notify()  # its lock is _io_lock, held here
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
        if request._done:
            return
        if self._closing:
            self._fail_request(request, NSQError("Producer closed"))
            return
        if request.attempts > self._nsqd_count:
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
        if self._send_to(node, request):
            wire = node.wire
            if wire is not None and wire.direct and wire.leader is None:
                self._ensure_reader(node)  # its caller may be parked, not reading

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
        request.node = node
        check = request.start + self._expiry_tick
        if self._expiry_check is None or check < self._expiry_check:
            self._expiry_check = check
        return True

    def _fail_request(self, request: _Request, error: BaseException) -> None:
        if not request._done:
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
                if request is not None and not request._done:
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
                if not link.tls:
                    node.wire = self._make_wire(link)
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
        wire = node.wire
        if wire is not None and wire.want_direct and not wire.direct and not wire.retired:
            self._enter_direct(node, wire)

    def _make_wire(self, link: Link) -> _Wire | None:
        """Plain TCP: a duplicate of the socket for callers to read and write directly."""
        sock = link.sock
        if sock is None:
            return None
        try:
            dup = socket.socket(sock.family, sock.type, sock.proto, fileno=os.dup(sock.fileno()))
        except OSError:
            return None
        dup.setblocking(False)
        return _Wire(dup)

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
        wire = node.wire
        if wire is not None and not wire.retired:
            # A write failed (nsqd closed the socket): what nsqd sent before it is still
            # readable. Its answers (and the error that made nsqd close) must be matched
            # first, or publishes nsqd stored would be sent again.
            if wire.leader is not None:
                # The caller reading it gets there and reports it (or, leaving first, has
                # the IO thread finish this).
                node.ready = False
                if wire.broken is None:
                    wire.broken = error
                return
            self._read_leftovers(node, wire, link, now)
            if node.link is not link:
                return  # what was read closed it (nsqd's error frame)
        if node.conn is not None and node.conn.state is not ConnectionState.CLOSED:
            # The socket failed under the connection: let the core report what was pending.
            for event in node.conn.receive_data(b"", now):
                if isinstance(event, ConnectionClosed):
                    self._on_closed(node, ConnectionLost(f"{type(error).__name__}: {error}"), now)
                    return
        self._on_closed(node, ConnectionLost(f"{type(error).__name__}: {error}"), now)

    def _read_leftovers(self, node: _Node, wire: _Wire, link: Link, now: float) -> None:
        """IO thread: feed what is left in the socket's receive buffer to the core."""
        while node.link is link and node.conn is not None:
            try:
                data = wire.sock.recv(_READ_SIZE)
            except OSError:
                return
            if not data:
                return
            self._on_data(link, data, now)

    def _on_closed(self, node: _Node, error: NSQError | None, now: float) -> None:
        if node.wire is not None:
            self._retire(node.wire)  # wakes a caller reading or writing it
            node.wire = None
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
            request.node = None
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
                wire = node.wire
                if (
                    node.conn is not None
                    and node.link is not None
                    and (wire is None or not wire.sending)
                ):
                    if node.out_pending:
                        self._loop.write(node.link, bytes(node.out_pending))
                        node.out_pending.clear()
                        if node.conn is None or node.link is None:
                            continue  # the write failed and tore the connection down
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
        if self._direct_check is not None:
            deadlines.append(self._direct_check)
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
                elif not request._done:
                    keep.append(request)
            self._waiting = keep
        if self._expiry_check is not None and now >= self._expiry_check:
            self._expire_inflight(now)
        if self._direct_check is not None and now >= self._direct_check:
            self._check_direct(now)

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

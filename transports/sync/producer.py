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

PUBs to one topic queued together (threads publishing at once, a burst of ``publish_async``)
go out as one MPUB: one write and one answer for nsqd instead of one each, which is what
bounds PUB throughput (nsqd flushes every answer). Each publish still gets its own answer; if
nsqd refuses the MPUB (all or nothing: nothing was stored), each PUB is sent again alone, so
only one at fault fails. ``coalesce=False`` writes one PUB per publish.

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
wait (a connection that worked is opened again at once; one that fails to open is tried
again after the config's capped exponential ``reconnect_delay``). A publish that
nsqd *refused* (``E_BAD_TOPIC``, ``E_BAD_MESSAGE``...) fails at once with that error (the
others pipelined on that connection are retried). A publish whose answer was lost may be
delivered twice: NSQ is at-least-once.

Where things are: this module is the user-facing :class:`Producer` (publish calls,
back-pressure, dispatch to a node, when the IO thread lends a socket to callers and takes it
back); callers reading their own answers are in ``_caller_reads.py``, the IO thread's
callbacks in ``_producer_io.py`` (both base classes of :class:`Producer`), what it keeps per
publish and per connection in ``_producer_records.py``, and :class:`PublishFuture` in
``publish_future.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import socket
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.connection import ClientConnection
from nsq_sansio.errors import (
    ConfigError,
    IncompatibleNSQD,
    LocalProtocolError,
    NoNSQDAvailable,
    NSQError,
)
from transports._common import (
    DEFAULT_TCP_PORT,
    ProducerStats,
    check_connections_per_nsqd,
    format_address,
    parse_address,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.failures import check_enter_once, closed_unanswered, no_slot, seconds
from transports._common.logs import fields
from transports._common.publishing import check_batch, check_deferred, check_publish

from ._caller_reads import CallerReads
from ._loop import IOLoop
from ._producer_io import ProducerIOThread
from ._producer_records import Node, Request, Wire, connection_stats
from .publish_future import PublishFuture, PublishObserver

__all__ = ["NoNSQDAvailable", "Producer", "PublishFuture"]

_log = logging.getLogger("nsq_sansio.sync.producer")


#: How long (seconds) a connection read by callers stays theirs with no caller reading, before
#: the IO thread watches it again; also how often the IO thread looks (only while callers read).
_DIRECT_IDLE = 0.02
#: What :meth:`Producer._dispatch_now` did with a request.
_VIA_IO_THREAD, _SENT, _PARKED, _NO_SLOT = 0, 1, 2, 3


class Producer(CallerReads, ProducerIOThread):
    """Publish to one or several nsqd over TCP. See the module docstring.

    Keyword arguments are Config fields (``snappy``, ``deflate``, ``auth_secret``,
    ``heartbeat_interval``...) or transport options (``connect_timeout``, ``tls=...``,
    ``tls_ca_file=...``). ``timeout`` bounds one publish (waiting for the answer included);
    when no nsqd can be connected, a publish fails within ``connect_timeout`` instead
    (:class:`~nsq_sansio.errors.NoNSQDAvailable`), and :meth:`connect` checks that at start-up.
    ``publish_observer(topic, messages, seconds, error)`` is called once per PUB/MPUB/DPUB
    when it completes; ``logger`` replaces ``nsq_sansio.sync.producer``.
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
        coalesce: bool = True,
        **options: Any,
    ) -> None:
        addresses = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        if not addresses:
            raise ConfigError("Producer needs at least one nsqd address")
        #: Called once per publish request when it completes; None costs nothing.
        self.publish_observer: PublishObserver | None = publish_observer
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending={max_pending!r} must be an int >= 1")
        check_connections_per_nsqd(connections_per_nsqd)
        if not isinstance(coalesce, bool):
            raise ConfigError(f"coalesce={coalesce!r} must be True or False")
        #: PUBs queued together (threads, ``publish_async``) go out as one MPUB.
        self._coalesce = coalesce
        check_seconds("Producer timeout", timeout, zero=False, error=ConfigError)
        self._config, self._options = split_options(config, options)
        self._timeout = timeout
        self._logger = logger or _log
        #: One node per connection: ``connections_per_nsqd`` for each nsqd address.
        self._nodes: list[Node] = []
        hosts = []
        for address in addresses:
            host, port = parse_address(address, DEFAULT_TCP_PORT)
            hosts.append(format_address(host, port))
            for _ in range(connections_per_nsqd):
                self._nodes.append(
                    Node(format_address(host, port), host, port, logger=self._logger)
                )
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
        self._waiting: deque[Request] = deque()
        self._rr = itertools.count()
        self._rng = random.Random()
        self._loop = IOLoop(self._loop_callbacks(), name="nsq-sync-producer")
        self._started = False
        #: The ``with`` block was entered (once: a nested block's end would close it).
        self._entered = False
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

    def _start(self) -> None:
        """Start the IO thread and connect to every nsqd (``with`` does it; publishing and
        :meth:`connect` too)."""
        with self._lock:
            if self._closed:
                raise LocalProtocolError("the producer is closed")
            if not self._started:
                self._started = True
                self._loop.start()
                self._loop.call_soon(lambda: self._locked(self._connect_all))

    def connect(self, timeout: float | None = None) -> None:
        """Connect to every nsqd of the pool now, and return once one is ready (the others go
        on connecting); raise :class:`~nsq_sansio.errors.NoNSQDAvailable` (each address's
        cause) when none could be connected within ``timeout`` (default ``connect_timeout``),
        or the configuration's error when an nsqd refused it. For a service that must not
        start without nsqd; publishing connects by itself otherwise."""
        if timeout is not None:
            check_seconds("connect timeout", timeout, zero=False)
        self._start()
        limit = self._config.connect_timeout if timeout is None else timeout
        # Without a timeout, the attempts end by themselves (connect_timeout): a margin lets
        # the IO thread report them.
        deadline = time.monotonic() + (limit + 1.0 if timeout is None else limit)
        tried = threading.Event()

        def reconnect() -> None:
            for node in self._nodes:
                if node.link is None:
                    self._connect(node)
            tried.set()

        self._loop.call_soon(lambda: self._locked(reconnect))
        tried.wait(limit)
        while True:
            with self._io_lock:
                if any(node.ready for node in self._nodes):
                    return
                down = all(node.link is None for node in self._nodes)
                if down or time.monotonic() >= deadline:
                    for node in self._nodes:
                        if isinstance(node.config_error, IncompatibleNSQD):
                            raise node.config_error
                    error = self._unreachable(timed_out=limit)
                    raise NoNSQDAvailable(error.errors, what="a connection")
            time.sleep(0.005)

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
        with self._io_lock:
            # From here a publish that got its slot only now (it waited for one) fails in its
            # own thread (see _dispatch_now); those queued for the IO thread before this fail
            # there, ahead of shut() (the loop runs its calls in order).
            self._closing = True

        def shut() -> None:
            for request in list(self._waiting):
                self._fail_closed(request)
            self._waiting.clear()
            for node in self._nodes:
                for request in node.inflight.values():
                    self._fail_closed(request, sent=True)
                for request in node.held:
                    self._fail_closed(request)
                node.inflight.clear()
                node.held.clear()
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
        with self._lock:
            check_enter_once(self._closed, self._entered, "with")
            self._entered = True
        self._start()
        return self

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
            check_publish(self._valid_topics, topic, body)
        self._call("PUB", topic, body, timeout)

    def multi_publish(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> None:
        """``MPUB`` (all or nothing) and wait for nsqd's OK."""
        batch = check_batch(self._valid_topics, topic, bodies)
        self._call("MPUB", topic, batch, timeout)

    def deferred_publish(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> None:
        """``DPUB``: delivered after ``delay`` seconds; waits for nsqd's OK."""
        check_deferred(self._valid_topics, topic, body, delay, self._config.max_req_timeout)
        self._call("DPUB", topic, (body, delay), timeout)

    def publish_async(
        self, topic: str, body: bytes, *, timeout: float | None = None
    ) -> PublishFuture:
        """Queue a ``PUB``; the future resolves with nsqd's answer. Blocks while
        ``max_pending`` publishes are unanswered (back-pressure)."""
        # Checked here, in the caller's thread (cheaply: topics are remembered).
        if topic not in self._valid_topics or type(body) is not bytes or not body:
            check_publish(self._valid_topics, topic, body)
        return self._submit("PUB", topic, body, timeout, False)[0]

    def multi_publish_async(
        self, topic: str, bodies: Sequence[bytes], *, timeout: float | None = None
    ) -> PublishFuture:
        """Queue an ``MPUB``; see :meth:`publish_async`."""
        batch = check_batch(self._valid_topics, topic, bodies)
        return self._submit("MPUB", topic, batch, timeout, False)[0]

    def deferred_publish_async(
        self, topic: str, body: bytes, delay: float, *, timeout: float | None = None
    ) -> PublishFuture:
        """Queue a ``DPUB``; see :meth:`publish_async`."""
        check_deferred(self._valid_topics, topic, body, delay, self._config.max_req_timeout)
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
        closed = self._closing
        connections = tuple(connection_stats(node, closed) for node in list(self._nodes))
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
        """The configuration every connection of this producer identifies with."""
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
            raise TimeoutError(f"{kind} to {topic!r}: no answer within {seconds(limit)}") from None
        if request._error is not None:
            raise request._error

    def _submit(
        self, kind: str, topic: str, payload: Any, timeout: float | None, sync: bool
    ) -> tuple[Request, bool]:
        """A new request, sent (or handed to the IO thread); True when the caller (``sync``)
        is already registered as waiting for it (see :meth:`_dispatch_now`)."""
        if timeout is not None:
            check_seconds(f"{kind} timeout", timeout, zero=False)
            if timeout / 4 < self._expiry_tick:
                self._expiry_tick = max(timeout / 4, 0.01)
        if self._closed:
            raise LocalProtocolError("the producer is closed")
        if not self._started:
            self._start()
        failure = self._loop.failure
        if failure is not None:
            raise RuntimeError(f"the producer's IO thread crashed: {failure!r}") from failure
        limit = self._timeout if timeout is None else timeout
        now = time.monotonic()
        request = Request(self, kind, topic, payload, now, now + limit)
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
                        self._logger.exception("publish_observer failed", extra=fields(topic=topic))
                raise
            outcome = self._dispatch_now(request, sync, True)
        if outcome == _VIA_IO_THREAD:
            self._loop.call_soon(lambda: self._locked(self._dispatch, request))
        return request, outcome == _PARKED

    def _locked(self, fn: Callable[..., None], *args: Any) -> None:
        with self._io_lock:
            fn(*args)

    def _dispatch_now(self, request: Request, sync: bool, reserved: bool) -> int:
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
            if self._closing:
                self._fail_closed(request)
                return _SENT  # failed (the future says why)
            if self._waiting:
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
            if node.suspects:
                return _VIA_IO_THREAD  # sending one at a time (see _send_to)
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

    def _enter_direct(self, node: Node, wire: Wire) -> None:
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

    def _leave_direct(self, node: Node, wire: Wire) -> None:
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

    def _retire(self, wire: Wire) -> None:
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

    def _unuse(self, wire: Wire) -> None:
        wire.users -= 1
        if wire.retired and not wire.users and not wire.closed:
            wire.closed = True
            wire.sock.close()

    def _reserve(self, request: Request) -> None:
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
                        raise no_slot(self._max_pending, request.deadline - request.start)
                    # Short waits: a completion may race past a waiter registering.
                    space.wait(min(remaining, 0.05))
                self._submitted += 1
            finally:
                self._space_waiters -= 1

    def _complete(self, request: Request, error: BaseException | None) -> None:
        """Lock held: resolve ``request`` once and free its back-pressure slot."""
        if request._done:
            return
        self._completed += 1
        node = request.node
        request.node = None
        if request.bound is not None:
            self._unbind(request)
        if node is not None and node.held and not node.inflight:
            self._loop.call_soon(lambda: self._locked(self._serve_turn, node))
        request._set(error)
        if self._space_waiters:
            self._space.notify()  # its lock is _io_lock, held here
        observer = self.publish_observer
        if observer is not None:
            count = len(request.payload) if request.kind == "MPUB" else 1
            try:
                observer(request.topic, count, time.monotonic() - request.start, error)
            except Exception:
                self._logger.exception("publish_observer failed", extra=fields(topic=request.topic))

    # --- internals: IO thread -------------------------------------------------------------------

    def _connect_all(self) -> None:
        """The first attempts (a publish may have made one already: it is not made again)."""
        for node in self._nodes:
            if node.attempts == 0:
                self._connect(node)

    def _connect(self, node: Node) -> None:
        if self._closing or node.link is not None:
            return
        node.config_error = None
        node.attempts += 1
        node.conn = ClientConnection.from_config(self._config, peer=node.address)
        node.ready_by = time.monotonic() + self._config.connect_timeout
        node.connecting = True
        link = self._loop.connect(node, node.host, node.port, self._config.connect_timeout)
        node.connecting = False
        if node.conn is not None:  # not failed at once (name resolution, refused...)
            node.link = link

    def _ready_nodes(self) -> list[Node]:
        return [n for n in self._nodes if n.ready]

    def _dispatch(self, request: Request) -> None:
        if request._done:
            return
        if self._closing:
            self._fail_closed(request)
            return
        if request.attempts > self._nsqd_count:
            # Sent to every nsqd (and once more): each connection died before answering.
            self._fail_request(request, self._unreachable())
            return
        ready = self._ready_nodes()
        if ready:
            tried = request.tried
            if tried:
                ready = [n for n in ready if n.address not in tried] or ready
        else:
            # Nothing is up: try every nsqd not being connected now (whatever its reconnect
            # delay: a publish waits), and fail at once if none of them can be.
            self._waiting.append(request)
            now = time.monotonic()
            for node in self._nodes:
                # One that refused the configuration just now (the attempt of connect() or
                # of the block's start) is not asked again at once: the publish fails with it.
                if node.link is None and not (
                    node.config_error is not None
                    and now - node.refused_at < self._config.reconnect_delay
                ):
                    self._connect(node)
            self._fail_if_unreachable()
            return
        node = ready[next(self._rr) % len(ready)]
        if self._send_to(node, request):
            wire = node.wire
            if wire is not None and wire.direct and wire.leader is None:
                self._ensure_reader(node)  # its caller may be parked, not reading

    def _send_to(self, node: Node, request: Request) -> bool:
        """Queue ``request`` on ``node``'s connection; False when the core refused it.

        A node that lost a connection in a reset with publishes unanswered sends one at a
        time while a suspect of that reset is bound for it: nsqd closes the connection after
        refusing a publish, the commands pipelined behind it unread make that close a reset,
        and a reset may destroy answers nsqd had written. A publish sent alone is refused with
        nsqd's answer, or stored, whoever else is faulty. The others wait in ``node.held``."""
        if node.suspects or request.suspect:
            if request.suspect and request.bound is not node:
                self._bind(request, node)
            if node.inflight or node.held:
                node.held.append(request)
                self._watch_deadline(request)
                return True
            return self._send_now(node, request, True)
        return self._send_now(node, request, False)

    def _bind(self, request: Request, node: Node) -> None:
        """``request`` (a suspect) goes to ``node`` next: it sends alone until it is sent."""
        if request.bound is not None:
            self._unbind(request)
        request.bound = node
        node.suspects += 1

    def _unbind(self, request: Request) -> None:
        """``request``'s send alone was answered (or it ended): its node may pipeline again."""
        node = request.bound
        assert node is not None
        request.bound = None
        node.suspects -= 1
        if not node.suspects and node.held:
            self._loop.call_soon(lambda: self._locked(self._serve_turn, node))

    def _serve_turn(self, node: Node) -> None:
        """IO thread: nothing in flight on ``node`` (or it pipelines again): send what waits
        for its turn, one publish when it still sends alone, else all of them."""
        while node.held and node.ready and node.conn is not None and not self._closing:
            if node.suspects and node.inflight:
                return
            request = node.held.popleft()
            if request._done:
                continue
            if not self._send_now(node, request, bool(node.suspects)):
                continue
            wire = node.wire
            if wire is not None and wire.direct and wire.leader is None:
                self._ensure_reader(node)  # its caller is parked, not reading

    def _send_now(self, node: Node, request: Request, alone: bool) -> bool:
        conn = node.conn
        assert conn is not None and node.link is not None
        if request.tried is None:
            request.tried = {node.address}
        else:
            request.tried.add(node.address)
        request.attempts += 1
        try:
            if request.kind == "PUB":
                request_id = conn.publish(
                    request.topic,
                    request.payload,
                    self._coalesce and not request.alone and not alone,
                )
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
        self._watch_deadline(request)
        return True

    def _watch_deadline(self, request: Request) -> None:
        """The IO thread looks for publishes past their deadline from ``request``'s first
        tick on."""
        check = request.start + self._expiry_tick
        if self._expiry_check is None or check < self._expiry_check:
            self._expiry_check = check
            if not self._loop.in_loop_thread():
                # The IO thread sleeps until the deadline it last saw: this one is earlier.
                # (Once per tick at most: the check stays set while publishes are in flight.)
                self._loop.wake()

    def _fail_closed(self, request: Request, *, sent: bool = False) -> None:
        """``close()`` gave up on ``request``: ConnectionLost, never sent again (``sent``: it
        was written, so nsqd may have stored it)."""
        self._fail_request(
            request,
            closed_unanswered(request.kind, request.topic, sent=sent or request.attempts > 0),
        )

    def _fail_request(self, request: Request, error: BaseException) -> None:
        if not request._done:
            self._failed += 1
            self._complete(request, error)

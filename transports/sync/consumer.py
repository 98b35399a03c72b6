"""Blocking consumer: the core's :class:`~nsq_sansio.consumer.ConsumerCoordinator` on one IO thread.

::

    with Consumer("events", "archive", lookupd=["http://127.0.0.1:4161"], max_in_flight=200) as c:
        for msg in c:                      # ends when the consumer is drained or closed
            handle(msg.body)
            msg.finish()                   # or msg.requeue(delay=..., backoff=...), msg.touch()

    c.run(handler, threads=8)              # handler returns -> FIN, raises -> REQ
    batch = c.fetch(100, timeout=5.0)      # pull mode: Consumer(..., pull=True)
    c.drain(timeout=30)                    # graceful: see drain()

Threads: one IO thread (``nsq-sync-consumer``) owns every socket, reads, feeds the coordinator,
writes its output and sleeps until its next deadline; heartbeats are answered there, whatever user
code does. Messages reach user code through a queue that never holds more than
``max_in_flight`` (the broker cannot send more than RDY allows). ``finish``/``requeue``/``touch``
are handed back to the IO thread through a lock-free deque and a wake-up socket.

Leaving the ``with`` block (or :meth:`Consumer.close`) requeues every message not answered yet,
sends CLS, closes the sockets and joins every thread this consumer started.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from itertools import repeat
from operator import attrgetter, is_
from types import TracebackType
from typing import Any, TypeVar

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConnectionUp,
    ConsumerCoordinator,
    ConsumerFailed,
    Deliver,
    Disconnected,
    DrainComplete,
    FetchEnd,
    FetchResult,
    GiveUp,
    LookupdFailed,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
)
from nsq_sansio.discovery import LookupdAddress
from nsq_sansio.errors import ConfigError, LocalProtocolError, NSQError
from nsq_sansio.events import Message as CoreMessage
from transports._common import (
    ConnectionLogger,
    ConnectionStats,
    ConsumerStats,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.message import KeepaliveExpired, MessageBase

from ._loop import IOLoop, Link

__all__ = ["Consumer", "EventCallback", "KeepaliveExpired", "Message"]

_log = logging.getLogger("nsq_sansio.sync.consumer")

#: keepalive() warns this long (at most) before max_msg_timeout takes the message back.
KEEPALIVE_WARNING = 5.0

_T = TypeVar("_T")

_FIN = 0
_REQ = 1
_TOUCH = 2
_KEEPALIVE_ON = 3
_KEEPALIVE_OFF = 4


#: ``on_event`` receives the coordinator's reports (ConnectionUp, Disconnected, GiveUp,
#: TakenBack, LookupdFailed) and KeepaliveExpired, on the IO thread: it must not block.
EventCallback = Callable[[object], None]


class Message(MessageBase):
    """A message handed to user code, and the way to answer it.

    What it is (``id``, ``body``, ``timestamp``, ``attempts``, ``nsqd_address``...) is
    :class:`MessageBase`'s. Answer once with :meth:`finish` or :meth:`requeue` (they return
    True when this call answered it, False when it had been answered already); :meth:`touch`
    asks for more time and :meth:`keepalive` touches for you while a long job runs. Answers
    are thread-safe and never block: they are handed to the IO thread. An answer that comes
    too late (the connection closed, or nsqd timed the message out) sets :attr:`taken_back`
    and is reported as a
    ``TakenBack`` event, never raised.
    """

    __slots__ = ("_keepalive_warned", "taken_back")

    _consumer: Consumer

    def __init__(self, consumer: Consumer, delivery: Deliver) -> None:
        self._consumer = consumer
        self._delivery = delivery
        self.answered = False
        self._keepalive_warned = False
        #: Set when nsqd no longer holds this message for us (timed out, connection lost...):
        #: an answer sent now is useless, another consumer may get the message.
        self.taken_back = False

    def finish(self) -> bool:
        """``FIN``: the message was handled and is forgotten by nsqd."""
        if self.answered:
            return False
        self.answered = True
        consumer = self._consumer
        consumer._posted.append(self)  # a bare message is a FIN (the hot path: no tuple)
        loop = consumer._loop
        if not loop._wake_pending:
            loop.wake()
        return True

    def requeue(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """``REQ``: try again after ``delay`` seconds (default: grows with attempts).
        ``backoff=False`` keeps this failure from slowing the consumer down. A delay above
        nsqd's max_req_timeout is clamped to it. A bad ``delay`` (negative, inf, nan, not a
        number) raises LocalProtocolError here and leaves the message unanswered."""
        if delay is not None:
            check_seconds("requeue delay", delay)
        if self.answered:
            return False
        self.answered = True
        self._consumer._post(_REQ, self, (delay, backoff))
        return True

    def finish_nowait(self) -> bool:
        """Same as :meth:`finish` (which never blocks here); the async transport's name."""
        return self.finish()

    def requeue_nowait(self, delay: float | None = None, *, backoff: bool = True) -> bool:
        """Same as :meth:`requeue`; the async transport's name."""
        return self.requeue(delay, backoff=backoff)

    def touch(self) -> bool:
        """``TOUCH``: reset nsqd's timeout for this message (up to its max_msg_timeout).
        False when the message was answered already (nothing is sent)."""
        if self.answered:
            return False
        self._consumer._post(_TOUCH, self, None)
        return True

    @contextlib.contextmanager
    def keepalive(self) -> Iterator[Message]:
        """Keep the message alive while the block runs: TOUCH half-way to each deadline.

        nsqd never extends a message past its ``max_msg_timeout``; shortly before that, a
        warning is logged and :attr:`keepalive_expiring` turns True (nothing is touched
        automatically outside this block)."""
        self._consumer._post(_KEEPALIVE_ON, self, None)
        try:
            yield self
        finally:
            self._consumer._post(_KEEPALIVE_OFF, self, None)

    @property
    def keepalive_expiring(self) -> bool:
        """keepalive() reached the server's max_msg_timeout: the message will be taken back."""
        return self._keepalive_warned


_popleft = deque.popleft
_delivery_of = attrgetter("_delivery")


class _HTTPKey:
    """Loop key of a lookupd request's socket."""

    __slots__ = ("data", "lookupd", "request_id")

    def __init__(self, request_id: int, lookupd: LookupdAddress, data: bytes) -> None:
        self.request_id = request_id
        self.lookupd = lookupd
        self.data = data


class _Keepalive:
    __slots__ = ("active", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.active = True


class Consumer:
    """A blocking NSQ consumer for one topic/channel. See the module docstring.

    ``nsqd``: nsqd TCP addresses to connect to directly (retried with backoff); ``lookupd``:
    nsqlookupd HTTP URLs to poll for the topic's producers. Keyword arguments are
    :class:`~nsq_sansio.config.Config` fields (``max_in_flight``, ``max_attempts``, ``tls_v1``,
    ``snappy``, ``deflate``, ``auth_secret``, ``heartbeat_interval``, ``msg_timeout``...) or
    TLS options (``tls=TLSOptions(...)`` or ``tls_ca_file``,
    ``tls_cert_file``, ``tls_key_file``, ``tls_server_name``, ``tls_verify``).
    ``pull=True`` selects pull mode (:meth:`fetch`). ``on_give_up`` is called (on the IO thread:
    keep it short) with each message that exceeded ``max_attempts``; it was FIN'd already.
    ``on_event`` receives every report (see :data:`EventCallback`).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd: str | Sequence[str] = (),
        lookupd: str | Sequence[str] = (),
        config: Config | None = None,
        pull: bool = False,
        on_give_up: Callable[[CoreMessage], None] | None = None,
        on_event: EventCallback | None = None,
        rng: random.Random | None = None,
        **options: Any,
    ) -> None:
        self._config, self._options = split_options(config, options)
        nsqd_list = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        lookupd_list = [lookupd] if isinstance(lookupd, str) else list(lookupd)
        self._coordinator = ConsumerCoordinator(
            topic,
            channel,
            self._config,
            rng=rng or random.Random(),
            nsqd=nsqd_list,
            lookupd=lookupd_list,
            pull=pull,
        )
        self.topic = self._coordinator.topic
        self.channel = self._coordinator.channel
        self._pull = pull
        self._on_give_up = on_give_up
        self._on_event = on_event
        self._ssl_context = self._options.ssl_context() if self._config.tls_v1 else None
        self._loop = IOLoop(self, name=f"nsq-sync-consumer-{self.topic}/{self.channel}")
        self._links: dict[int, Link] = {}  # by conn_id
        self._http: dict[int, Link] = {}  # lookupd requests, by request_id
        self._loggers: dict[int, ConnectionLogger] = {}
        # Deliveries waiting for user code, and the condition user threads sleep on.
        self._ready: deque[Message] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._sleepers = 0
        # Answers from user code, taken by the IO thread: a Message is its FIN, anything
        # else an (op, message, argument) tuple.
        self._posted: deque[Message | tuple[int, Message, Any]] = deque()
        # Messages handed to user code and not answered yet (IO thread only).
        self._unanswered: set[Message] = set()
        self._keepalives: list[tuple[float, int, _Keepalive]] = []
        self._keepalive_of: dict[Message, _Keepalive] = {}
        self._seq = itertools.count()
        self._fetches: dict[int, Future[list[Message]]] = {}
        self._started = False
        self._closed = False
        self._draining = False
        self._drained = threading.Event()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(("connects", "disconnects", "connection_errors"), 0)
        #: The error the consumer failed with (ConsumerFailed: nsqd refused the
        #: configuration); raised by iteration, get(), run(), fetch(), and at exit if unseen.
        self._failure: NSQError | None = None
        self._failure_raised = False

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Consumer:
        """Start the IO thread: connect to nsqd / ask lookupd (called by ``with``)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("Consumer is closed")
            if self._started:
                return self
            self._started = True
        self._loop.start()
        self._loop.call_soon(lambda: self._coordinator.start(time.monotonic()))
        return self

    def __enter__(self) -> Consumer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        if exc_type is None and self._failure is not None and not self._failure_raised:
            self._raise_failure()  # the block never waited for a message: say it now

    def _raise_failure(self) -> None:
        assert self._failure is not None
        self._failure_raised = True
        raise self._failure

    def start_drain(self, timeout: float | None = None) -> None:
        """Begin a graceful drain and return at once (safe in a signal handler).

        RDY 0 everywhere, messages not yet handed to user code are requeued, messages in user
        code get up to ``timeout`` (default ``config.drain_timeout``) to be answered, then CLS.
        A bad ``timeout`` raises LocalProtocolError here and changes nothing.
        """
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        self._start_drain(timeout)

    def _start_drain(self, timeout: float | None) -> Future[None] | None:
        """Begin the drain; the future (None when nothing was started) reports the IO
        thread's part of it."""
        if self._draining or not self._started:
            if not self._started:
                self._draining = True
                self._drained.set()
                self._wake_users()
            return None
        self._draining = True
        return self._call(lambda: self._begin_drain(timeout))

    def drain(self, timeout: float | None = None) -> bool:
        """Graceful shutdown; blocks until it is over. True when it completed in time.
        A bad ``timeout`` raises LocalProtocolError here and changes nothing."""
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        limit = self._config.drain_timeout if timeout is None else timeout
        begun = self._start_drain(limit)
        if begun is not None and not self._loop.in_loop_thread():
            with contextlib.suppress(TimeoutError):
                begun.result(limit + 10.0)  # the IO thread's error, if any, is raised here
        done = self._drained.wait(limit + 10.0)
        self._shutdown()
        return done

    @property
    def draining(self) -> bool:
        return self._draining

    def close(self, timeout: float = 5.0) -> None:
        """Requeue every unanswered message now, CLS, close sockets, join threads."""
        check_seconds("close timeout", timeout)
        if self._closed:
            return
        if self._started and not self._drained.is_set():
            # A drain already under way keeps its deadline; otherwise requeue everything now.
            self.start_drain(0.0)
            self._drained.wait(timeout)
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._draining = True
        self._drained.set()
        self._wake_users()
        self._loop.stop()
        current = threading.current_thread()
        for worker in self._workers:
            if worker is not current:
                worker.join(5.0)
        for future in list(self._fetches.values()):
            if not future.done():
                future.set_result([])

    # --- consuming ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        if self._pull:
            raise RuntimeError("a pull-mode consumer is read with fetch(), not iterated")
        if not self._started:
            self.start()
        popleft = self._ready.popleft
        next_message = self._next_message
        while True:
            try:
                yield popleft()
                continue
            except IndexError:
                pass
            message = next_message(None)
            if message is None:
                if self._failure is not None:
                    self._raise_failure()
                return
            yield message

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: no limit, 0: only one
        already received) or once drained/closed."""
        if timeout is not None:
            check_seconds("get timeout", timeout)
        if self._pull:
            raise RuntimeError("a pull-mode consumer is read with fetch(), not get()")
        if not self._started:
            self.start()
        message = self._next_message(timeout)
        if message is None and self._failure is not None:
            self._raise_failure()
        return message

    def _next_message(self, timeout: float | None) -> Message | None:
        ready = self._ready
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return ready.popleft()
            except IndexError:
                pass
            if self._drained.is_set():
                return None
            failure = self._loop.failure
            if failure is not None:
                raise RuntimeError(f"the consumer's IO thread crashed: {failure!r}") from failure
            with self._cond:
                if ready or self._drained.is_set():
                    continue
                wait = 1.0
                if deadline is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        return None
                    wait = min(wait, 1.0)
                self._sleepers += 1
                try:
                    self._cond.wait(wait)
                finally:
                    self._sleepers -= 1

    def run(
        self,
        handler: Callable[[Message], object],
        threads: int = 1,
        *,
        concurrency: int | None = None,
    ) -> None:
        """Call ``handler(msg)`` for every message on ``threads`` worker threads until the
        consumer is drained or closed (``concurrency`` is an alias, the async transport's
        name). A handler that returns FINs the message (unless it answered itself); one that
        raises REQs it (with backoff). Ctrl-C starts a drain. At most ``max_in_flight``
        handlers run at once whatever ``threads`` is (no more messages exist)."""
        if concurrency is not None:
            threads = concurrency
        if self._pull:
            raise RuntimeError("run() needs a push-mode consumer (pull=False)")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ConfigError(f"run() threads must be an int >= 1, got {threads!r}")
        if not callable(handler):
            raise ConfigError(f"run() handler must be callable, got {handler!r}")
        self.start()

        def work() -> None:
            while True:
                message = self._next_message(None)
                if message is None:
                    return
                try:
                    handler(message)
                except Exception:
                    _log.exception("handler failed for %r; requeueing it", message)
                    if not message.answered:
                        message.requeue()
                else:
                    if not message.answered:
                        message.finish()

        workers = [
            threading.Thread(target=work, name=f"nsq-sync-worker-{i}", daemon=True)
            for i in range(threads)
        ]
        self._workers.extend(workers)
        for worker in workers:
            worker.start()
        try:
            for worker in workers:
                while worker.is_alive():
                    worker.join(0.5)
        except KeyboardInterrupt:
            self.start_drain()
            for worker in workers:
                worker.join()
            raise
        if self._failure is not None:
            self._raise_failure()

    def fetch(
        self, batch: int, timeout: float | None = 5.0, *, no_wait: bool = False
    ) -> list[Message]:
        """Pull mode: up to ``batch`` messages, waiting at most ``timeout`` seconds for them
        (``no_wait``: only what is already buffered). RDY follows outstanding fetches, so the
        broker never sends more than was asked. Answer each message (FIN after commit)."""
        if not self._pull:
            raise RuntimeError("fetch() needs Consumer(..., pull=True)")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if timeout is not None:
            check_seconds("fetch timeout", timeout, zero=False)
        self.start()
        if self._failure is not None:
            self._raise_failure()
        if self._closed or self._draining:
            return []
        future: Future[list[Message]] = Future()

        def ask() -> None:
            now = time.monotonic()
            if self._posted:  # answers given before this fetch go first (RDY counts them)
                self._take_answers(now)
            try:
                request_id = self._coordinator.fetch(batch, now, expires=timeout, no_wait=no_wait)
            except Exception as exc:
                future.set_exception(exc)
                return
            self._fetches[request_id] = future

        self._loop.call_soon(ask)
        wait = None if timeout is None else timeout + 5.0
        try:
            messages = future.result(wait)
        except TimeoutError:
            return []
        if not messages and self._failure is not None:
            self._raise_failure()
        return messages

    # --- introspection ------------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The configuration in force (max_in_flight follows :meth:`set_max_in_flight`)."""
        return self._coordinator.config

    def is_starved(self) -> bool:
        """The client guide's is_starved (a hint to process a batch)."""
        return self._coordinator.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time (0 pauses the flow); RDY is redistributed on the
        IO thread before this returns (when it runs). A bad value raises ConfigError here and
        changes nothing."""
        self._coordinator.config.replace(max_in_flight=max_in_flight)  # validates, or raises
        if self._loop.in_loop_thread():
            self._coordinator.set_max_in_flight(max_in_flight, time.monotonic())
            return
        done = self._call(
            lambda: self._coordinator.set_max_in_flight(max_in_flight, time.monotonic())
        )
        if self._started and not self._closed and self._loop.failure is None:
            with contextlib.suppress(TimeoutError):
                done.result(5.0)

    def stats(self) -> ConsumerStats:
        """A snapshot (plain frozen dataclass), taken on the IO thread when it runs. Safe to
        call from any thread (a metrics scrape): when the IO thread does not answer within 5
        seconds it is read from here, from copies taken in one step each, so it never raises."""
        if self._started and not self._closed and not self._loop.in_loop_thread():
            future = self._call(self._snapshot)
            with contextlib.suppress(TimeoutError):
                return future.result(5.0)
        return self._snapshot()

    def _snapshot(self) -> ConsumerStats:
        if self._loop.in_loop_thread() and self._posted:
            self._take_answers(time.monotonic())
        coordinator = self._coordinator
        connections = []
        for conn_id in coordinator.connection_ids():
            info = coordinator.link_info(conn_id)
            link = self._links.get(conn_id)
            if info is None:
                continue
            phase, rdy, in_flight = info
            address = link.address if link is not None else f"conn-{conn_id}"
            connections.append(
                ConnectionStats(
                    address=address,
                    state=phase.name,
                    connected=phase.name == "SUBSCRIBED",
                    rdy=rdy,
                    in_flight=in_flight,
                    bytes_received=link.bytes_in if link is not None else 0,
                    bytes_sent=link.bytes_out if link is not None else 0,
                )
            )
        stats = coordinator.stats
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            received=stats["received"],
            finished=stats["finished"],
            requeued=stats["requeued"],
            given_up=stats["given_up"],
            taken_back=stats["taken_back"],
            in_flight=coordinator.in_flight_count(),
            rdy=coordinator.total_rdy,
            max_in_flight=coordinator.max_in_flight,
            backoff_level=coordinator.backoff_level,
            backoff_phase=coordinator.backoff_phase.value,
            reconnects=max(self._counters["connects"] - len(connections), 0),
            connection_errors=self._counters["connection_errors"],
            connections=tuple(connections),
        )

    # --- user thread -> IO thread -------------------------------------------------------------

    def _call(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run ``fn()`` on the IO thread; its result or exception goes to the future (an
        exception is also logged): an action asked by user code never kills the IO thread."""
        future: Future[_T] = Future()

        def run() -> None:
            try:
                result = fn()
            except Exception as exc:
                _log.exception("consumer action %r failed on the IO thread", fn)
                future.set_exception(exc)
            else:
                future.set_result(result)

        self._loop.call_soon(run)
        return future

    def _post(self, op: int, message: Message, arg: Any) -> None:
        self._posted.append((op, message, arg))
        self._loop.wake()

    def _wake_users(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # --- IO thread: LoopOwner -----------------------------------------------------------------

    def on_connected(self, link: Link, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            self._coordinator.connection_made(key, now)
        elif isinstance(key, _HTTPKey):
            if key.lookupd.tls:
                context = self._ssl_context or self._options.ssl_context()
                hostname = self._options.tls.server_hostname(key.lookupd.host)
                self._loop.start_tls(link, context, hostname, b"")
            self._loop.write(link, key.data)

    def on_data(self, link: Link, data: bytes, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            if self._posted:
                # FINs user code gave since the last write go out before this read is
                # decoded: nsqd holds at most max_in_flight un-FIN'd messages, so every FIN
                # sent sooner is a message it can send sooner.
                self.write_pending()
            self._coordinator.receive_data(key, data, now)
        elif isinstance(key, _HTTPKey):
            self._coordinator.http_data(key.request_id, data, now)
        self._pump(now)

    def on_link_error(self, link: Link, error: BaseException, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            self._counters["connection_errors"] += 1
            self._coordinator.connection_failed(key, error, now)
        elif isinstance(key, _HTTPKey):
            self._http.pop(key.request_id, None)
            self._coordinator.http_failed(key.request_id, error, now)
        self._pump(now)

    def on_tls_established(self, link: Link, now: float) -> None:
        if isinstance(link.key, int):
            self._coordinator.tls_established(link.key, now)

    def next_deadline(self) -> float | None:
        deadline = self._coordinator.next_deadline()
        if self._keepalives:
            first = self._keepalives[0][0]
            deadline = first if deadline is None else min(deadline, first)
        return deadline

    def handle_timer(self, now: float) -> None:
        coordinator = self._coordinator
        deadline = coordinator.next_deadline()
        if deadline is not None and now >= deadline:
            coordinator.handle_timer(now)
        heap = self._keepalives
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if entry.active:
                self._keepalive_tick(entry, now)
        self._pump(now)

    def write_pending(self) -> None:
        posted = self._posted
        if posted:
            self._take_answers(time.monotonic())
        self._pump(None)
        links = self._links
        loop = self._loop
        for conn_id, data in self._coordinator.pending_data():
            link = links.get(conn_id)
            if link is not None:
                loop.write(link, data)

    # --- IO thread: internals -----------------------------------------------------------------

    def _take_answers(self, now: float) -> None:
        """Carry out the answers user code posted, in order; runs of FINs in one
        :meth:`ConsumerCoordinator.finish_many` call."""
        posted = self._posted
        while posted:
            # Only this thread pops, so len() items are there: taken without a Python loop.
            items = list(map(_popleft, repeat(posted, len(posted))))
            if all(map(is_, map(type, items), repeat(Message))):  # FINs only: the hot path
                self._finish_batch(items, now)  # type: ignore[arg-type]
                continue
            run: list[Message] = []
            for item in items:
                if type(item) is Message:
                    run.append(item)
                    continue
                if run:
                    self._finish_batch(run, now)
                    run = []
                op, message, arg = item  # type: ignore[misc]
                try:
                    self._answer(op, message, arg, now)
                except Exception:  # never fatal to the IO thread; the next answers still go
                    self._answer_failed(op, message)
            if run:
                self._finish_batch(run, now)

    def _finish_batch(self, messages: list[Message], now: float) -> None:
        """FIN ``messages`` (answered by user code, in that order) in one coordinator call;
        those no longer ours are marked taken back (the coordinator reported them)."""
        refused: list[Deliver] = []
        try:
            self._coordinator.finish_many(list(map(_delivery_of, messages)), now, refused=refused)
        except Exception:  # a bug: never fatal to the IO thread (see _answer_failed)
            _log.exception("FIN of %d messages failed on the IO thread", len(messages))
            deadline = self._coordinator.deadline
            for message in messages:
                if deadline(message._delivery) is not None:  # still ours: may be answered again
                    message.answered = False
                else:
                    self._unanswered.discard(message)
            return
        self._unanswered.difference_update(messages)
        if refused:
            late = set(map(id, refused))
            for message in messages:
                if id(message._delivery) in late:
                    message.taken_back = True
        if self._keepalive_of:
            for message in messages:
                self._stop_keepalive(message)

    def _answer(self, op: int, message: Message, arg: Any, now: float) -> None:
        """One answer other than FIN (REQ, TOUCH, keepalive on/off)."""
        coordinator = self._coordinator
        delivery = message._delivery
        if op == _REQ:
            self._unanswered.discard(message)
            delay, backoff = arg
            if not coordinator.requeue(delivery, now, delay, backoff=backoff):
                message.taken_back = True
            self._stop_keepalive(message)
        elif op == _TOUCH:
            if coordinator.touch(delivery, now) is None:
                message.taken_back = True
        elif op == _KEEPALIVE_ON:
            if message not in self._keepalive_of and not message.answered:
                entry = _Keepalive(message)
                self._keepalive_of[message] = entry
                self._keepalive_tick(entry, now)
        elif op == _KEEPALIVE_OFF:
            self._stop_keepalive(message)

    def _answer_failed(self, op: int, message: Message | None) -> None:
        """An answer from user code raised on the IO thread (arguments are checked in the
        caller, so this is a bug): log it; a message still ours can be answered again."""
        _log.exception("answer %d for %r failed on the IO thread", op, message)
        if message is None or op not in (_FIN, _REQ):
            return
        if self._coordinator.deadline(message._delivery) is not None:
            message.answered = False
            self._unanswered.add(message)

    def _stop_keepalive(self, message: Message) -> None:
        entry = self._keepalive_of.pop(message, None)
        if entry is not None:
            entry.active = False

    def _keepalive_tick(self, entry: _Keepalive, now: float) -> None:
        """TOUCH when the core says (:meth:`ConsumerCoordinator.next_touch`, half-way to the
        deadline) and plan the next tick; warn shortly before max_msg_timeout."""
        message = entry.message
        delivery = message._delivery
        coordinator = self._coordinator
        limit = coordinator.max_deadline(delivery)
        if limit is None:
            message.taken_back = True
            self._stop_keepalive(message)
            return
        touch_at = coordinator.next_touch(delivery)
        if touch_at is not None and now >= touch_at:
            if coordinator.touch(delivery, now) is None:
                message.taken_back = True
                self._stop_keepalive(message)
                return
            touch_at = coordinator.next_touch(delivery)
        if touch_at is not None:
            heapq.heappush(self._keepalives, (touch_at, next(self._seq), entry))
            return
        # TOUCH cannot extend it any more: say so shortly before nsqd takes it back.
        msg_timeout = delivery.deadline - delivery.received_at
        warn_at = max(limit - min(KEEPALIVE_WARNING, msg_timeout * 0.25), now)
        if now < warn_at:
            heapq.heappush(self._keepalives, (warn_at, next(self._seq), entry))
            return
        if not message._keepalive_warned:
            message._keepalive_warned = True
            self._emit(KeepaliveExpired(delivery.id, delivery.address, limit))
            self._logger(delivery.conn_id, str(delivery.address)).warning(
                "keepalive: message %s reaches nsqd's max_msg_timeout in %.1fs; nsqd "
                "will take it back and redeliver it (TOUCH cannot extend it further)",
                delivery.id.decode(errors="replace"),
                max(limit - now, 0.0),
            )
        self._stop_keepalive(message)

    def _begin_drain(self, timeout: float | None) -> None:
        now = time.monotonic()
        if self._posted:  # answers given before the drain was asked go first
            self._take_answers(now)
        # Messages still queued for user code were never seen: drain requeues them at once.
        # Those user code took (popped concurrently included) get until the deadline.
        popped: list[Message] = []
        ready = self._ready
        while ready:
            try:
                message = ready.popleft()
            except IndexError:
                break
            self._unanswered.discard(message)
            popped.append(message)
        try:
            self._coordinator.drain(now, timeout, unseen=[m._delivery for m in popped])
        except Exception:  # refused (the caller checked the timeout): nothing was drained
            self._unanswered.update(popped)
            with self._cond:
                ready.extendleft(reversed(popped))
            self._draining = False
            raise
        self._pump(now)

    def _logger(self, conn_id: int, address: str) -> ConnectionLogger:
        logger = self._loggers.get(conn_id)
        if logger is None:
            logger = self._loggers[conn_id] = ConnectionLogger(_log, address)
        return logger

    def _pump(self, now: float | None) -> None:
        """Carry out everything the coordinator decided."""
        actions = self._coordinator.take_actions()
        if not actions:
            return
        delivered: list[Message]
        if all(map(is_, map(type, actions), repeat(Deliver))):  # a read of messages only
            delivered = list(map(Message, repeat(self), actions))  # type: ignore[arg-type]
        else:
            delivered = []
            for action in actions:
                if type(action) is Deliver:
                    delivered.append(Message(self, action))
                else:
                    self._act(action, delivered)
        if delivered:
            self._unanswered.update(delivered)
            # Under the lock a user thread checks the queue with before it sleeps: no lost
            # wake-up (one lock per batch read from the socket, not per message).
            with self._cond:
                self._ready.extend(delivered)
                if self._sleepers:
                    self._cond.notify(len(delivered))

    def _emit(self, event: object) -> None:
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                _log.exception("on_event callback failed for %r", event)

    def _act(self, action: object, delivered: list[Message]) -> None:
        if self._on_event is not None and not isinstance(
            action,
            (Connect, StartTLS, CloseConnection, SendHTTPRequest, CloseHTTPRequest, FetchResult),
        ):
            self._emit(action)
        loop = self._loop
        if isinstance(action, Connect):
            self._counters["connects"] += 1
            new_link = loop.connect(
                action.conn_id,
                action.address.host,
                action.address.port,
                self._config.connect_timeout,
            )
            if not new_link.closed:
                self._links[action.conn_id] = new_link
        elif isinstance(action, StartTLS):
            link = self._links.get(action.conn_id)
            if link is not None:
                context = self._ssl_context or self._options.ssl_context()
                loop.start_tls(
                    link,
                    context,
                    self._options.tls.server_hostname(link.host),
                    action.trailing_data,
                )
        elif isinstance(action, CloseConnection):
            link = self._links.pop(action.conn_id, None)
            self._loggers.pop(action.conn_id, None)
            if link is not None:
                if action.final_data:
                    loop.write(link, action.final_data)
                loop.close_link_when_flushed(link)
        elif isinstance(action, SendHTTPRequest):
            key = _HTTPKey(action.request_id, action.lookupd, action.data)
            started = loop.connect(
                key, action.lookupd.host, action.lookupd.port, self._config.connect_timeout
            )
            if not started.closed:
                self._http[action.request_id] = started
        elif isinstance(action, CloseHTTPRequest):
            http_link = self._http.pop(action.request_id, None)
            if http_link is not None:
                loop.close_link(http_link)
        elif isinstance(action, FetchResult):
            if action.reason is FetchEnd.FAILED and self._failure is None:
                self._failure = self._coordinator.failure  # before the caller wakes up
            future = self._fetches.pop(action.request_id, None)
            messages = list(map(Message, repeat(self), action.messages))
            self._unanswered.update(messages)
            if future is not None and not future.done():
                future.set_result(messages)
            else:  # nobody waits any more (timed out): give them back
                for message in messages:
                    self._unanswered.discard(message)
                    self._coordinator.requeue(
                        message._delivery, time.monotonic(), 0.0, backoff=False
                    )
            if action.reason is FetchEnd.TOO_MANY_WAITING:
                _log.warning("fetch refused: max_waiting_fetches requests already wait")
        elif isinstance(action, GiveUp):
            self._logger(action.conn_id, str(action.address)).warning(
                "giving up on message %s after %d attempts (max_attempts=%d); it was FIN'd",
                action.message.id.decode(errors="replace"),
                action.message.attempts,
                self._config.max_attempts,
            )
            if self._on_give_up is not None:
                try:
                    self._on_give_up(action.message)
                except Exception:
                    _log.exception("on_give_up callback failed")
        elif isinstance(action, TakenBack):
            self._logger(action.conn_id, str(action.address)).info(
                "%s for message %s came too late: %s",
                action.command,
                (action.message_id or b"?").decode(errors="replace"),
                action.error,
            )
            # Only the copy the report is about: nsqd may have sent the same id again, and
            # the newer copy is still ours (issue 12.3). A late answer's own handle was marked
            # when the answer was refused; a FIN/REQ nsqd refused names no handle still held.
            delivery = action.delivery
            if delivery is not None:
                for message in self._unanswered:
                    if message._delivery is delivery:
                        message.taken_back = True
                        break
        elif isinstance(action, ConnectionUp):
            self._logger(action.conn_id, str(action.address)).info(
                "subscribed to %s/%s (nsqd %s, msg_timeout %ss, max_rdy %d)",
                self.topic,
                self.channel,
                action.settings.version or "?",
                action.settings.msg_timeout / 1000,
                action.settings.max_rdy_count,
            )
        elif isinstance(action, Disconnected):
            self._counters["disconnects"] += 1
            link = self._links.pop(action.conn_id, None)
            if link is not None:
                loop.close_link(link)
            logger = self._logger(action.conn_id, str(action.address))
            self._loggers.pop(action.conn_id, None)
            gone = action.unanswered
            if gone:
                for message in list(self._unanswered):
                    if message._delivery.conn_id == action.conn_id:
                        message.taken_back = True
                        self._unanswered.discard(message)
            retry = (
                f"; reconnecting in {action.reconnect_at - time.monotonic():.1f}s"
                if action.reconnect_at is not None
                else ""
            )
            if action.error is not None:
                logger.warning(
                    "disconnected: %s (%d messages left unanswered%s)",
                    action.error,
                    len(gone),
                    retry,
                )
            else:
                logger.info("closed")
        elif isinstance(action, LookupdFailed):
            ConnectionLogger(_log, str(action.lookupd)).warning(
                "lookupd query failed: %s", action.error
            )
        elif isinstance(action, ConsumerFailed):
            # Terminal: every connection is closed; whoever waits for messages raises it.
            self._failure = action.error
            _log.error(
                "consumer %s/%s failed, not retrying: %s", self.topic, self.channel, action.error
            )
            self._draining = True
            self._drained.set()
            for future in self._fetches.values():
                if not future.done():
                    future.set_result([])
            self._fetches.clear()
            self._wake_users()
        elif isinstance(action, DrainComplete):
            self._draining = True
            self._drained.set()
            for future in self._fetches.values():
                if not future.done():
                    future.set_result([])
            self._fetches.clear()
            self._wake_users()

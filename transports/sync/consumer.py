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
code does. User code never holds more than ``max_in_flight`` messages: the coordinator gives a
connection RDY only from the budget not already in flight on the others (a joining nsqd
included), and nsqd sends no more than RDY allows. ``finish``/``requeue``/``touch`` are handed
back to the IO thread through a lock-free deque and a wake-up socket.

Leaving the ``with`` block (or :meth:`Consumer.close`) requeues every message not answered yet,
sends CLS, closes the sockets and joins every thread this consumer started.

This module is the user-facing side (what user threads call); what the IO thread does is in
``_consumer_io.py`` (:class:`~transports.sync._consumer_io.ConsumerIOThread`, a base class of
:class:`Consumer`), and the :class:`Message` user code answers is in ``message.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    ConsumerCoordinator,
)
from nsq_sansio.errors import ConfigError, LocalProtocolError, NSQError
from nsq_sansio.events import Message as CoreMessage
from transports._common import (
    ConnectionLogger,
    ConnectionStats,
    ConsumerStats,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.message import KeepaliveExpired, unanswered_of

from ._consumer_io import ConsumerIOThread, Keepalive
from ._loop import IOLoop, Link
from .message import Message

__all__ = ["Consumer", "EventCallback", "KeepaliveExpired", "Message"]

_log = logging.getLogger("nsq_sansio.sync.consumer")

_T = TypeVar("_T")


#: ``on_event`` receives the coordinator's reports (ConnectionUp, Disconnected, GiveUp,
#: TakenBack, LookupdFailed) and KeepaliveExpired, on the IO thread: it must not block.
EventCallback = Callable[[object], None]


class Consumer(ConsumerIOThread):
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
        self._keepalives: list[tuple[float, int, Keepalive]] = []
        self._keepalive_of: dict[Message, Keepalive] = {}
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

    # --- answering many ------------------------------------------------------------------------

    def finish_many(self, messages: Iterable[Message]) -> int:
        """FIN every message of ``messages`` not answered yet, in order: the same as calling
        ``finish()`` on each (answered ones are skipped, one given twice is FIN'd once, one
        that came too late gets :attr:`Message.taken_back` and a ``TakenBack`` report), but
        handed to the IO thread in one post and one wake-up, whatever the number of messages
        and connections. Returns how many this call answered (those ``finish()`` would have
        returned True for). Never blocks. Every message must come from this consumer: else
        LocalProtocolError (TypeError for something that is not a message) and nothing is
        answered."""
        fresh = unanswered_of(self, Message, messages)
        if not fresh:
            return 0
        for message in fresh:
            message.answered = True
        self._posted.extend(fresh)  # bare messages are FINs (see message.py)
        loop = self._loop
        if not loop._wake_pending:
            loop.wake()
        return len(fresh)

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

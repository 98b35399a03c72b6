"""Blocking consumer: the core's :class:`~nsq_sansio.consumer.ConsumerCoordinator` on one IO thread.

::

    with Consumer("events", "archive", lookupd=["http://127.0.0.1:4161"], max_in_flight=200) as c:
        for msg in c:                      # ends when a drain starts, or the consumer closes
            handle(msg.body)
            msg.finish()                   # or msg.requeue(delay=..., backoff=...), msg.touch()

    c.run(handler, concurrency=8)          # returns None/True -> FIN, False or raises -> REQ
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

This module is the user-facing side (what user threads call); the IO thread's side is a
:class:`~transports.sync._consumer_io.ConsumerIO` the consumer owns (``_consumer_io.py``), and
the :class:`Message` user code answers is in ``message.py``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.consumer import ConsumerCoordinator
from nsq_sansio.discovery import NSQDFilter
from nsq_sansio.errors import ConfigError, LocalProtocolError
from transports._common import ConsumerStats, DrainResult, split_options
from transports._common.arguments import check_seconds
from transports._common.dead_letter import DeadLetterRoute, dead_letter_settings
from transports._common.handlers import DRAIN_IN_HANDLER, handler_finishes
from transports._common.message import KeepaliveExpired
from transports._common.reports import (
    EventCallback,
    log_handler_failed,
    log_handlers_left_running,
    log_paused,
)

from ._consumer_io import ConsumerIO
from ._dead_letter import DeadLetterPublisher
from .message import Message

__all__ = ["Consumer", "DrainResult", "EventCallback", "KeepaliveExpired", "Message"]

_log = logging.getLogger("nsq_sansio.sync.consumer")

#: How many threads ``run()`` starts by default, at most (ThreadPoolExecutor's cap).
MAX_DEFAULT_THREADS = 32

#: What to do instead of waiting for a message on the IO thread.
_ELSEWHERE_OR_GET_NOW = (
    "take messages in another thread; get(timeout=0) takes one already received without waiting"
)


class Consumer:
    """A blocking NSQ consumer for one topic/channel. See the module docstring.

    ``nsqd``: nsqd TCP addresses to connect to directly (retried with backoff); ``lookupd``:
    nsqlookupd HTTP URLs to poll for the topic's producers. Keyword arguments are
    :class:`~nsq_sansio.config.Config` fields (``max_in_flight``, ``max_attempts``, ``tls_v1``,
    ``snappy``, ``deflate``, ``auth_secret``, ``heartbeat_interval``, ``msg_timeout``...) or
    transport options (``connect_timeout``, ``tls=TLSOptions(...)`` or ``tls_ca_file``,
    ``tls_cert_file``, ``tls_key_file``, ``tls_server_name``, ``tls_verify``).
    ``pull=True`` selects pull mode (:meth:`fetch`). ``nsqd_filter`` decides which nsqd a
    lookupd lists are connected to (:func:`~nsq_sansio.discovery.allow_nsqd`, or any
    ``NSQDAddress -> bool``; refused ones are reported once as ``NodeRefused``).
    ``on_event`` receives every report (see
    :data:`EventCallback`); ``logger`` replaces ``nsq_sansio.sync.consumer``;
    ``close_timeout`` bounds how long leaving the ``with`` block waits for the quick drain.
    ``dead_letter_topic`` (a topic, or ``message -> topic or None``) publishes a message
    given up after ``max_attempts`` there before it is FIN'd (requeued if that fails), as its
    body or, with ``dead_letter_format="envelope"``, a JSON envelope; ``dead_letter_nsqd``
    says which nsqd (default: the consumer's). See docs/dead-letters.md.
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        *,
        nsqd: str | Iterable[str] = (),
        lookupd: str | Iterable[str] = (),
        config: Config | None = None,
        pull: bool = False,
        on_event: EventCallback | None = None,
        logger: logging.Logger | None = None,
        rng: random.Random | None = None,
        close_timeout: float = 10.0,
        nsqd_filter: NSQDFilter | None = None,
        dead_letter_topic: str | DeadLetterRoute | None = None,
        dead_letter_format: str = "body",
        dead_letter_nsqd: str | Iterable[str] | None = None,
        **options: Any,
    ) -> None:
        check_seconds("close_timeout", close_timeout, error=ConfigError)
        dead_letters = dead_letter_settings(dead_letter_topic, dead_letter_format, dead_letter_nsqd)
        config, transport_options = split_options(config, options)
        nsqd_list = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        lookupd_list = [lookupd] if isinstance(lookupd, str) else list(lookupd)
        coordinator = ConsumerCoordinator(
            topic,
            channel,
            config,
            rng=rng or random.Random(),
            nsqd=nsqd_list,
            lookupd=lookupd_list,
            pull=pull,
            nsqd_filter=nsqd_filter,
            dead_letter=dead_letters is not None,
        )
        self.topic = coordinator.topic
        self.channel = coordinator.channel
        self._io = io = ConsumerIO(
            coordinator, config, transport_options, logger=logger or _log, on_event=on_event
        )
        if dead_letters is not None:
            io.dead_letters = DeadLetterPublisher(
                dead_letters,
                coordinator,
                nsqd=nsqd_list,
                options=transport_options,
                logger=io.logger,
                call_soon=io.loop.call_soon,
                connected=lambda: [link.address for link in io.links.values()],
            )
        self._pull = pull
        self._close_timeout = close_timeout
        self._started = False
        self._closed = False
        self._workers: list[threading.Thread] = []
        #: The thread finishing a close() asked on the IO thread (which cannot wait for
        #: itself); a close() from elsewhere waits for it.
        self._closer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failure_raised = False

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the IO thread: connect to nsqd / ask lookupd (``with`` does it). Iterating,
        ``get()``, ``run()`` and ``fetch()`` start a consumer that was not started."""
        if not self._launch():
            raise LocalProtocolError("Consumer already started")

    def _ensure_started(self) -> None:
        self._launch()

    def _launch(self) -> bool:
        """Start the IO thread unless it was; False when it was started already."""
        with self._lock:
            if self._started:
                return False
            if self._closed:
                raise LocalProtocolError("the consumer is closed")
            self._started = True
        io = self._io
        io.loop.start()
        io.loop.call_soon(lambda: io.coordinator.start(time.monotonic()))
        if io.coordinator.max_in_flight == 0:
            log_paused(io.logger, self.topic, self.channel, 0)
        return True

    def __enter__(self) -> Consumer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
        if exc_type is None and self._io.failure is not None and not self._failure_raised:
            self._raise_failure()  # the block never waited for a message: say it now

    def _raise_failure(self) -> None:
        failure = self._io.failure
        assert failure is not None
        self._failure_raised = True
        raise failure

    def _refuse_on_io_thread(self, call: str, instead: str) -> None:
        """Raise LocalProtocolError when this is the IO thread (``on_event``, or any callback
        it runs): ``call`` waits for what only that thread can do, so there it could only
        stall every connection (heartbeats included) until its timeout, or for ever."""
        if self._io.loop.in_loop_thread():
            raise LocalProtocolError(
                f"{call} waits for the consumer's IO thread and was called on it (from "
                f"on_event or another callback it runs), where it cannot return: {instead}"
            )

    def _in_own_handler(self) -> bool:
        """Whether this thread runs a run() handler of this consumer whose message is not
        answered yet: a drain would wait for that message."""
        me = threading.get_ident()
        return any(
            thread == me and not message.answered
            for message, thread in list(self._io.handlers.items())
        )

    def start_drain(self, timeout: float | None = None) -> None:
        """Begin a graceful drain and return at once (safe in a signal handler or a handler,
        and in ``on_event``).

        RDY 0 everywhere, messages not yet handed to user code are requeued, messages in user
        code get up to ``timeout`` (default ``config.drain_timeout``) to be answered, then they
        are requeued (run()'s handlers still running are reported: a thread cannot be
        cancelled) and CLS. While draining, a ``timeout`` that ends sooner moves the deadline
        (``0``: stop now). A bad ``timeout`` raises LocalProtocolError here and changes nothing.
        """
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        if not self._started:
            raise LocalProtocolError("drain before the consumer was started")
        self._start_drain(timeout)

    def _start_drain(self, timeout: float | None) -> Future[None] | None:
        """Begin the drain, or move its deadline sooner; the future (None when nothing was
        asked of the IO thread) reports the IO thread's part of it."""
        io = self._io
        if not self._started:
            io.draining = True
            io.drained.set()
            io.wake_users()
            return None
        limit = io.config.drain_timeout if timeout is None else timeout
        if not self._mark_draining(limit):
            return None  # a drain under way ends sooner already
        return io.call(lambda: io.begin_drain(timeout))

    def _mark_draining(self, limit: float) -> bool:
        """Note a drain ending ``limit`` seconds from now, unless one under way ends sooner
        (False), and end the waits for a message: nothing new comes during a drain."""
        io = self._io
        ends = time.monotonic() + limit
        if ends >= io.drain_ends:
            return False
        io.drain_ends = ends
        io.drain_timeout = limit
        io.draining = True
        io.wake_users()
        return True

    def drain(self, timeout: float | None = None) -> DrainResult:
        """Graceful shutdown (see :meth:`start_drain`); returns once it is over and every
        connection is closed, with what the deadline cut short (:class:`DrainResult`: the
        messages it requeued, run()'s handlers still running in their threads). Called again
        while draining, a sooner deadline wins (``0``: now). A bad ``timeout`` raises
        LocalProtocolError here and changes nothing. Not on the IO thread (``on_event``),
        which must carry the drain out: LocalProtocolError, nothing begun; call
        :meth:`start_drain` there. Nor in a ``run()`` handler of this consumer (its thread)
        before its message is answered: the drain would wait for that message, so it raises
        LocalProtocolError at once and begins nothing; call :meth:`start_drain` there too."""
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        if not self._started:
            raise LocalProtocolError("drain before the consumer was started")
        self._refuse_on_io_thread(
            "drain()", "call start_drain(), which begins the drain and returns at once"
        )
        if self._in_own_handler():
            raise LocalProtocolError(DRAIN_IN_HANDLER)
        limit = self._io.config.drain_timeout if timeout is None else timeout
        begun = self._start_drain(limit)
        if begun is not None:
            with contextlib.suppress(TimeoutError):
                begun.result(limit + 10.0)  # the IO thread's error, if any, is raised here
        # The core ends the drain by itself (requeue at the deadline, CLS, a connection that
        # never answers is cut 5 s later); the margin only guards against a stuck IO thread.
        self._io.drained.wait(limit + 10.0)
        self._shutdown()
        io = self._io
        return DrainResult(
            requeued=tuple(io.drain_held),
            still_running=tuple(message.id for message in list(io.handlers)),
        )

    @property
    def draining(self) -> bool:
        """True once a drain was asked for, or the consumer closed or failed."""
        return self._io.draining

    def close(self) -> None:
        """Requeue every unanswered message now, CLS, close the sockets, join the threads
        (waiting up to ``close_timeout`` for the quick drain).

        From the IO thread (``on_event``) it returns at once: what user code holds is
        requeued before it returns and the rest (the CLS, the join) is finished on a helper
        thread; leaving the ``with`` block waits for it."""
        if self._io.loop.in_loop_thread():
            self._close_from_io_thread()
            return
        closer = self._closer
        if closer is not None and closer is not threading.current_thread():
            closer.join()  # bounded: close_timeout, then the joins of _shutdown
        if self._closed:
            return
        if self._started and not self._io.drained.is_set():
            # Requeue everything now (a drain under way ends now too).
            self.start_drain(0.0)
            self._io.drained.wait(self._close_timeout)
        self._shutdown()

    def _close_from_io_thread(self) -> None:
        """:meth:`close` on the IO thread, which cannot wait for its own drain: the quick
        drain is begun here (an answer given after this is too late, and said so as after
        any close), and a helper thread waits for it and closes."""
        with self._lock:
            if self._closed or self._closer is not None:
                return
            self._closer = closer = threading.Thread(
                target=self.close,
                name=f"nsq-sync-close-{self.topic}/{self.channel}",
                daemon=True,
            )
        io = self._io
        # Not once the loop ended (on_event called from its last step): nothing is left to
        # drain on it, and the helper's close() finds it stopped.
        if not io.stopped and not io.drained.is_set() and self._mark_draining(0.0):
            try:
                io.begin_drain(0.0)
            finally:  # whatever happened, the close is finished (the with block joins it)
                closer.start()
            return
        closer.start()

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        io = self._io
        io.draining = True
        io.drained.set()
        io.wake_users()
        io.stop()
        if io.dead_letters is not None:
            io.dead_letters.close()
        current = threading.current_thread()
        busy = set(io.handlers.values())  # a thread cannot be cancelled: not waited for
        for worker in list(self._workers):
            # (a run() starting now adds its workers before starting them: those end at once)
            if worker is not current and worker.ident is not None and worker.ident not in busy:
                worker.join(5.0)
        self._report_left_running()
        for future in list(io.fetches.values()):
            if not future.done():
                future.set_result([])

    # --- consuming ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        """The messages, in delivery order, until a drain starts (nothing new comes then;
        the drain still waits for the messages already taken) or the consumer closes or
        fails (then its error is raised). Not on the IO thread (``on_event``), which
        delivers the messages: LocalProtocolError."""
        if self._pull:
            raise LocalProtocolError("pull consumers use fetch(); iteration is for push consumers")
        self._refuse_on_io_thread("iterating the consumer", _ELSEWHERE_OR_GET_NOW)
        self._ensure_started()
        return self._messages()

    def _messages(self) -> Iterator[Message]:
        io = self._io
        popleft = io.ready.popleft
        next_message = self._next_message
        while True:
            try:  # once draining, what is still queued is the drain's to requeue
                message = None if io.draining else popleft()
            except IndexError:
                message = None
            if message is None:
                message = next_message(None)
                if message is None:
                    if io.failure is not None:
                        self._raise_failure()
                    return
            # Asked per message: instrumenting (or not) a loop already running applies to
            # its next message, as on asyncio and trio.
            telemetry = io.telemetry
            if telemetry is not None:
                telemetry.received(message)
            yield message

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None after ``timeout`` seconds (None: no limit, 0: only one
        already received) or as soon as a drain starts or the consumer closes. On the IO
        thread (``on_event``), which delivers the messages, only ``timeout=0``: any other
        raises LocalProtocolError."""
        if timeout is not None:
            check_seconds("get timeout", timeout)
        if self._pull:
            raise LocalProtocolError("pull consumers use fetch(); get() is for push consumers")
        if timeout != 0:
            self._refuse_on_io_thread(f"get(timeout={timeout!r})", _ELSEWHERE_OR_GET_NOW)
        self._ensure_started()
        message = self._next_message(timeout)
        if message is None:
            if self._io.failure is not None:
                self._raise_failure()
            return None
        telemetry = self._io.telemetry  # asked once the message is here, as iteration does
        if telemetry is not None:
            telemetry.received(message)
        return message

    def _next_message(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` (None: no limit); None after it, or
        as soon as the consumer drains (not once the drain is over): nothing new comes then
        (RDY 0 everywhere; what is still queued here is requeued by the drain), and waiting
        for the drain's end in a handler would wait for the handler's own message."""
        io = self._io
        ready = io.ready
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if io.draining:
                return None
            try:
                return ready.popleft()
            except IndexError:
                pass
            crashed = io.loop.failure
            if crashed is not None:
                raise RuntimeError(f"the consumer's IO thread crashed: {crashed!r}") from crashed
            with io.cond:
                if ready or io.draining:
                    continue
                wait = 1.0
                if deadline is not None:
                    wait = deadline - time.monotonic()
                    if wait <= 0:
                        return None
                    wait = min(wait, 1.0)
                # An iterator made in another thread, advanced on the IO thread:
                self._refuse_on_io_thread("waiting for a message", _ELSEWHERE_OR_GET_NOW)
                io.sleepers += 1
                try:
                    io.cond.wait(wait)
                finally:
                    io.sleepers -= 1

    def run(self, handler: Callable[[Message], object], *, concurrency: int | None = None) -> None:
        """Call ``handler(msg)`` for every message on ``concurrency`` worker threads (default:
        ``max_in_flight``, at most 32) until a drain starts or the consumer closes; returns
        once the handlers under way then are done (or the drain's deadline passed). Unless the
        handler answered the message itself: returning None or True FINs it, returning False
        or raising REQs it (with backoff); any other value is logged as a TypeError and REQs
        it. Ctrl-C starts a drain. At most ``max_in_flight`` handlers run at once whatever
        ``concurrency`` is (no more messages exist). Not on the IO thread (``on_event``),
        which delivers the messages: LocalProtocolError."""
        if self._pull:
            raise LocalProtocolError("run() is for push consumers; this one has pull=True")
        if concurrency is None:
            concurrency = max(1, min(self._io.coordinator.max_in_flight, MAX_DEFAULT_THREADS))
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise LocalProtocolError(f"run() concurrency must be an int >= 1, got {concurrency!r}")
        if not callable(handler):
            raise LocalProtocolError(f"run() handler must be callable, got {handler!r}")
        self._refuse_on_io_thread(
            "run()", "call it from another thread (it returns once a drain starts)"
        )
        self._ensure_started()
        user_handler = handler  # named in the log when it returns what is not a result
        handler = self._tracked(handler)  # the drain reports the handlers still running
        logger = self._io.logger

        def work() -> None:
            while True:
                message = self._next_message(None)
                if message is None:
                    return
                try:
                    result = handler(message)
                except Exception as exc:
                    log_handler_failed(
                        logger,
                        message.nsqd_address,
                        message.id,
                        topic=self.topic,
                        channel=self.channel,
                        attempts=message.attempts,
                    )
                    if self._io.dead_letters is not None:
                        self._io.dead_letters.logic.note_error(message._delivery.id, exc)
                    if not message.answered:
                        message.requeue()
                else:
                    if not message.answered:
                        if result is None or handler_finishes(
                            result,
                            user_handler,
                            logger,
                            message.nsqd_address,
                            message.id,
                            topic=self.topic,
                            channel=self.channel,
                            attempts=message.attempts,
                        ):
                            message.finish()
                        else:
                            message.requeue()

        # Set by the last worker to end: waited for as an event, never by joining a thread,
        # which a Ctrl-C in join() can leave marked as ended while it runs (CPython < 3.13).
        ended = threading.Event()
        remaining = [concurrency]
        count_lock = threading.Lock()

        def worker_main() -> None:
            try:
                work()
            finally:
                with count_lock:
                    remaining[0] -= 1
                    if not remaining[0]:
                        ended.set()

        workers = [
            threading.Thread(target=worker_main, name=f"nsq-sync-worker-{i}", daemon=True)
            for i in range(concurrency)
        ]
        self._workers.extend(workers)
        try:
            # Started inside the try: a Ctrl-C as soon as a handler runs still drains.
            for worker in workers:
                worker.start()
                assert worker.ident is not None
                self._io.worker_names[worker.ident] = worker.name
            self._wait_for(workers, ended)
        except KeyboardInterrupt:
            # Ctrl-C without drain_on_signals: a graceful drain (bounded by its timeout),
            # then KeyboardInterrupt; Ctrl-C again during it stops at once.
            try:
                self._start_drain(None)
                self._wait_for(workers, ended)
            except KeyboardInterrupt:
                self._start_drain(0.0)
                raise
            raise
        finally:
            self._report_left_running()
        if self._io.failure is not None:
            self._raise_failure()

    def _tracked(self, handler: Callable[[Message], object]) -> Callable[[Message], object]:
        """``handler``, noted in the IO side's ``handlers`` while it runs (by thread)."""
        handlers = self._io.handlers
        thread = threading.get_ident

        def call(message: Message) -> object:
            handlers[message] = thread()
            try:
                return handler(message)
            finally:
                del handlers[message]

        return call

    def _wait_for(self, workers: list[threading.Thread], ended: threading.Event) -> None:
        """Until every worker is done (``ended``), or the consumer is over (drained, failed
        or closed) and its drain's deadline has passed: a handler still running then is left
        to run (a thread cannot be cancelled; its message was requeued and it is reported).
        Idle workers end when a drain starts, busy ones once their handler is done."""
        io = self._io
        while True:
            if ended.is_set():
                return
            alive = [worker for worker in workers if worker.is_alive()]
            if not alive:
                return
            if not io.drained.is_set() and io.loop.failure is None:
                ended.wait(0.5)
                continue
            left = io.drain_ends - time.monotonic()
            if left <= 0 or math.isinf(left):  # over (or failed: no deadline to wait for)
                busy = set(io.handlers.values())
                for worker in alive:
                    if worker.ident not in busy:
                        worker.join(1.0)  # idle: it ends at once
                return
            ended.wait(min(left, 0.5))

    def _report_left_running(self) -> None:
        """Log run()'s handlers still running that the drain's deadline did not name (they
        had answered their message), once."""
        io = self._io
        if not io.drained.is_set():
            return
        left = {m: t for m, t in list(io.handlers.items()) if m not in io.reported_running}
        if left:
            io.reported_running.update(left)
            names = io.worker_names
            log_handlers_left_running(
                io.logger,
                {m.id: names.get(t, str(t)) for m, t in left.items()},
                topic=self.topic,
                channel=self.channel,
            )

    def fetch(
        self, batch: int, timeout: float | None = 5.0, *, no_wait: bool = False
    ) -> list[Message]:
        """Pull mode: up to ``batch`` messages, waiting at most ``timeout`` seconds for them
        (then what arrived, maybe nothing; None: until ``batch`` arrived); ``no_wait``: only
        what is already buffered. RDY follows outstanding fetches, so nsqd never sends more
        than was asked. Answer each message (FIN after commit). Not on the IO thread
        (``on_event``), which asks nsqd for them: LocalProtocolError, nothing asked."""
        if not self._pull:
            raise LocalProtocolError("fetch() needs Consumer(..., pull=True)")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if timeout is not None:
            check_seconds("fetch timeout", timeout, zero=False)
        self._refuse_on_io_thread("fetch()", "call it from another thread")
        self._ensure_started()
        io = self._io
        if io.failure is not None:
            self._raise_failure()
        if self._closed or io.draining:
            return []
        future: Future[list[Message]] = Future()

        def ask() -> None:
            now = time.monotonic()
            if io.posted:  # answers given before this fetch go first (RDY counts them)
                io.take_answers(now)
            try:
                request_id = io.coordinator.fetch(batch, now, expires=timeout, no_wait=no_wait)
            except Exception as exc:
                future.set_exception(exc)
                return
            io.fetches[request_id] = future

        io.loop.call_soon(ask)
        wait = None if timeout is None else timeout + 5.0
        try:
            messages = future.result(wait)
        except TimeoutError:
            return []
        if not messages and io.failure is not None:
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
        return self._io.finish_many(messages)

    # --- introspection ------------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The configuration in force (max_in_flight follows :meth:`set_max_in_flight`)."""
        return self._io.coordinator.config

    def is_starved(self) -> bool:
        """The client guide's is_starved (a hint to process a batch)."""
        return self._io.coordinator.is_starved()

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time (0 pauses the flow); RDY is redistributed on the
        IO thread before this returns (when it runs). A bad value raises ConfigError here and
        changes nothing."""
        io = self._io
        coordinator = io.coordinator
        coordinator.config.replace(max_in_flight=max_in_flight)  # validates, or raises
        before = coordinator.max_in_flight
        if (before == 0) != (max_in_flight == 0):
            log_paused(io.logger, self.topic, self.channel, max_in_flight)
        if io.loop.in_loop_thread():
            coordinator.set_max_in_flight(max_in_flight, time.monotonic())
            return
        done = io.call(lambda: coordinator.set_max_in_flight(max_in_flight, time.monotonic()))
        if self._started and not self._closed and io.loop.failure is None:
            with contextlib.suppress(TimeoutError):
                done.result(5.0)

    def stats(self) -> ConsumerStats:
        """A snapshot (plain frozen dataclass), taken on the IO thread when it runs. Safe to
        call from any thread (a metrics scrape): when the IO thread does not answer within 5
        seconds it is read from here, from copies taken in one step each, so it never raises."""
        io = self._io
        if self._started and not self._closed and not io.loop.in_loop_thread():
            future = io.call(io.snapshot)
            with contextlib.suppress(TimeoutError):
                return future.result(5.0)
        return io.snapshot()

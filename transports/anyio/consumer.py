"""The anyio consumer: a thin driver of :class:`nsq_sansio.consumer.ConsumerCoordinator`.

It reads sockets in 64 KiB chunks, feeds the coordinator, writes what it returns (one write
per connection per loop iteration: every FIN decided since the last write goes out at once),
sleeps until the coordinator's next deadline and hands messages to user code. The coordinator
decides everything else (RDY, backoff, attempts, discovery, reconnection, drain, pull).

Tasks (all inside the consumer's task group; none outlive ``async with``):

* one per connection: connect, then read (a separate writer task flushes its output);
* one per lookupd request;
* the pump: timers, and flushing what user code decided (FIN/REQ/TOUCH/fetch/drain).

User code never runs in those tasks, so a slow handler never delays heartbeats. The tasks
that own sockets are in ``_consumer_io.py``, the :class:`Message` user code answers in
``message.py``.
"""

from __future__ import annotations

import logging
import math
import random
import signal
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from operator import attrgetter
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    ConsumerCoordinator,
    ConsumerState,
    Deliver,
    Disconnected,
    DrainTimedOut,
    FetchEnd,
    FetchResult,
    SendHTTPRequest,
)
from nsq_sansio.discovery import NSQDAddress, NSQDFilter
from nsq_sansio.errors import ConfigError, LocalProtocolError, NSQError
from transports._common import ConnectionLogger, ConsumerStats, DrainResult, split_options
from transports._common.arguments import check_seconds
from transports._common.consumer_actions import ConsumerActions
from transports._common.dead_letter import DeadLetterRoute, dead_letter_settings
from transports._common.handlers import DRAIN_IN_HANDLER, handler_finishes
from transports._common.logs import fields
from transports._common.message import DeliveryHook, KeepaliveExpired, unanswered_of
from transports._common.reports import (
    EventCallback,
    log_drain_timed_out,
    log_handler_failed,
    log_paused,
    log_signal_drain,
    log_signal_stop,
)

from ._consumer_io import Conn, ConsumerConnections
from ._dead_letter import DeadLetterPublisher
from ._groups import sole_error
from .message import Message

__all__ = [
    "Consumer",
    "DrainResult",
    "EventCallback",
    "KeepaliveExpired",
    "Message",
    "drain_on_signals",
]

_log = logging.getLogger("nsq_sansio.anyio.consumer")

_delivery_of = attrgetter("_delivery")

#: How often the pump calls handle_timer while the core reports a deadline already handled.
_STALE_DEADLINE_POLL = 0.05


#: How many handlers ``run()`` runs at once by default, at most.
MAX_DEFAULT_CONCURRENCY = 256

#: The slots (``[message]``) of the run() workers the current task is, or was started from:
#: set once in each worker task, so the handler and the tasks it starts (they run in a copy of
#: its context) see its message; ``drain()`` there would wait for it while it is unanswered.
_handler_slots: ContextVar[tuple[list[Message | None], ...]] = ContextVar(
    "nsq_sansio_handler_slots", default=()
)


class Consumer(ConsumerConnections):
    """Consume ``topic``/``channel`` from nsqd (``nsqd=[...]``) or via lookupd (``lookupd=[...]``).

    Keyword arguments are :class:`~nsq_sansio.config.Config` fields (``max_in_flight=200``,
    ``max_attempts``, ``snappy=True``, ``auth_secret``, ``heartbeat_interval``...) or transport
    options (``connect_timeout``, ``tls=TLSOptions(...)`` / ``tls_ca_file=...`` etc.).
    ``pull=True`` makes a pull consumer (:meth:`fetch`). ``nsqd_filter`` decides which nsqd
    a lookupd lists are connected to (:func:`~nsq_sansio.discovery.allow_nsqd`, or any
    ``NSQDAddress -> bool``; refused ones are reported once as ``NodeRefused``).
    ``on_event`` receives every report
    (see :data:`EventCallback`); ``logger`` replaces ``nsq_sansio.anyio.consumer``;
    ``close_timeout`` bounds how long leaving the ``async with`` block waits for the quick
    drain. ``dead_letter_topic`` (a topic, or ``message -> topic or None``) publishes a
    message given up after ``max_attempts`` there before it is FIN'd (requeued if that
    fails), as its body or, with ``dead_letter_format="envelope"``, a JSON envelope;
    ``dead_letter_nsqd`` says which nsqd (default: the consumer's). See docs/dead-letters.md.

    Use it as ``async with``; leaving the block drains quickly (messages not answered are
    requeued), closes every connection and ends every task. An exception raised in the block
    comes out as itself, never inside an exception group.
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
        self._config, self._options = split_options(config, options)
        nsqd_list = [nsqd] if isinstance(nsqd, str) else list(nsqd)
        lookupd_list = [lookupd] if isinstance(lookupd, str) else list(lookupd)
        self._coord = ConsumerCoordinator(
            topic,
            channel,
            self._config,
            rng=rng or random.Random(),
            nsqd=nsqd_list,
            lookupd=lookupd_list,
            pull=pull,
            nsqd_filter=nsqd_filter,
            dead_letter=dead_letters is not None,
        )
        #: What the core's actions mean, decided once for every runtime; IO is ours.
        self._actions = ConsumerActions(
            self._coord, _AnyioRuntime(self), logger=logger or _log, on_event=on_event
        )
        self._dead_letters: DeadLetterPublisher | None = None
        if dead_letters is not None:
            self._dead_letters = DeadLetterPublisher(
                dead_letters,
                self._coord,
                nsqd=nsqd_list,
                options=self._options,
                logger=logger or _log,
                spawn=self._spawn,
                kick=self._kick,
                connected=lambda: [str(conn.address) for conn in self._conns.values()],
            )
            self._actions.dead_letters = self._dead_letters
        self.topic = topic
        self.channel = channel
        self._pull = pull
        self._logger = logger or _log
        self._close_timeout = close_timeout
        self._conns: dict[int, Conn] = {}
        self._http: dict[int, anyio.CancelScope] = {}
        self._inbox: deque[Deliver] = deque()
        self._waiters: deque[anyio.Event] = deque()
        #: The waiter woken for new messages that has not run yet: one at a time, and each
        #: reader that takes a message while more wait wakes the next (see _wake_one).
        self._woken: anyio.Event | None = None
        self._kick_event = anyio.Event()
        self._kicked = False
        self._pump_target = math.inf
        self._fetches: dict[int, list[Any]] = {}
        self._drained = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._task_scopes: set[anyio.CancelScope] = set()
        self._draining = False
        self._closed = False
        self._in_context = False
        self._exited = False
        #: The error the consumer failed with (ConsumerFailed: nsqd refused the
        #: configuration; or a task of ours crashed); raised by iteration, run(), fetch(),
        #: and at exit if never seen.
        self._failure: Exception | None = None
        self._failure_raised = False
        #: run()'s workers: each one's cancel scope (the drain's deadline cancels them) and the
        #: one-item list holding the message it last handed to its handler (one not answered
        #: is in its handler still: a worker answers as soon as its handler returns or raises).
        self._workers: dict[anyio.CancelScope, list[Message | None]] = {}
        #: The drain: when its deadline passes, its timeout, and what it reports.
        self._drain_ends = math.inf
        self._drain_timeout = 0.0
        self._drain_cancelled: list[bytes] = []
        self._handlers_cut = False
        #: OpenTelemetry's hook (``transports.otel``): None unless instrumented.
        self._telemetry: DeliveryHook | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start (``async with`` does it); connections open in the background.

        Without ``async with``, end it with :meth:`close` from the same task, outside any
        cancel scope entered after ``start()`` (the consumer's task group is exited there)."""
        if self._tg is not None:
            raise LocalProtocolError("Consumer already started")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._coord.start(monotonic())
        self._spawn(self._pump)
        self._dispatch()
        if self._coord.max_in_flight == 0:
            log_paused(self._logger, self.topic, self.channel, 0)

    async def __aenter__(self) -> Consumer:
        await self.start()
        self._in_context = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # The block's exception (or cancellation) is never handed to the task group, which
        # would wrap it in an exception group: the tasks are stopped, the group is exited
        # clean, and the exception goes on as itself, its traceback intact.
        await self._exit()
        if exc_type is None and self._failure is not None and not self._failure_raised:
            self._raise_failure()  # the block never waited for a message: say it now

    async def _exit(self) -> None:
        tg = self._tg
        if tg is None or self._exited:
            return
        self._exited = True
        try:
            await self._shutdown()
        finally:
            self._stop_tasks()
            tg.cancel_scope.cancel()
            try:
                await tg.__aexit__(None, None, None)
            except BaseException as raised:  # our tasks never raise; a cancellation might
                error = sole_error(raised)
                if error is None or error is raised:
                    raise
                raise error from None

    def _raise_failure(self) -> None:
        assert self._failure is not None
        self._failure_raised = True
        raise self._failure

    def _stop_tasks(self) -> None:
        self._closed = True
        self._kicked = False  # the pump is going: the next answer's _kick reports for it
        self._cancel_handlers()
        for scope in list(self._task_scopes):
            scope.cancel()
        self._wake_readers()

    async def close(self) -> None:
        """Drain at once (unanswered messages are requeued), close every connection and end
        every task. Inside ``async with`` the block's exit finishes the job."""
        if self._tg is not None and not self._in_context:
            # Started with start(): nothing else will exit the task group.
            await self._exit()
            return
        try:
            await self._shutdown()
        finally:
            if self._tg is not None:
                self._stop_tasks()

    async def _shutdown(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._close_timeout):
            if self._coord.state in (ConsumerState.RUNNING, ConsumerState.DRAINING):
                # Answer what is left at once (a drain under way ends now, not at its deadline).
                self._start_drain(0.0)
            self._kick()
            if self._coord.state is not ConsumerState.CREATED:
                await self._drained.wait()
                # DrainComplete comes when the core is done; the writers may still have the
                # last REQ/CLS to flush: let every connection task end by itself.
                while self._conns:
                    await anyio.sleep(0.002)

    def _start_drain(self, timeout: float | None) -> None:
        """Start the drain, or, while draining, move its deadline sooner (0: now)."""
        now = monotonic()
        # Messages in the inbox were never handed to user code: the coordinator requeues them
        # at once (it cannot tell them from those the user holds unless told).
        self._coord.drain(now, timeout, unseen=self._inbox)
        self._inbox.clear()
        limit = self._coord.config.drain_timeout if timeout is None else timeout
        if now + limit < self._drain_ends:
            self._drain_ends = now + limit
            self._drain_timeout = limit
            if limit > 0 and not self._closed:
                self._spawn(self._drain_deadline, self._drain_ends)
        self._wake_readers()
        self._dispatch()  # a deadline now: the coordinator reported what it took back
        if now >= self._drain_ends:
            self._cut_handlers()
        self._kick()

    async def _drain_deadline(self, deadline: float) -> None:
        """At the drain's deadline: what user code holds is requeued now and run()'s handlers
        still running are cancelled (the core's own timer may have done the first part)."""
        await anyio.sleep(max(deadline - monotonic(), 0.0))
        if self._coord.state is ConsumerState.DRAINING:
            self._coord.drain(monotonic(), 0.0)
            self._dispatch()
        self._cut_handlers()
        self._kick()

    def _cut_handlers(self) -> None:
        """The drain's deadline passed and the core had nothing held to requeue (else its
        ``DrainTimedOut`` cut them, see :meth:`_cut_once`): cancel run()'s handlers still
        running, which had answered their messages, and say so."""
        cancelled = self._cut_once()
        if cancelled:
            log_drain_timed_out(
                self._logger,
                timeout=self._drain_timeout,
                held=(),
                cancelled=cancelled,
                topic=self.topic,
                channel=self.channel,
            )

    def _cut_once(self) -> list[bytes]:
        """Cancel run()'s handlers still running, once per drain; the ids of the messages
        they had not answered (requeued by the drain: their answers are never sent)."""
        if self._handlers_cut:
            return []
        self._handlers_cut = True
        cancelled = self._cancel_handlers()
        self._drain_cancelled.extend(cancelled)
        return cancelled

    def _cancel_handlers(self) -> list[bytes]:
        """Cancel run()'s workers (their handlers, at the next ``await``: run() returns); the
        ids of the messages their handlers had not answered, now marked answered (the drain or
        the failure requeued them; nothing is sent for them afterwards: no late FIN)."""
        ids = []
        for scope, slot in list(self._workers.items()):
            scope.cancel()
            message = slot[0]
            if message is not None and not message.answered:
                ids.append(message.id)
                self._handler_cut(message)
        return ids

    def _handled(self) -> list[Message]:
        """The messages run()'s handlers hold now (handed to them, not answered yet)."""
        held = [slot[0] for slot in list(self._workers.values())]
        return [m for m in held if m is not None and not m.answered]

    async def _cancellable(self, worker: Callable[[list[Message | None]], Awaitable[None]]) -> None:
        """One of run()'s workers, in a cancel scope the drain's deadline (or the consumer's
        end) cancels, with the slot it notes its message in: nothing per message but a store."""
        slot: list[Message | None] = [None]
        with anyio.CancelScope() as scope:
            self._workers[scope] = slot
            try:
                await worker(slot)
            finally:
                del self._workers[scope]

    def _handler_cut(self, message: Message) -> None:
        """A handler was cancelled by the drain's deadline or the consumer's end."""
        if message.answered:
            return
        message.answered = True
        if self._coord.deadline(message._delivery) is None:
            message._late = True  # requeued by the drain (or nsqd took it back)
        else:  # still ours: give it back now rather than at nsqd's timeout
            self._coord.requeue(message._delivery, monotonic(), 0.0, backoff=False)
            self._kick()

    def _drain_result(self) -> DrainResult:
        running = tuple(m.id for m in self._handled())
        return DrainResult(tuple(self._actions.drain_held), tuple(self._drain_cancelled), running)

    def start_drain(self, timeout: float | None = None) -> None:
        """Begin a graceful drain and return at once (safe in a handler: see :meth:`drain`).

        RDY 0 everywhere, messages not yet handed to user code are requeued, messages in user
        code get up to ``timeout`` (default ``config.drain_timeout``) to be answered, then they
        are requeued, run()'s handlers still running are cancelled, and CLS. While draining, a
        ``timeout`` that ends sooner moves the deadline (``0``: stop now). A bad ``timeout``
        raises LocalProtocolError here and changes nothing.
        """
        self._check_drain_call(timeout)
        self._begin_drain(timeout)

    def _check_drain_call(self, timeout: float | None) -> None:
        """A drain's ``timeout`` and the consumer's state, checked before anything begins."""
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        if self._tg is None:
            raise LocalProtocolError("drain before the consumer was started")

    def _begin_drain(self, timeout: float | None) -> None:
        """What :meth:`start_drain` does once its call is checked: draining from now, and
        the drain started (or its deadline moved) when the consumer runs or drains."""
        self._draining = True
        if self._coord.state is ConsumerState.RUNNING or (
            self._coord.state is ConsumerState.DRAINING and timeout is not None
        ):
            self._start_drain(timeout)

    async def drain(self, timeout: float | None = None) -> DrainResult:
        """Graceful shutdown (see :meth:`start_drain`); returns once it is over and every
        connection is closed, with what the deadline cut short (:class:`DrainResult`: the
        messages it requeued, the run() handlers it cancelled). Called again while draining,
        a sooner deadline wins (``0``: now). Not from a ``run()`` handler of this consumer
        (or a task it starts) before its message is answered: the drain would wait for that
        message, so it raises LocalProtocolError at once and begins nothing; call
        :meth:`start_drain` there."""
        self._check_drain_call(timeout)
        if self._in_own_handler():
            raise LocalProtocolError(DRAIN_IN_HANDLER)
        self._begin_drain(timeout)
        await self._drained.wait()
        return self._drain_result()

    def _in_own_handler(self) -> bool:
        """Whether the current task is a run() handler of this consumer (or was started from
        one) whose message is not answered yet: a drain would wait for that message."""
        for slot in _handler_slots.get():
            message = slot[0]
            if message is not None and message._consumer is self and not message.answered:
                return True
        return False

    @property
    def draining(self) -> bool:
        """True once a drain was asked for, or the consumer closed or failed."""
        return self._draining or self._coord.state in (
            ConsumerState.DRAINING,
            ConsumerState.CLOSED,
            ConsumerState.FAILED,
        )

    @property
    def config(self) -> Config:
        """The configuration every connection of this consumer identifies with."""
        return self._coord.config

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once.
        A bad value raises (ConfigError) here and changes nothing."""
        before = self._coord.max_in_flight
        self._coord.set_max_in_flight(max_in_flight, monotonic())
        if (before == 0) != (max_in_flight == 0):
            log_paused(self._logger, self.topic, self.channel, max_in_flight)
        self._kick()

    def is_starved(self) -> bool:
        """Whether some connection has used most of its RDY (NSQ's ``IsStarved``): a batch of
        messages is waiting for answers."""
        return self._coord.is_starved()

    # --- consuming -----------------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        if self._pull:
            raise LocalProtocolError("pull consumers use fetch(); iteration is for push consumers")
        return self

    async def __anext__(self) -> Message:
        inbox = self._inbox
        if inbox and self._telemetry is None:  # fast path: no await when messages are buffered
            delivery = inbox.popleft()
            if delivery.conn_id in self._conns:
                if inbox and self._waiters:
                    self._wake_one()
                return Message(self, delivery)
        message = await self._next_message()
        if message is None:
            if self._failure is not None:
                self._raise_failure()
            raise StopAsyncIteration
        if self._telemetry is not None:
            self._telemetry.received(message)
        return message

    async def _next_message(self) -> Message | None:
        inbox = self._inbox
        conns = self._conns
        coord = self._coord
        while True:
            while inbox:
                delivery = inbox.popleft()
                if delivery.conn_id in conns:
                    if inbox and self._waiters:
                        self._wake_one()
                    return Message(self, delivery)
            if self._closed or coord.state is not ConsumerState.RUNNING or self._failure:
                return None
            if self._pull:
                raise LocalProtocolError(
                    "pull consumers use fetch(); iteration is for push consumers"
                )
            # One event per waiter, woken one at a time (_wake_one): never all of them.
            event = anyio.Event()
            waiters = self._waiters
            waiters.append(event)
            try:
                await event.wait()
            except BaseException:
                if not event.is_set():
                    waiters.remove(event)
                elif self._woken is event:  # cancelled after its wake-up: pass it on
                    self._woken = None
                    if inbox:
                        self._wake_one()
                raise
            if self._woken is event:
                self._woken = None

    async def run(
        self,
        handler: Callable[[Message], Awaitable[object]],
        *,
        concurrency: int | None = None,
    ) -> None:
        """Call ``handler(msg)`` for every message with up to ``concurrency`` running at once
        (default: ``max_in_flight``, at most 256) until a drain starts or the consumer closes;
        returns once the handlers under way then are done (or cancelled at the drain's
        deadline). Unless the handler answered the message itself: returning None or True FINs it,
        returning False or raising REQs it (with backoff); any other value is logged as a
        TypeError and REQs it."""
        if self._pull:
            raise LocalProtocolError("run() is for push consumers; this one has pull=True")
        if concurrency is None:
            concurrency = max(1, min(self._coord.max_in_flight, MAX_DEFAULT_CONCURRENCY))
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise LocalProtocolError(f"run() concurrency must be an int >= 1, got {concurrency!r}")
        if not callable(handler):
            raise LocalProtocolError(f"run() handler must be callable, got {handler!r}")
        if self._tg is None:
            raise LocalProtocolError("run() before the consumer was started")
        logger = self._logger

        inbox = self._inbox
        conns = self._conns
        waiters = self._waiters

        async def worker(slot: list[Message | None]) -> None:
            # Once per worker (its context is its own copy): the handler, and the tasks it
            # starts, find its message here (drain() there is refused while it is unanswered).
            _handler_slots.set((*_handler_slots.get(), slot))
            while True:
                if inbox:  # fast path, as in __anext__
                    delivery = inbox.popleft()
                    if delivery.conn_id not in conns:
                        continue
                    if inbox and waiters:
                        self._wake_one()
                    msg: Message | None = Message(self, delivery)
                else:
                    msg = await self._next_message()
                if msg is None:
                    return
                slot[0] = msg  # the drain's deadline says whose handler it cancelled
                try:
                    result = await handler(msg)
                except Exception as exc:
                    log_handler_failed(
                        logger,
                        msg.nsqd_address,
                        msg.id,
                        topic=self.topic,
                        channel=self.channel,
                        attempts=msg.attempts,
                    )
                    if self._dead_letters is not None:
                        self._dead_letters.logic.note_error(msg._delivery.id, exc)
                    if not msg.answered:
                        msg.requeue_nowait()
                else:
                    if not msg.answered:
                        if result is None or handler_finishes(
                            result,
                            handler,
                            logger,
                            msg.nsqd_address,
                            msg.id,
                            topic=self.topic,
                            channel=self.channel,
                            attempts=msg.attempts,
                        ):
                            msg.finish_nowait()
                        else:
                            msg.requeue_nowait()

        try:
            async with anyio.create_task_group() as tg:
                for _ in range(concurrency):
                    tg.start_soon(self._cancellable, worker)  # cancelled at the drain's deadline
        except BaseException as raised:  # a handler raised a BaseException (KeyboardInterrupt)
            error = sole_error(raised)
            if error is None or error is raised:
                raise
            raise error from None
        if self._failure is not None:
            self._raise_failure()

    async def fetch(
        self, batch: int, timeout: float | None = 5.0, *, no_wait: bool = False
    ) -> list[Message]:
        """Pull mode: up to ``batch`` messages, waiting at most ``timeout`` seconds for them
        (then what arrived, maybe nothing; None: until ``batch`` arrived); ``no_wait``: only
        what is already buffered. RDY follows outstanding fetches, so nsqd never sends more
        than was asked. Answer each message (FIN after commit)."""
        if not self._pull:
            raise LocalProtocolError("fetch() needs Consumer(..., pull=True)")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if timeout is not None:
            check_seconds("fetch timeout", timeout, zero=False)
        if self._tg is None:
            raise LocalProtocolError("fetch() before the consumer was started")
        if self._failure is not None:
            self._raise_failure()
        if self._closed or self.draining:
            return []
        slot: list[Any] = [anyio.Event(), None]
        request_id = self._coord.fetch(batch, monotonic(), expires=timeout, no_wait=no_wait)
        self._fetches[request_id] = slot
        self._dispatch()
        self._kick()
        try:
            await slot[0].wait()
        except BaseException:
            # Cancelled from outside (move_on_after, a task group...): the request must stop
            # waiting in the coordinator, or it keeps RDY open and swallows later deliveries.
            self._fetches.pop(request_id, None)
            if slot[1] is None:
                # Not answered yet (or its answer still queued in the coordinator): what it
                # gathered goes back to the hold buffer for the next fetch.
                self._coord.cancel_fetch(request_id, monotonic())
                if not self._closed:
                    self._dispatch()
                    self._kick()
            elif not self._closed:
                # Answered, but the caller never saw it: the messages go to the next fetch.
                self._coord.give_back(slot[1].messages, monotonic())
                self._dispatch()
                self._kick()
            else:
                self._requeue_all(slot[1].messages)
            raise
        result: FetchResult = slot[1]
        if result.reason is FetchEnd.FAILED and self._failure is not None:
            self._raise_failure()
        return [Message(self, d) for d in result.messages]

    # --- answering many ------------------------------------------------------------------------

    def finish_many_nowait(self, messages: Iterable[Message]) -> int:
        """FIN every message of ``messages`` not answered yet, in order: the same as
        ``finish_nowait()`` on each (answered ones are skipped, one given twice is FIN'd once,
        one that came too late gets :attr:`Message.taken_back` and a ``TakenBack`` report),
        in one call to the core, whatever the number of messages and connections. Returns how
        many this call answered (those ``finish_nowait()`` would have returned True for).
        Every message must come from this consumer: else LocalProtocolError (TypeError for
        something that is not a message) and nothing is answered."""
        fresh = unanswered_of(self, Message, messages)
        if not fresh:
            return 0
        refused: list[Deliver] = []
        self._coord.finish_many(list(map(_delivery_of, fresh)), monotonic(), refused=refused)
        for message in fresh:
            message.answered = True
        self._kick()
        if refused:
            late = set(map(id, refused))
            for message in fresh:
                if id(message._delivery) in late:
                    message._late = True
        return len(fresh)

    async def finish_many(self, messages: Iterable[Message]) -> int:
        """FIN many messages at once: see :meth:`finish_many_nowait`."""
        return self.finish_many_nowait(messages)

    # --- signals -------------------------------------------------------------------------------

    async def _signal_loop(
        self,
        scope: anyio.CancelScope,
        signals: Sequence[int],
        timeout: float | None,
        block: anyio.CancelScope,
    ) -> None:
        """The first signal drains; one more during the drain stops at once and cancels the
        ``drain_on_signals`` block; then the receiver closes, so a third signal gets the
        runtime's own handling (trio's KeyboardInterrupt for Ctrl-C...)."""
        with scope, anyio.open_signal_receiver(*map(signal.Signals, signals)) as receiver:
            async for signum in receiver:
                if not self.draining:
                    limit = self._coord.config.drain_timeout if timeout is None else timeout
                    log_signal_drain(
                        self._logger, signum, limit, topic=self.topic, channel=self.channel
                    )
                    self._draining = True
                    self._start_drain(timeout)
                    continue
                log_signal_stop(self._logger, signum, topic=self.topic, channel=self.channel)
                self._stop_now()
                block.cancel()
                return

    def _stop_now(self) -> None:
        """Stop at once: what user code holds is requeued, run()'s handlers are cancelled."""
        self._draining = True
        if self._coord.state in (ConsumerState.RUNNING, ConsumerState.DRAINING):
            self._start_drain(0.0)
        else:
            self._cut_handlers()

    # --- stats ---------------------------------------------------------------------------------

    def stats(self) -> ConsumerStats:
        """A snapshot: totals, RDY, backoff, reconnects and one entry per connection.

        Safe to call from another thread (a metrics scrape) while the event loop runs: it
        reads copies taken in one step each, never a collection the loop is changing, so
        it never raises; each figure is one the consumer had during the call."""
        conns = list(self._conns.values())  # one C-level copy: the loop may add/remove
        return self._actions.stats(
            (conn.conn_id, str(conn.address), conn.bytes_in, conn.bytes_out) for conn in conns
        )

    # --- internals: plumbing -------------------------------------------------------------------

    def _spawn(self, func: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start a background task, shielded from the cancellation of the code around the
        ``async with``: on the way out it must still requeue, CLS and close; it stops when
        :meth:`__aexit__` cancels it (after the quick drain, or its timeout)."""
        if self._tg is None or self._closed:
            raise LocalProtocolError("the consumer is not running")
        self._tg.start_soon(self._shielded, func, args)

    async def _shielded(self, func: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        """Run a task of ours. It never raises into the task group (which would cancel the
        user's code and wrap errors in a group): a crash (a bug) is logged and fails the
        consumer, so the user's next wait raises it, as itself."""
        with anyio.CancelScope(shield=True) as scope:
            self._task_scopes.add(scope)
            try:
                await func(*args)
            except Exception as exc:
                self._logger.exception(
                    "a task of consumer %s/%s crashed",
                    self.topic,
                    self.channel,
                    extra=fields(topic=self.topic, channel=self.channel, error=exc),
                )
                if self._failure is None:
                    self._failure = exc
                self._drained.set()
                self._wake_readers()
            finally:
                self._task_scopes.discard(scope)

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self._kick_event.set()
            if self._closed:
                # No pump any more: what a late answer decided (its TakenBack) is reported
                # here, as the pump would have (checked once per wake-up, not per answer).
                self._kicked = False
                actions = self._coord.take_actions()
                if actions:
                    self._actions.after_stop(actions)

    def _wake_readers(self) -> None:
        waiters = self._waiters
        while waiters:
            waiters.popleft().set()

    def _wake_one(self) -> None:
        """Wake one reader for the messages in the inbox, unless one woken earlier has not
        run yet. A reader that takes a message while more are buffered wakes the next, so a
        handler that awaits has company at once, and a batch taken by one reader whose
        handlers never suspend costs one wake-up, not one per message."""
        if self._woken is None and self._waiters:
            event = self._waiters.popleft()
            self._woken = event
            event.set()

    def _emit(self, event: object) -> None:
        self._actions.emit(event)

    def _log_for(self, address: object) -> ConnectionLogger:
        return ConnectionLogger(
            self._logger, str(address), nsq_topic=self.topic, nsq_channel=self.channel
        )

    async def _pump(self) -> None:
        """Timers, and writes decided by user code (FIN/REQ/TOUCH), batched per iteration."""
        coord = self._coord
        handled_at = -math.inf  # when handle_timer last ran
        while True:
            if not self._kicked:
                deadline = coord.next_deadline()
                if deadline is None:
                    self._pump_target = math.inf
                    await self._kick_event.wait()
                else:
                    delay = deadline - monotonic()
                    if deadline <= handled_at:
                        # handle_timer already ran at or after this deadline and the core
                        # still reports it: a stale deadline. Never spin on it; call
                        # handle_timer again at a modest pace until it moves.
                        delay = _STALE_DEADLINE_POLL
                        deadline = monotonic() + delay
                    self._pump_target = deadline
                    if delay > 0:
                        with anyio.move_on_after(delay):
                            await self._kick_event.wait()
            self._kick_event = anyio.Event()
            self._kicked = False
            self._pump_target = -math.inf  # running: dispatch need not wake us
            now = monotonic()
            deadline = coord.next_deadline()
            if deadline is not None and now >= deadline:
                coord.handle_timer(now)
                handled_at = now
            self._dispatch()
            # Let readers and user code run between iterations (batches the next writes).
            await anyio.lowlevel.checkpoint()

    def _dispatch(self) -> int:
        """Act on everything the coordinator decided; queue its bytes for the writers.
        Returns how many messages were delivered (for the reader's per-connection count)."""
        coord = self._coord
        actions = coord.take_actions()
        delivered = 0
        if actions:  # (an idle pass of the pump makes no call more)
            deliveries = self._actions.split(actions)
            delivered = len(deliveries)
            if delivered:
                self._inbox.extend(deliveries)
                if self._waiters:
                    self._wake_one()
        conns = self._conns
        for conn_id, data in coord.pending_data():
            conn = conns.get(conn_id)
            if conn is not None and not conn.closing:
                conn.out.append(data)
                conn.wake.set()
        # What the core did (and wrote: a lowered RDY starts its settle time when it is
        # written) may have brought its next deadline forward, with or without an action: a
        # settle time, a pull request's aging, a held message's deadline. The pump sleeps
        # until the deadline it last saw: wake it.
        if self._pump_target > -math.inf:
            deadline = coord.next_deadline()
            if deadline is not None and deadline < self._pump_target:
                self._kick()
        return delivered

    def _requeue_all(self, deliveries: Iterable[Deliver]) -> None:
        now = monotonic()
        for delivery in deliveries:
            self._coord.requeue(delivery, now, 0.0, backoff=False)
        self._kick()


class _AnyioRuntime:
    """What the consumer's actions (:class:`ConsumerActions`) need of its tasks: start and
    stop the connection and lookupd tasks, hand fetch answers over, cancel handlers, wake
    whoever waits."""

    __slots__ = ("_consumer",)

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def open_connection(self, conn_id: int, address: NSQDAddress) -> None:
        self._consumer._open_connection(conn_id, address)

    def start_tls(self, conn_id: int, trailing: bytes) -> None:
        conn = self._consumer._conns.get(conn_id)
        if conn is not None:
            conn.tls_pending = trailing  # the reader upgrades before its next read

    def close_connection(self, conn_id: int, final_data: bytes) -> None:
        conn = self._consumer._conns.get(conn_id)
        if conn is not None:
            if final_data:
                conn.out.append(final_data)
            conn.closing = True
            conn.wake.set()
            if conn.stream is None:  # still connecting: nothing to flush
                conn.scope.cancel()

    def connection_gone(self, action: Disconnected) -> None:
        """Nothing now: the connection's task forgets it (and its waiting messages) as it
        ends, and a message of it taken meanwhile is skipped."""

    def start_http(self, action: SendHTTPRequest) -> None:
        consumer = self._consumer
        scope = anyio.CancelScope()
        consumer._http[action.request_id] = scope
        consumer._spawn(consumer._http_request, action, scope)

    def close_http(self, request_id: int) -> None:
        scope = self._consumer._http.pop(request_id, None)
        if scope is not None:
            scope.cancel()

    def answer_fetch(self, result: FetchResult) -> bool:
        slot = self._consumer._fetches.pop(result.request_id, None)
        if slot is None:  # its caller is gone (should not happen: fetch() cancels it)
            return False
        slot[1] = result
        slot[0].set()
        return True

    def taken_back(self, delivery: Deliver) -> None:
        """Nothing to mark: :attr:`Message.taken_back` asks the core."""

    def stop_held(self, action: DrainTimedOut) -> tuple[Sequence[bytes], Mapping[bytes, str]]:
        return self._consumer._cut_once(), {}

    def failed(self, error: NSQError) -> None:
        consumer = self._consumer
        consumer._failure = error
        consumer._cancel_handlers()

    def finished(self) -> None:
        consumer = self._consumer
        consumer._drained.set()
        consumer._wake_readers()

    @property
    def drain_timeout(self) -> float:
        return self._consumer._drain_timeout


def _default_signals() -> tuple[int, ...]:
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


@asynccontextmanager
async def drain_on_signals(
    consumer: Consumer, *signals: int, timeout: float | None = None
) -> AsyncIterator[None]:
    """While the block runs, SIGTERM/SIGHUP/SIGINT (or ``signals``) start ``consumer``'s drain
    (with ``timeout``). One more signal during the drain stops at once: what user code holds
    is requeued, run()'s handlers are cancelled, and the block is cancelled (the code after it
    runs, as after ``move_on_after``); a third gets the runtime's own handling. A bad
    ``timeout`` raises LocalProtocolError here, not later in the signal task::

        async with Consumer(...) as c, drain_on_signals(c):
            await c.run(handler)        # returns once the drain started and handlers are done
    """
    if timeout is not None:
        check_seconds("drain timeout", timeout)
    receiver = anyio.CancelScope()
    with anyio.CancelScope() as block:
        consumer._spawn(
            consumer._signal_loop, receiver, signals or _default_signals(), timeout, block
        )
        try:
            yield
        finally:
            receiver.cancel()

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
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from itertools import repeat
from operator import attrgetter, is_
from time import monotonic
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConnectionUp,
    ConsumerCoordinator,
    ConsumerFailed,
    ConsumerState,
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
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.errors import LocalProtocolError, NSQError
from transports._common import (
    ConnectionLogger,
    ConnectionStats,
    ConsumerStats,
    split_options,
)
from transports._common.arguments import check_seconds
from transports._common.message import KeepaliveExpired, unanswered_of

from ._consumer_io import Conn, ConsumerConnections
from .message import Message

__all__ = ["Consumer", "KeepaliveExpired", "Message", "drain_on_signals"]

_log = logging.getLogger("nsq_sansio.anyio.consumer")

_delivery_of = attrgetter("_delivery")
_conn_id_of = attrgetter("conn_id")

#: How often the pump calls handle_timer while the core reports a deadline already handled.
_STALE_DEADLINE_POLL = 0.05


def _only(raised: BaseException, error: BaseException) -> bool:
    """``raised`` is ``error``, or (nested) exception groups holding only it."""
    while raised is not error:
        inner = getattr(raised, "exceptions", None)  # (Base)ExceptionGroup, also on 3.10
        if not inner or len(inner) != 1:
            return False
        raised = inner[0]
    return True


EventCallback = Callable[[object], None]


class Consumer(ConsumerConnections):
    """Consume ``topic``/``channel`` from nsqd (``nsqd=[...]``) or via lookupd (``lookupd=[...]``).

    Keyword arguments are :class:`~nsq_sansio.config.Config` fields (``max_in_flight=200``,
    ``max_attempts``, ``snappy=True``, ``auth_secret``, ``heartbeat_interval``...) or transport
    options (``connect_timeout``, ``tls=TLSOptions(...)`` / ``tls_ca_file=...`` etc.).
    ``pull=True`` makes a pull consumer (:meth:`fetch`). ``on_event`` receives the
    coordinator's reports (ConnectionUp, Disconnected, GiveUp, TakenBack, LookupdFailed,
    KeepaliveExpired) synchronously; it must not block.

    Use it as ``async with``; leaving the block drains quickly (messages not answered are
    requeued), closes every connection and ends every task.
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
        **options: Any,
    ) -> None:
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
        )
        self.topic = topic
        self.channel = channel
        self._pull = pull
        self._on_event = on_event
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
        self._seen: set[NSQDAddress] = set()
        self._reconnects = 0
        self._connection_errors = 0
        self._closed = False
        self._in_context = False
        self._exited = False
        #: The error the consumer failed with (ConsumerFailed: nsqd refused the
        #: configuration); raised by iteration, run(), fetch(), and at exit if never seen.
        self._failure: NSQError | None = None
        self._failure_raised = False

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

    async def __aenter__(self) -> Consumer:
        await self.start()
        self._in_context = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._exit(exc_type, exc, tb)

    async def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        tg = self._tg
        if tg is None or self._exited:
            return None
        try:
            await self._shutdown()
        finally:
            self._stop_tasks()
            tg.cancel_scope.cancel()
            self._exited = True
        try:
            suppress = await tg.__aexit__(exc_type, exc, tb)
        except BaseException as raised:
            if self._failure is not None and _only(raised, self._failure):
                # The task group wrapped the failure the block raised: give it back plain.
                raise self._failure from None
            raise
        if exc_type is None and self._failure is not None and not self._failure_raised:
            self._raise_failure()  # the block never waited for a message: say it now
        return suppress

    def _raise_failure(self) -> None:
        assert self._failure is not None
        self._failure_raised = True
        raise self._failure

    def _stop_tasks(self) -> None:
        self._closed = True
        for scope in list(self._task_scopes):
            scope.cancel()
        self._wake_readers()

    async def close(self) -> None:
        """Drain at once (unanswered messages are requeued), close every connection and end
        every task. Inside ``async with`` the block's exit finishes the job."""
        if self._tg is not None and not self._in_context:
            # Started with start(): nothing else will exit the task group.
            await self._exit(None, None, None)
            return
        try:
            await self._shutdown()
        finally:
            if self._tg is not None:
                self._stop_tasks()

    async def _shutdown(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._close_timeout):
            if self._coord.state is ConsumerState.RUNNING:
                self._start_drain(0.0)
            elif self._coord.state is ConsumerState.DRAINING:
                # Answer what is left at once rather than waiting for a long drain timeout.
                self._coord.drain(monotonic(), 0.0)
            self._kick()
            if self._coord.state is not ConsumerState.CREATED:
                await self._drained.wait()
                # DrainComplete comes when the core is done; the writers may still have the
                # last REQ/CLS to flush: let every connection task end by itself.
                while self._conns:
                    await anyio.sleep(0.002)

    def _start_drain(self, timeout: float | None) -> None:
        # Messages in the inbox were never handed to user code: the coordinator requeues them
        # at once (it cannot tell them from those the user holds unless told).
        self._coord.drain(monotonic(), timeout, unseen=self._inbox)
        self._inbox.clear()
        self._wake_readers()
        self._dispatch()
        self._kick()

    async def drain(self, timeout: float | None = None) -> None:
        """Graceful shutdown (seeds/003): no new messages (RDY 0), those not yet handed out are
        requeued, handlers still running may answer for up to ``timeout`` seconds (default
        ``drain_timeout``); then whatever is left is requeued and every connection closed."""
        if timeout is not None:
            check_seconds("drain timeout", timeout)
        if self._tg is None:
            raise LocalProtocolError("drain() before the consumer was started")
        if self._coord.state is ConsumerState.RUNNING:
            self._start_drain(timeout)
        await self._drained.wait()

    @property
    def draining(self) -> bool:
        return self._coord.state is not ConsumerState.RUNNING

    @property
    def coordinator(self) -> ConsumerCoordinator:
        return self._coord

    @property
    def config(self) -> Config:
        return self._coord.config

    def set_max_in_flight(self, max_in_flight: int) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once.
        A bad value raises (ConfigError) here and changes nothing."""
        self._coord.set_max_in_flight(max_in_flight, monotonic())
        self._kick()

    def is_starved(self) -> bool:
        return self._coord.is_starved()

    # --- consuming -----------------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        if self._pull:
            raise LocalProtocolError(
                "pull consumers use fetch(); `async for` is for push consumers"
            )
        return self

    async def __anext__(self) -> Message:
        inbox = self._inbox
        if inbox:  # fast path: no await when messages are buffered
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
            if self._closed or coord.state is not ConsumerState.RUNNING:
                return None
            if self._pull:
                raise LocalProtocolError(
                    "pull consumers use fetch(); `async for` is for push consumers"
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
        (default: max_in_flight, at most 256). Returning FINs the message, raising REQs it
        (with backoff), unless the handler answered it itself. Returns once drained."""
        if self._pull:
            raise LocalProtocolError("run() is for push consumers; this one has pull=True")
        if concurrency is None:
            concurrency = max(1, min(self._coord.max_in_flight, 256))
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency!r}")
        logger = self._logger

        inbox = self._inbox
        conns = self._conns
        waiters = self._waiters

        async def worker() -> None:
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
                try:
                    await handler(msg)
                except Exception:
                    ConnectionLogger(logger, msg.address).exception(
                        "handler failed for message %s; requeueing", msg.id.decode()
                    )
                    if not msg.answered:
                        msg.requeue_nowait()
                else:
                    if not msg.answered:
                        msg.finish_nowait()

        async with anyio.create_task_group() as tg:
            for _ in range(concurrency):
                tg.start_soon(worker)
        if self._failure is not None:
            self._raise_failure()

    async def fetch(
        self, batch: int, timeout: float | None = None, *, no_wait: bool = False
    ) -> list[Message]:
        """Pull mode: wait for up to ``batch`` messages, at most ``timeout`` seconds (then
        return what arrived, maybe nothing); ``no_wait`` returns at once what is buffered."""
        if not self._pull:
            raise LocalProtocolError("fetch() needs Consumer(..., pull=True)")
        if self._tg is None:
            raise LocalProtocolError("fetch() before the consumer was started")
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
        one no longer ours is reported as ``TakenBack`` and not sent) in one call to the core,
        whatever the number of messages and connections. Returns how many were FIN'd (those
        ``finish_nowait()`` would have returned True for). Every message must come from this
        consumer: else LocalProtocolError (TypeError for something that is not a message)
        and nothing is answered."""
        fresh = unanswered_of(self, Message, messages)
        if not fresh:
            return 0
        deliveries = list(map(_delivery_of, fresh))
        refused: list[Deliver] = []
        done = self._coord.finish_many(deliveries, monotonic(), refused=refused)
        for message in fresh:
            message.answered = True
        self._kick()
        if refused:
            late = set(map(id, refused))
            deliveries = [d for d in deliveries if id(d) not in late]
        conns = self._conns
        for conn_id, count in Counter(map(_conn_id_of, deliveries)).items():
            conn = conns.get(conn_id)
            if conn is not None:
                conn.finished += count
        return done

    async def finish_many(self, messages: Iterable[Message]) -> int:
        """FIN many messages at once: see :meth:`finish_many_nowait`."""
        return self.finish_many_nowait(messages)

    # --- signals -------------------------------------------------------------------------------

    @asynccontextmanager
    async def drain_on_signals(
        self, *signals: int, timeout: float | None = None
    ) -> AsyncIterator[None]:
        """While the block runs, SIGTERM/SIGHUP/SIGINT (or ``signals``) start :meth:`drain`."""
        if timeout is not None:
            check_seconds("drain timeout", timeout)  # here, not later in the signal task
        scope = anyio.CancelScope()
        self._spawn(self._signal_loop, scope, signals or _default_signals(), timeout)
        try:
            yield
        finally:
            scope.cancel()

    async def _signal_loop(
        self, scope: anyio.CancelScope, signals: Sequence[int], timeout: float | None
    ) -> None:
        with scope, anyio.open_signal_receiver(*map(signal.Signals, signals)) as receiver:
            async for signum in receiver:
                self._logger.warning("signal %s received: draining the consumer", signum)
                if self._coord.state is ConsumerState.RUNNING:
                    self._start_drain(timeout)
                return

    # --- stats ---------------------------------------------------------------------------------

    def stats(self) -> ConsumerStats:
        """A snapshot: totals, RDY, backoff, reconnects and one entry per connection.

        Safe to call from another thread (a metrics scrape) while the event loop runs: it
        reads copies taken in one step each, never a collection the loop is changing, so
        it never raises; each figure is one the consumer had during the call."""
        coord = self._coord
        counters = coord.stats
        connections = []
        for conn in list(self._conns.values()):  # one C-level copy: the loop may add/remove
            info = coord.link_info(conn.conn_id)
            phase, rdy, in_flight = info if info is not None else (None, 0, 0)
            connections.append(
                ConnectionStats(
                    address=str(conn.address),
                    state=phase.value if phase is not None else "closed",
                    connected=phase is not None and phase.value == "subscribed",
                    rdy=rdy,
                    in_flight=in_flight,
                    received=conn.received,
                    finished=conn.finished,
                    requeued=conn.requeued,
                    bytes_received=conn.bytes_in,
                    bytes_sent=conn.bytes_out,
                )
            )
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            received=counters["received"],
            finished=counters["finished"],
            requeued=counters["requeued"],
            given_up=counters["given_up"],
            taken_back=counters["taken_back"],
            in_flight=coord.in_flight_count(),
            rdy=coord.total_rdy,
            max_in_flight=coord.max_in_flight,
            backoff_level=coord.backoff_level,
            backoff_phase=coord.backoff_phase.value,
            reconnects=self._reconnects,
            connection_errors=self._connection_errors,
            connections=tuple(connections),
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
        with anyio.CancelScope(shield=True) as scope:
            self._task_scopes.add(scope)
            try:
                await func(*args)
            finally:
                self._task_scopes.discard(scope)

    def _kick(self) -> None:
        if not self._kicked:
            self._kicked = True
            self._kick_event.set()

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
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                self._logger.exception("on_event callback failed for %r", event)

    def _log_for(self, address: object) -> ConnectionLogger:
        return ConnectionLogger(self._logger, str(address))

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
        if actions:
            inbox = self._inbox
            if all(map(is_, map(type, actions), repeat(Deliver))):  # a read of messages only
                inbox.extend(actions)  # type: ignore[arg-type]
                delivered = len(actions)
            else:
                for action in actions:
                    if type(action) is Deliver:
                        inbox.append(action)
                        delivered += 1
                    else:
                        self._act(action)
            if delivered and self._waiters:
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

    def _act(self, action: object) -> None:
        if isinstance(action, Connect):
            self._open_connection(action)
        elif isinstance(action, CloseConnection):
            conn = self._conns.get(action.conn_id)
            if conn is not None:
                if action.final_data:
                    conn.out.append(action.final_data)
                conn.closing = True
                conn.wake.set()
                if conn.stream is None:  # still connecting: nothing to flush
                    conn.scope.cancel()
        elif isinstance(action, StartTLS):
            conn = self._conns.get(action.conn_id)
            if conn is not None:
                conn.tls_pending = action.trailing_data
        elif isinstance(action, SendHTTPRequest):
            scope = anyio.CancelScope()
            self._http[action.request_id] = scope
            self._spawn(self._http_request, action, scope)
        elif isinstance(action, CloseHTTPRequest):
            http_scope = self._http.pop(action.request_id, None)
            if http_scope is not None:
                http_scope.cancel()
        elif isinstance(action, FetchResult):
            self._on_fetch_result(action)
        elif isinstance(action, DrainComplete):
            self._drained.set()
            self._wake_readers()
        elif isinstance(action, ConsumerFailed):
            # Terminal: every connection is closed; whoever waits for messages raises it.
            self._failure = action.error
            self._logger.error(
                "consumer %s/%s failed, not retrying: %s", self.topic, self.channel, action.error
            )
            self._emit(action)
            self._drained.set()
            self._wake_readers()
        elif isinstance(action, ConnectionUp):
            self._log_for(action.address).info(
                "subscribed to %s/%s (max_rdy_count %d, msg_timeout %ds)",
                self.topic,
                self.channel,
                action.settings.max_rdy_count,
                action.settings.msg_timeout // 1000,
            )
            self._emit(action)
        elif isinstance(action, Disconnected):
            log = self._log_for(action.address)
            if action.error is not None:
                self._connection_errors += 1
                retry = (
                    f"; retrying in {action.reconnect_at - monotonic():.1f}s"
                    if action.reconnect_at is not None
                    else ""
                )
                log.warning("connection lost: %s%s", action.error, retry)
            else:
                log.info("connection closed")
            self._emit(action)
        elif isinstance(action, GiveUp):
            self._log_for(action.address).warning(
                "giving up on message %s after %d attempts (FIN'd)",
                action.message.id.decode(),
                action.message.attempts,
            )
            self._emit(action)
        elif isinstance(action, TakenBack):
            self._log_for(action.address).warning(
                "%s for message %s came too late: %s",
                action.command,
                action.message_id.decode() if action.message_id else "?",
                action.error,
            )
            self._emit(action)
        elif isinstance(action, LookupdFailed):
            self._log_for(action.lookupd).warning("lookupd query failed: %s", action.error)
            self._emit(action)
        else:  # pragma: no cover - a new action kind
            self._emit(action)

    def _on_fetch_result(self, result: FetchResult) -> None:
        slot = self._fetches.pop(result.request_id, None)
        if slot is None:  # its caller is gone (should not happen: fetch() cancels it)
            self._requeue_all(result.messages)
            return
        slot[1] = result
        slot[0].set()

    def _requeue_all(self, deliveries: Iterable[Deliver]) -> None:
        now = monotonic()
        for delivery in deliveries:
            self._coord.requeue(delivery, now, 0.0, backoff=False)
        self._kick()


def _default_signals() -> tuple[int, ...]:
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


@asynccontextmanager
async def drain_on_signals(
    consumer: Consumer, *signals: int, timeout: float | None = None
) -> AsyncIterator[None]:
    """Opt-in: while the block runs, SIGTERM/SIGHUP/SIGINT (or ``signals``) drain ``consumer``.

    ::

        async with Consumer(...) as c, drain_on_signals(c):
            await c.run(handler)        # returns once the drain finished
    """
    async with consumer.drain_on_signals(*signals, timeout=timeout):
        yield

"""The blocking consumer's IO side: the object its IO thread drives, and what it shares with
the user threads.

:class:`ConsumerIO` is owned by :class:`~transports.sync.consumer.Consumer` (composition: the
consumer's public surface is only what user code calls). It is the
:class:`~transports.sync._loop.IOLoop`'s owner, so everything in its ``on_*``, ``handle_timer``
and ``write_pending`` methods runs on the IO thread: connections, reads, timers, carrying out
the answers user threads posted (runs of FINs in one coordinator call), keepalive TOUCHes, and
the coordinator's actions (connections, lookupd requests, deliveries handed to user threads,
fetch results, logs and events), and pausing the reads of a connection while more messages
wait for user threads than ``max_in_flight``. What user threads touch is named below: the
``ready`` queue and its condition, the ``posted`` answers, the ``drained`` event, ``failure``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, TypeVar

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
from nsq_sansio.discovery import LookupdAddress, NSQDAddress
from nsq_sansio.errors import NSQError
from transports._common import ConsumerStats, TransportOptions
from transports._common.consumer_actions import ConsumerActions
from transports._common.failures import at_address
from transports._common.logs import fields
from transports._common.message import DeliveryHook, KeepaliveExpired, unanswered_of
from transports._common.reports import log_keepalive_expired

from ._dead_letter import DeadLetterPublisher
from ._loop import IOLoop, LoopSocket
from .message import (
    OP_FIN,
    OP_KEEPALIVE_OFF,
    OP_KEEPALIVE_ON,
    OP_REQ,
    OP_TOUCH,
    Message,
)

__all__ = ["ConsumerIO"]

_T = TypeVar("_T")

#: While a connection's reads are paused, how often the IO thread looks whether user threads
#: took enough messages to read it again (their answers wake it at once; taking a message
#: does not, so that the per-message path does not pay for the pause).
_RESUME_POLL = 0.02
_popleft = deque.popleft
_delivery_of = attrgetter("_delivery")


class HTTPKey:
    """Loop key of a lookupd request's socket."""

    __slots__ = ("data", "lookupd", "request_id")

    def __init__(self, request_id: int, lookupd: LookupdAddress, data: bytes) -> None:
        self.request_id = request_id
        self.lookupd = lookupd
        self.data = data


class Keepalive:
    """A message under ``keepalive()``: inactive once it was answered or the block ended."""

    __slots__ = ("active", "message")

    def __init__(self, message: Message) -> None:
        self.message = message
        self.active = True


class ConsumerIO:
    """The IO thread's side of one blocking consumer (and the queues it shares with user
    threads). Not thread-safe except where a method says so: it runs on the IO thread.

    It is the :class:`~transports._common.consumer_actions.ConsumerRuntime` of its
    :class:`~transports._common.consumer_actions.ConsumerActions`: the core's actions are
    decided there; what touches sockets and user threads is here."""

    def __init__(
        self,
        coordinator: ConsumerCoordinator,
        config: Config,
        options: TransportOptions,
        *,
        logger: logging.Logger,
        on_event: Callable[[object], None] | None,
    ) -> None:
        self.coordinator = coordinator
        self.topic = coordinator.topic
        self.channel = coordinator.channel
        self.config = config
        self.options = options
        self.logger = logger
        #: What the core's actions mean, decided once for every runtime; IO is ours.
        self.actions = ConsumerActions(coordinator, self, logger=logger, on_event=on_event)
        self.ssl_context = options.ssl_context() if config.tls_v1 else None
        self.loop = IOLoop(self, name=f"nsq-sync-consumer-{self.topic}/{self.channel}")
        self.links: dict[int, LoopSocket] = {}  # by conn_id
        self.http: dict[int, LoopSocket] = {}  # lookupd requests, by request_id
        #: Deliveries waiting for user code, and the condition user threads sleep on.
        self.ready: deque[Message] = deque()
        self.cond = threading.Condition(threading.Lock())
        self.sleepers = 0
        #: Answers from user code, taken by the IO thread: a Message is its FIN, anything
        #: else an (op, message, argument) tuple.
        self.posted: deque[Message | tuple[int, Message, Any]] = deque()
        #: OpenTelemetry's hook (``transports.otel``): None unless the consumer is instrumented.
        self.telemetry: DeliveryHook | None = None
        #: Messages handed to user code and not answered yet (IO thread only).
        self.unanswered: set[Message] = set()
        self.keepalives: list[tuple[float, int, Keepalive]] = []
        self.keepalive_of: dict[Message, Keepalive] = {}
        self.seq = itertools.count()
        self.fetches: dict[int, Future[list[Message]]] = {}
        self.draining = False
        self.drained = threading.Event()
        #: Connections whose reads are paused, and when each must be read again at the latest.
        self.paused: dict[LoopSocket, float] = {}
        self.resume_check_at = 0.0
        #: The error the consumer failed with (ConsumerFailed: nsqd refused the
        #: configuration); raised by iteration, get(), run(), fetch(), and at exit if unseen.
        self.failure: NSQError | None = None
        #: run()'s handlers under way: their message -> the thread's ident (written by the
        #: worker threads, read here: a thread cannot be cancelled, so the drain reports them),
        #: and the workers' names by ident.
        self.handlers: dict[Message, int] = {}
        self.worker_names: dict[int, str] = {}
        #: The drain (set by the thread that asks for it): when its deadline passes (monotonic)
        #: and its timeout; what its deadline took back, and the handlers already reported.
        self.drain_ends = math.inf
        self.drain_timeout = 0.0
        self.reported_running: set[Message] = set()
        self._dead_letters: DeadLetterPublisher | None = None
        #: True once the IO thread has ended (the consumer drained or closed): an answer
        #: posted then is carried out by the thread that gives it (:meth:`answer_stopped`),
        #: one thread at a time (re-entrant: ``on_event`` may answer from its report).
        self.stopped = False
        self.stopped_lock = threading.RLock()
        self.loop.on_exit = self.loop_ended

    @property
    def dead_letters(self) -> DeadLetterPublisher | None:
        """Publishes DeadLetter actions (None: the consumer has no dead-letter topic)."""
        return self._dead_letters

    @dead_letters.setter
    def dead_letters(self, publisher: DeadLetterPublisher | None) -> None:
        self._dead_letters = self.actions.dead_letters = publisher

    @property
    def drain_held(self) -> list[bytes]:
        """The ids of the messages the drain's deadline requeued."""
        return self.actions.drain_held

    # --- any thread ----------------------------------------------------------------------------

    def call(self, fn: Callable[[], _T]) -> Future[_T]:
        """Run ``fn()`` on the IO thread; its result or exception goes to the future (an
        exception is also logged): an action asked by user code never kills the IO thread."""
        future: Future[_T] = Future()

        def run() -> None:
            try:
                result = fn()
            except Exception as exc:
                self.logger.exception(
                    "consumer action %r failed on the IO thread",
                    fn,
                    extra=fields(topic=self.topic, channel=self.channel, error=exc),
                )
                future.set_exception(exc)
            else:
                future.set_result(result)

        self.loop.call_soon(run)
        return future

    def post(self, op: int, message: Message, arg: Any) -> None:
        """An answer other than FIN, from a user thread (thread-safe)."""
        self.posted.append((op, message, arg))
        self.loop.wake()
        if self.stopped:
            self.answer_stopped()

    def answer_stopped(self) -> None:
        """The IO thread has ended: carry out the answers posted, here (thread-safe). Each is
        too late (the drain requeued its message, or its connection closed): it is reported
        as ``TakenBack``, logged and given to ``on_event`` from this thread, as on a running
        consumer."""
        with self.stopped_lock:
            if self.posted:
                self.take_answers(time.monotonic())
            actions = self.coordinator.take_actions()
            if actions:
                self.actions.after_stop(actions)

    def stop(self) -> None:
        """The consumer is over: stop the IO thread (joined, unless this is it); once it has
        ended, answers are carried out where they are given (:meth:`loop_ended`)."""
        self.loop.stop()

    def loop_ended(self) -> None:
        """The IO thread's last step, however its loop ended (stopped from another thread or
        from its own, in ``on_event``; or crashed): from now on an answer is carried out by
        the thread that gives it, and those posted meanwhile are carried out here."""
        self.stopped = True
        self.answer_stopped()

    def wake_users(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def finish_many(self, messages: Iterable[Message]) -> int:
        """:meth:`Consumer.finish_many <transports.sync.consumer.Consumer.finish_many>`, from a
        user thread: the batch is posted in one step, with one wake-up."""
        fresh = unanswered_of(self, Message, messages)
        if not fresh:
            return 0
        for message in fresh:
            message.answered = True
        self.posted.extend(fresh)  # bare messages are FINs (see message.py)
        loop = self.loop
        if not loop._wake_pending:
            loop.wake()
        if self.stopped:
            self.answer_stopped()
        return len(fresh)

    # --- the IO loop's callbacks ------------------------------------------------------------

    def on_connected(self, link: LoopSocket, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            self.coordinator.connection_made(key, now)
        elif isinstance(key, HTTPKey):
            if key.lookupd.tls:
                context = self.ssl_context or self.options.ssl_context()
                hostname = self.options.tls.server_hostname(key.lookupd.host)
                self.loop.start_tls(link, context, hostname, b"")
            self.loop.write(link, key.data)

    def on_data(self, link: LoopSocket, data: bytes, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            if self.posted:
                # FINs user code gave since the last write go out before this read is
                # decoded: nsqd holds at most max_in_flight un-FIN'd messages, so every FIN
                # sent sooner is a message it can send sooner.
                self.write_pending()
            self.coordinator.receive_data(key, data, now)
            self.pump(now)
            if len(self.ready) > self.coordinator.max_in_flight and data:
                self.pause_reading(link, key, now)
            return
        if isinstance(key, HTTPKey):
            self.coordinator.http_data(key.request_id, data, now)
        self.pump(now)

    def pause_reading(self, link: LoopSocket, conn_id: int, now: float) -> None:
        """More messages wait for user threads than ``max_in_flight``: stop reading ``link``
        until they are no more than that, or until the core's ``read_pause_limit`` passed
        (heartbeats must be answered), whichever comes first (:meth:`check_paused`). Checked
        once per read: a peer that ignores RDY is read no faster than user code takes
        messages, but for one read (within the RDY bound) per pause."""
        limit = self.coordinator.read_pause_limit(conn_id)
        if limit is None or link.closed:  # not subscribed: a handshake is never held up
            return
        self.loop.pause_reading(link)
        self.paused[link] = now + limit
        self.resume_check_at = now + _RESUME_POLL

    def check_paused(self, now: float | None) -> None:
        """Read the paused connections again where the pause is over (``now`` None: only
        if the messages waiting dropped)."""
        room = len(self.ready) <= self.coordinator.max_in_flight
        if not room and now is None:
            return
        for link, resume_at in list(self.paused.items()):
            if room or link.closed or (now is not None and now >= resume_at):
                del self.paused[link]
                self.loop.resume_reading(link)
        if now is not None:
            self.resume_check_at = now + _RESUME_POLL

    def on_link_error(self, link: LoopSocket, error: BaseException, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            if link.connecting and not isinstance(error, NSQError):
                # The connect failed: said as on every runtime (``host:port: why``).
                error = at_address(link.address, error)
            self.coordinator.connection_failed(key, error, now)
        elif isinstance(key, HTTPKey):
            self.http.pop(key.request_id, None)
            self.coordinator.http_failed(key.request_id, error, now)
        self.pump(now)

    def on_tls_established(self, link: LoopSocket, now: float) -> None:
        if isinstance(link.key, int):
            self.coordinator.tls_established(link.key, now)

    def next_deadline(self) -> float | None:
        deadline = self.coordinator.next_deadline()
        if self.keepalives:
            first = self.keepalives[0][0]
            deadline = first if deadline is None else min(deadline, first)
        if self.paused:
            check = self.resume_check_at
            deadline = check if deadline is None else min(deadline, check)
        return deadline

    def handle_timer(self, now: float) -> None:
        coordinator = self.coordinator
        deadline = coordinator.next_deadline()
        if deadline is not None and now >= deadline:
            coordinator.handle_timer(now)
        heap = self.keepalives
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            if entry.active:
                self.keepalive_tick(entry, now)
        if self.paused and now >= self.resume_check_at:
            self.check_paused(now)
        self.pump(now)

    def write_pending(self) -> None:
        if self.posted:
            self.take_answers(time.monotonic())
        self.pump(None)
        if self.paused:
            self.check_paused(None)
        links = self.links
        loop = self.loop
        for conn_id, data in self.coordinator.pending_data():
            link = links.get(conn_id)
            if link is not None:
                loop.write(link, data)

    # --- answers from user code ------------------------------------------------------------

    def take_answers(self, now: float) -> None:
        """Carry out the answers user code posted, in order; runs of FINs in one
        :meth:`ConsumerCoordinator.finish_many` call."""
        posted = self.posted
        while posted:
            # Only this thread pops, so len() items are there: taken without a Python loop.
            items = list(map(_popleft, repeat(posted, len(posted))))
            if all(map(is_, map(type, items), repeat(Message))):  # FINs only: the hot path
                self.finish_batch(items, now)  # type: ignore[arg-type]
                continue
            run: list[Message] = []
            for item in items:
                if type(item) is Message:
                    run.append(item)
                    continue
                if run:
                    self.finish_batch(run, now)
                    run = []
                op, message, arg = item  # type: ignore[misc]
                try:
                    self.answer(op, message, arg, now)
                except Exception:  # never fatal to the IO thread; the next answers still go
                    self.answer_failed(op, message)
            if run:
                self.finish_batch(run, now)

    def finish_batch(self, messages: list[Message], now: float) -> None:
        """FIN ``messages`` (answered by user code, in that order) in one coordinator call;
        those no longer ours are marked taken back (the coordinator reported them)."""
        refused: list[Deliver] = []
        try:
            self.coordinator.finish_many(list(map(_delivery_of, messages)), now, refused=refused)
        except Exception:  # a bug: never fatal to the IO thread (see answer_failed)
            self.logger.exception(
                "FIN of %d messages failed on the IO thread",
                len(messages),
                extra=fields(topic=self.topic, channel=self.channel, count=len(messages)),
            )
            deadline = self.coordinator.deadline
            for message in messages:
                if deadline(message._delivery) is not None:  # still ours: may be answered again
                    message.answered = False
                else:
                    self.unanswered.discard(message)
            return
        self.unanswered.difference_update(messages)
        if refused:
            late = set(map(id, refused))
            for message in messages:
                if id(message._delivery) in late:
                    message._taken_back = True
        if self.keepalive_of:
            for message in messages:
                self.stop_keepalive(message)

    def answer(self, op: int, message: Message, arg: Any, now: float) -> None:
        """One answer other than FIN (REQ, TOUCH, keepalive on/off)."""
        coordinator = self.coordinator
        delivery = message._delivery
        if op == OP_REQ:
            self.unanswered.discard(message)
            delay, backoff = arg
            if not coordinator.requeue(delivery, now, delay, backoff=backoff):
                message._taken_back = True
            self.stop_keepalive(message)
        elif op == OP_TOUCH:
            if coordinator.touch(delivery, now) is None:
                message._taken_back = True
        elif op == OP_KEEPALIVE_ON:
            if message not in self.keepalive_of and not message.answered:
                entry = Keepalive(message)
                self.keepalive_of[message] = entry
                self.keepalive_tick(entry, now)
        elif op == OP_KEEPALIVE_OFF:
            self.stop_keepalive(message)

    def answer_failed(self, op: int, message: Message | None) -> None:
        """An answer from user code raised on the IO thread (arguments are checked in the
        caller, so this is a bug): log it; a message still ours can be answered again."""
        self.logger.exception(
            "answer %d for %r failed on the IO thread",
            op,
            message,
            extra=fields(
                topic=self.topic,
                channel=self.channel,
                message_id=None if message is None else message.id,
            ),
        )
        if message is None or op not in (OP_FIN, OP_REQ):
            return
        if self.coordinator.deadline(message._delivery) is not None:
            message.answered = False
            self.unanswered.add(message)

    def stop_keepalive(self, message: Message) -> None:
        entry = self.keepalive_of.pop(message, None)
        if entry is not None:
            entry.active = False

    def keepalive_tick(self, entry: Keepalive, now: float) -> None:
        """TOUCH when the core says (:meth:`ConsumerCoordinator.next_touch`, half-way to the
        deadline) and plan the next tick; once TOUCH cannot extend it, say so and stop."""
        message = entry.message
        delivery = message._delivery
        coordinator = self.coordinator
        limit = coordinator.max_deadline(delivery)
        if limit is None:
            message._taken_back = True
            self.stop_keepalive(message)
            return
        touch_at = coordinator.next_touch(delivery)
        if touch_at is not None and now >= touch_at:
            if coordinator.touch(delivery, now) is None:
                message._taken_back = True
                self.stop_keepalive(message)
                return
            touch_at = coordinator.next_touch(delivery)
        if touch_at is not None:
            heapq.heappush(self.keepalives, (touch_at, next(self.seq), entry))
            return
        # TOUCH cannot extend it any more: say so now, while there is time to answer it.
        if not message._expiring:
            message._expiring = True
            event = KeepaliveExpired(delivery.id, delivery.address, limit)
            log_keepalive_expired(self.logger, event, now, topic=self.topic, channel=self.channel)
            self.emit(event)
        self.stop_keepalive(message)

    # --- drain ------------------------------------------------------------------------------

    def begin_drain(self, timeout: float | None) -> None:
        now = time.monotonic()
        if self.posted:  # answers given before the drain was asked go first
            self.take_answers(now)
        if self.coordinator.state is ConsumerState.DRAINING:  # a sooner deadline, maybe now
            self.coordinator.drain(now, timeout)
            self.pump(now)
            return
        # Messages still queued for user code were never seen: drain requeues them at once.
        # Those user code took (popped concurrently included) get until the deadline.
        popped: list[Message] = []
        ready = self.ready
        while ready:
            try:
                message = ready.popleft()
            except IndexError:
                break
            self.unanswered.discard(message)
            popped.append(message)
        try:
            self.coordinator.drain(now, timeout, unseen=[m._delivery for m in popped])
        except Exception:  # refused (the caller checked the timeout): nothing was drained
            self.unanswered.update(popped)
            with self.cond:
                ready.extendleft(reversed(popped))
            self.draining = False
            raise
        self.pump(now)

    # --- stats ----------------------------------------------------------------------------------

    def snapshot(self) -> ConsumerStats:
        """The consumer's figures (on the IO thread: from one instant; elsewhere each figure
        is read in one step, so it never raises)."""
        if self.loop.in_loop_thread() and self.posted:
            self.take_answers(time.monotonic())
        links = list(self.links.items())  # one C-level copy: the IO thread may change it
        return self.actions.stats(
            (conn_id, link.address, link.bytes_in, link.bytes_out) for conn_id, link in links
        )

    # --- the coordinator's actions ------------------------------------------------------------

    def pump(self, now: float | None) -> None:
        """Carry out everything the coordinator decided; its messages go to user threads."""
        actions = self.coordinator.take_actions()
        if not actions:
            return
        deliveries = self.actions.split(actions)
        if not deliveries:
            return
        delivered = list(map(Message, repeat(self), deliveries))
        self.unanswered.update(delivered)
        # Under the lock a user thread checks the queue with before it sleeps: no lost
        # wake-up (one lock per batch read from the socket, not per message).
        with self.cond:
            self.ready.extend(delivered)
            if self.sleepers:
                self.cond.notify(len(delivered))

    def emit(self, event: object) -> None:
        self.actions.emit(event)

    # --- what the actions need of the IO thread (ConsumerRuntime) -----------------------------

    def open_connection(self, conn_id: int, address: NSQDAddress) -> None:
        link = self.loop.connect(conn_id, address.host, address.port, self.config.connect_timeout)
        if not link.closed:
            self.links[conn_id] = link

    def start_tls(self, conn_id: int, trailing: bytes) -> None:
        link = self.links.get(conn_id)
        if link is not None:
            context = self.ssl_context or self.options.ssl_context()
            self.loop.start_tls(
                link, context, self.options.tls.server_hostname(link.host), trailing
            )

    def close_connection(self, conn_id: int, final_data: bytes) -> None:
        link = self.links.pop(conn_id, None)
        if link is not None:
            if final_data:
                self.loop.write(link, final_data)
            self.loop.close_link_when_flushed(link)

    def connection_gone(self, action: Disconnected) -> None:
        link = self.links.pop(action.conn_id, None)
        if link is not None:
            self.loop.close_link(link)
        if action.unanswered:
            for message in list(self.unanswered):
                if message._delivery.conn_id == action.conn_id:
                    message._taken_back = True
                    self.unanswered.discard(message)
        if self.ready:
            self.forget_waiting(action.conn_id)

    def start_http(self, action: SendHTTPRequest) -> None:
        key = HTTPKey(action.request_id, action.lookupd, action.data)
        started = self.loop.connect(
            key, action.lookupd.host, action.lookupd.port, self.config.connect_timeout
        )
        if not started.closed:
            self.http[action.request_id] = started

    def close_http(self, request_id: int) -> None:
        link = self.http.pop(request_id, None)
        if link is not None:
            self.loop.close_link(link)

    def answer_fetch(self, result: FetchResult) -> bool:
        if result.reason is FetchEnd.FAILED and self.failure is None:
            self.failure = self.coordinator.failure  # before the caller wakes up
        future = self.fetches.pop(result.request_id, None)
        if future is None or future.done():  # nobody waits any more (timed out)
            return False
        messages = list(map(Message, repeat(self), result.messages))
        self.unanswered.update(messages)
        future.set_result(messages)
        return True

    def taken_back(self, delivery: Deliver) -> None:
        for message in self.unanswered:
            if message._delivery is delivery:
                message._taken_back = True
                break

    def stop_held(self, action: DrainTimedOut) -> tuple[tuple[bytes, ...], dict[bytes, str]]:
        """The drain's deadline requeued what user code still held: those messages are taken
        back; one still in a run() handler is answered for good (a thread cannot be
        cancelled: what its handler answers is ignored, not sent too late)."""
        held = {id(delivery) for delivery in action.messages}
        running: dict[bytes, str] = {}
        for message in list(self.unanswered):
            if id(message._delivery) not in held:
                continue
            message._taken_back = True
            self.unanswered.discard(message)
            self.stop_keepalive(message)
            thread = self.handlers.get(message)
            if thread is not None:
                message.answered = True
                running[message.id] = self.worker_names.get(thread, str(thread))
                self.reported_running.add(message)
        return (), running

    def failed(self, error: NSQError) -> None:
        self.failure = error

    def finished(self) -> None:
        self.finish_waits()

    def forget_waiting(self, conn_id: int) -> None:
        """A closed connection's messages not yet taken by user threads are dropped (nsqd
        requeues them; a user thread would only find them taken back), so that a peer
        refused and reconnected again and again cannot pile them up while user code takes
        none. User threads may pop meanwhile: each message goes to one taker only."""
        ready = self.ready
        if not any(message._delivery.conn_id == conn_id for message in list(ready)):
            return
        kept: list[Message] = []
        while ready:
            try:
                message = ready.popleft()
            except IndexError:
                break
            if message._delivery.conn_id != conn_id:
                kept.append(message)
        if kept:
            with self.cond:
                ready.extendleft(reversed(kept))
                if self.sleepers:
                    self.cond.notify(len(kept))

    def finish_waits(self) -> None:
        """The consumer is done (drained or failed): wake every waiting user call."""
        self.draining = True
        self.drained.set()
        for future in self.fetches.values():
            if not future.done():
                future.set_result([])
        self.fetches.clear()
        self.wake_users()

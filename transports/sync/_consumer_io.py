"""The blocking consumer's IO thread: what it does with sockets, answers and actions.

:class:`ConsumerIOThread` is a part of :class:`~transports.sync.consumer.Consumer` (its base
class) and everything in it runs on the IO thread: the :class:`~transports.sync._loop.IOLoop`
callbacks (connected, data, errors, timers, writes), carrying out the answers user threads
posted (runs of FINs in one coordinator call), keepalive TOUCHes, and the coordinator's
actions (connections, lookupd requests, deliveries handed to user threads, fetch results,
logs and events). The user-facing side (iteration, ``get``, ``run``, ``fetch``, drain, close,
stats) is in ``consumer.py``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from itertools import repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any

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
from nsq_sansio.errors import NSQError
from nsq_sansio.events import Message as CoreMessage
from transports._common import ConnectionLogger, TransportOptions
from transports._common.message import KeepaliveExpired

from ._loop import IOLoop, Link
from .message import (
    OP_FIN,
    OP_KEEPALIVE_OFF,
    OP_KEEPALIVE_ON,
    OP_REQ,
    OP_TOUCH,
    Message,
)

__all__ = ["KEEPALIVE_WARNING", "ConsumerIOThread"]

_log = logging.getLogger("nsq_sansio.sync.consumer")

#: keepalive() warns this long (at most) before max_msg_timeout takes the message back.
KEEPALIVE_WARNING = 5.0

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


class ConsumerIOThread:
    """The consumer's IO-thread side (a base class of ``Consumer``)."""

    # What it shares with the user-facing side (set by Consumer.__init__):
    topic: str
    channel: str
    _config: Config
    _options: TransportOptions
    _coordinator: ConsumerCoordinator
    _ssl_context: ssl.SSLContext | None
    _loop: IOLoop
    _links: dict[int, Link]
    _http: dict[int, Link]
    _loggers: dict[int, ConnectionLogger]
    _ready: deque[Message]
    _cond: threading.Condition
    _sleepers: int
    _posted: deque[Message | tuple[int, Message, Any]]
    _unanswered: set[Message]
    _keepalives: list[tuple[float, int, Keepalive]]
    _keepalive_of: dict[Message, Keepalive]
    _seq: itertools.count[int]
    _fetches: dict[int, Future[list[Message]]]
    _draining: bool
    _drained: threading.Event
    _counters: dict[str, int]
    _failure: NSQError | None
    _on_give_up: Callable[[CoreMessage], None] | None
    _on_event: Callable[[object], None] | None

    if TYPE_CHECKING:

        def _wake_users(self) -> None: ...

        def _post(self, op: int, message: Message, arg: Any) -> None: ...

    # --- LoopOwner -----------------------------------------------------------------

    def on_connected(self, link: Link, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            self._coordinator.connection_made(key, now)
        elif isinstance(key, HTTPKey):
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
        elif isinstance(key, HTTPKey):
            self._coordinator.http_data(key.request_id, data, now)
        self._pump(now)

    def on_link_error(self, link: Link, error: BaseException, now: float) -> None:
        key = link.key
        if isinstance(key, int):
            self._counters["connection_errors"] += 1
            self._coordinator.connection_failed(key, error, now)
        elif isinstance(key, HTTPKey):
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

    # --- internals -----------------------------------------------------------------

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
        if op == OP_REQ:
            self._unanswered.discard(message)
            delay, backoff = arg
            if not coordinator.requeue(delivery, now, delay, backoff=backoff):
                message.taken_back = True
            self._stop_keepalive(message)
        elif op == OP_TOUCH:
            if coordinator.touch(delivery, now) is None:
                message.taken_back = True
        elif op == OP_KEEPALIVE_ON:
            if message not in self._keepalive_of and not message.answered:
                entry = Keepalive(message)
                self._keepalive_of[message] = entry
                self._keepalive_tick(entry, now)
        elif op == OP_KEEPALIVE_OFF:
            self._stop_keepalive(message)

    def _answer_failed(self, op: int, message: Message | None) -> None:
        """An answer from user code raised on the IO thread (arguments are checked in the
        caller, so this is a bug): log it; a message still ours can be answered again."""
        _log.exception("answer %d for %r failed on the IO thread", op, message)
        if message is None or op not in (OP_FIN, OP_REQ):
            return
        if self._coordinator.deadline(message._delivery) is not None:
            message.answered = False
            self._unanswered.add(message)

    def _stop_keepalive(self, message: Message) -> None:
        entry = self._keepalive_of.pop(message, None)
        if entry is not None:
            entry.active = False

    def _keepalive_tick(self, entry: Keepalive, now: float) -> None:
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
            key = HTTPKey(action.request_id, action.lookupd, action.data)
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

"""What a consumer does with the core's actions, written once for every runtime.

Rules (the same on asyncio, trio and blocking):

* Messages (``Deliver``) go to user code in the order the core decided them; everything else
  is carried out as it comes, between them.
* ``Connect`` counts a reconnect when the address was connected before; ``Disconnected``
  with an error counts a connection error. Both figures are in :meth:`ConsumerActions.stats`.
* Every report (``ConnectionUp``, ``Disconnected``, ``GiveUp``, ``TakenBack``,
  ``BackoffChanged``, ``LookupdFailed``, ``NodeRefused``, ``TopicNotFound``,
  ``ConsumerFailed``) is logged, then given to ``on_event``; an exception ``on_event`` raises
  is logged and ignored. ``DrainTimedOut`` is logged once with what the runtime did about
  the handlers holding its messages, then given to ``on_event``.
* ``ConsumerFailed``: the error is kept (every waiting call raises it), then reported, then
  every waiting call is woken.
* A fetch's answer nobody waits for any more is requeued at once, without backoff.
* A ``DeadLetter`` goes to the dead-letter publisher (the core FINs or REQs it on its report).
* Once the runtime's IO is over (drained, closed or failed), an answer user code still gives
  is carried out where it is given (:meth:`ConsumerActions.after_stop`): reported as
  ``TakenBack`` like any late answer; nothing is connected, sent or delivered any more.

What touches sockets, tasks and threads is the runtime's: :class:`ConsumerRuntime` is what
:class:`ConsumerActions` calls. The per-message path (a read of messages only) costs one
check per batch, not per message.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import is_
from time import monotonic
from typing import Protocol

from nsq_sansio.consumer import (
    Action,
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConsumerCoordinator,
    ConsumerFailed,
    DeadLetter,
    Deliver,
    Disconnected,
    DrainComplete,
    DrainTimedOut,
    FetchEnd,
    FetchResult,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
)
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.errors import NSQError

from .logs import fields
from .reports import EventCallback, log_consumer_report, log_drain_timed_out, log_fetch_refused
from .stats import ConnectionStats, ConsumerStats

__all__ = ["ConsumerActions", "ConsumerRuntime", "DeadLetterSink", "SocketFigures"]

#: Actions that only a running runtime can carry out (see :meth:`ConsumerActions.after_stop`).
_NEEDS_IO = (
    Connect,
    CloseConnection,
    StartTLS,
    SendHTTPRequest,
    CloseHTTPRequest,
    Deliver,
    DeadLetter,
)

#: One open connection as the runtime sees it: (conn_id, address, bytes received, bytes sent).
SocketFigures = tuple[int, str, int, int]


class ConsumerRuntime(Protocol):
    """What a runtime does for :class:`ConsumerActions`: the IO and the waking, nothing else."""

    def open_connection(self, conn_id: int, address: NSQDAddress) -> None:
        """Connect to ``address`` and report to the core."""

    def start_tls(self, conn_id: int, trailing: bytes) -> None:
        """Upgrade the connection to TLS; ``trailing`` is what was read past the switch."""

    def close_connection(self, conn_id: int, final_data: bytes) -> None:
        """Write ``final_data`` (maybe empty) and close once it is flushed."""

    def connection_gone(self, action: Disconnected) -> None:
        """The core forgot the connection: forget its socket and the messages of it still
        waiting for user code (nsqd requeues them)."""

    def start_http(self, action: SendHTTPRequest) -> None:
        """Send a lookupd request; its answer goes to the core."""

    def close_http(self, request_id: int) -> None:
        """Stop a lookupd request (its answer is no longer wanted)."""

    def answer_fetch(self, result: FetchResult) -> bool:
        """Hand a fetch's answer to the call waiting for it; False when none waits."""

    def taken_back(self, delivery: Deliver) -> None:
        """nsqd no longer holds this copy: mark the handle user code has, if it is marked."""

    def stop_held(self, action: DrainTimedOut) -> tuple[Sequence[bytes], Mapping[bytes, str]]:
        """The drain's deadline requeued what user code holds: stop the work on it. Returns
        the ids of the messages of the ``run()`` handlers cancelled, and those left running
        (message id to thread name: a thread cannot be cancelled)."""

    def failed(self, error: NSQError) -> None:
        """The consumer failed for good: keep ``error`` for the waiting calls to raise, stop
        the handlers that can be stopped."""

    def finished(self) -> None:
        """The consumer is done (drained or failed): wake every waiting call."""

    @property
    def drain_timeout(self) -> float:
        """The drain's timeout in force (for the log of its deadline)."""


class DeadLetterSink(Protocol):
    """Publishes a message given up on to the dead-letter topic."""

    def submit(self, delivery: Deliver) -> None: ...


class ConsumerActions:
    """The core's actions carried out once for every runtime (see the module's rules)."""

    __slots__ = (
        "channel",
        "connection_errors",
        "connects",
        "coordinator",
        "dead_letters",
        "drain_held",
        "logger",
        "on_event",
        "reconnects",
        "runtime",
        "topic",
    )

    def __init__(
        self,
        coordinator: ConsumerCoordinator,
        runtime: ConsumerRuntime,
        *,
        logger: logging.Logger,
        on_event: EventCallback | None,
    ) -> None:
        self.coordinator = coordinator
        self.runtime = runtime
        self.topic = coordinator.topic
        self.channel = coordinator.channel
        self.logger = logger
        self.on_event = on_event
        #: Publishes DeadLetter actions (None: the consumer has no dead-letter topic).
        self.dead_letters: DeadLetterSink | None = None
        #: Connections made to each address (reconnects are the ones after the first).
        self.connects: Counter[str] = Counter()
        self.reconnects = 0
        self.connection_errors = 0
        #: The ids of the messages the drain's deadline requeued (``DrainResult.requeued``).
        self.drain_held: list[bytes] = []

    def split(self, actions: list[Action]) -> list[Deliver]:
        """Carry out ``actions`` (what the core's ``take_actions()`` returned: the runtime
        calls this only when there are some, so an idle pass costs nothing here); returns
        their messages for user code, in order (the list itself when it holds nothing else:
        no copy)."""
        if all(map(is_, map(type, actions), repeat(Deliver))):
            return actions  # type: ignore[return-value]
        deliveries: list[Deliver] = []
        for action in actions:
            if type(action) is Deliver:
                deliveries.append(action)
            else:
                self.act(action)
        return deliveries

    def act(self, action: object) -> None:
        """Carry out one action other than ``Deliver``."""
        runtime = self.runtime
        if isinstance(action, Connect):
            address = str(action.address)
            if self.connects[address]:
                self.reconnects += 1
            self.connects[address] += 1
            runtime.open_connection(action.conn_id, action.address)
        elif isinstance(action, CloseConnection):
            runtime.close_connection(action.conn_id, action.final_data)
        elif isinstance(action, StartTLS):
            runtime.start_tls(action.conn_id, action.trailing_data)
        elif isinstance(action, SendHTTPRequest):
            runtime.start_http(action)
        elif isinstance(action, CloseHTTPRequest):
            runtime.close_http(action.request_id)
        elif isinstance(action, FetchResult):
            self.fetch_answered(action)
        elif isinstance(action, TakenBack):
            self.report(action)
            # Only the copy the report is about: nsqd may have sent the same id again, and
            # the newer copy is still ours. A late answer's own handle was marked when the
            # answer was refused; a FIN/REQ nsqd refused names no handle still held.
            if action.delivery is not None:
                runtime.taken_back(action.delivery)
        elif isinstance(action, Disconnected):
            if action.error is not None:
                self.connection_errors += 1
            runtime.connection_gone(action)
            self.report(action)
        elif isinstance(action, DrainTimedOut):
            self.drain_timed_out(action)
        elif isinstance(action, DrainComplete):
            runtime.finished()
        elif isinstance(action, ConsumerFailed):
            # Terminal: every connection is closed (what was in flight requeued); whoever
            # waits for messages raises the error.
            runtime.failed(action.error)
            self.report(action)
            runtime.finished()
        elif isinstance(action, DeadLetter):
            if self.dead_letters is not None:
                self.dead_letters.submit(action.delivery)
        else:  # ConnectionUp, GiveUp, BackoffChanged, LookupdFailed...: logged and reported
            self.report(action)

    def after_stop(self, actions: list[Action]) -> None:
        """Carry out ``actions`` decided after the runtime's IO ended (the consumer drained,
        closed or failed: no task or IO thread takes the core's actions any more), by an answer
        user code gave late: the reports (its ``TakenBack``) are logged and given to
        ``on_event``, as while running; what needs IO is dropped (no socket is left, and nsqd
        requeues whatever it still held)."""
        for action in actions:
            if not isinstance(action, _NEEDS_IO):
                self.act(action)

    def fetch_answered(self, result: FetchResult) -> None:
        if result.reason is FetchEnd.TOO_MANY_WAITING:
            log_fetch_refused(self.logger, topic=self.topic, channel=self.channel)
        if not self.runtime.answer_fetch(result) and result.messages:
            # Nobody waits any more (its caller gave up): the messages go back at once.
            now = monotonic()
            requeue = self.coordinator.requeue
            for delivery in result.messages:
                requeue(delivery, now, 0.0, backoff=False)

    def drain_timed_out(self, action: DrainTimedOut) -> None:
        """The drain's deadline requeued what user code still held: the runtime stops the
        work on it; one log line says what was cut short, then ``on_event`` hears of it."""
        held = [delivery.id for delivery in action.messages]
        self.drain_held.extend(held)
        cancelled, running = self.runtime.stop_held(action)
        log_drain_timed_out(
            self.logger,
            timeout=self.runtime.drain_timeout,
            held=held,
            cancelled=cancelled,
            running=running,
            topic=self.topic,
            channel=self.channel,
        )
        self.emit(action)

    def report(self, action: object) -> None:
        """Log a report, then give it to ``on_event``."""
        log_consumer_report(
            self.logger, action, topic=self.topic, channel=self.channel, now=monotonic()
        )
        self.emit(action)

    def emit(self, event: object) -> None:
        """Give ``event`` to ``on_event``; what it raises is logged, never propagated."""
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                self.logger.exception(
                    "on_event callback failed for %r",
                    event,
                    extra=fields(topic=self.topic, channel=self.channel),
                )

    def stats(self, sockets: Iterable[SocketFigures]) -> ConsumerStats:
        """The snapshot: the core's figures, ours, and one entry per connection of
        ``sockets`` the core still has. Reads each figure in one step, so it may be called
        from another thread than the one driving the consumer (a metrics scrape)."""
        coordinator = self.coordinator
        connects = self.connects
        connections = []
        for conn_id, address, bytes_in, bytes_out in sockets:
            info = coordinator.link_info(conn_id)
            if info is None:
                continue  # the core is done with it; the runtime is closing the socket
            phase, rdy, in_flight = info
            connections.append(
                ConnectionStats(
                    address=address,
                    state=phase.value,
                    connected=phase.value == "subscribed",
                    rdy=rdy,
                    in_flight=in_flight,
                    reconnects=max(connects[address] - 1, 0),
                    bytes_received=bytes_in,
                    bytes_sent=bytes_out,
                )
            )
        counters = coordinator.stats
        return ConsumerStats(
            topic=self.topic,
            channel=self.channel,
            received=counters["received"],
            finished=counters["finished"],
            requeued=counters["requeued"],
            given_up=counters["given_up"],
            taken_back=counters["taken_back"],
            in_flight=coordinator.in_flight_count(),
            rdy=coordinator.total_rdy,
            max_in_flight=coordinator.max_in_flight,
            backoff_level=coordinator.backoff_level,
            backoff_phase=coordinator.backoff_phase.value,
            backoff_windows=coordinator.backoff_windows,
            reconnects=self.reconnects,
            connection_errors=self.connection_errors,
            connections=tuple(connections),
            paused=coordinator.max_in_flight == 0,
            topic_not_found=counters["topic_not_found"],
            dead_lettered=counters["dead_lettered"],
            dead_letter_failures=counters["dead_letter_failures"],
        )

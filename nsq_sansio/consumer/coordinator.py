"""The consumer coordinator (:class:`ConsumerCoordinator`): one façade over composed parts.

Rules:

* The façade owns the links (by id), the actions decided, the messages counted in and out,
  and the per-message paths (``receive_data``, ``finish``, ``finish_many``), which read
  :class:`~nsq_sansio.consumer.link.Link` fields directly for speed.
* Everything else is decided by a part that owns its fields and states its rules at the top
  of its module (:data:`PARTS`): the lifecycle table, the RDY ledger (the only writer of RDY
  and of the max_in_flight bound), the RDY targets, backoff, retries, pull mode, drain, the
  connections and lookupd, the answers. The façade composes them: its public methods hand
  each report or answer to the part that decides it.
* The consumer's state changes only through the lifecycle table
  (:mod:`~nsq_sansio.consumer.lifecycle`).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import groupby, repeat
from operator import is_, itemgetter
from typing import cast

from ..backoff import BackoffPhase, Outcome
from ..config import Config
from ..connection import ConnectionState
from ..discovery import LookupdAddress, NSQDAddress, NSQDFilter
from ..errors import ConfigError, LocalProtocolError, NSQError
from ..names import validate_channel, validate_topic
from .actions import (
    DELIVER_ATTEMPTS,
    DELIVER_CONN_ID,
    DELIVER_DEADLINE,
    DELIVER_ID,
    Action,
    Deliver,
    DrainComplete,
    FetchEnd,
)
from .answers import Answers
from .backoff_control import BackoffControl
from .connections import Connections, lookupd_poller
from .distribution import RdyDistribution
from .drain import Drain
from .fetches import FetchQueue
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle, LifecycleEvent
from .link import Link, LinkPhase, current_link, fin_before_setup
from .pull import PullMode
from .rdy import is_starved
from .retry import Retries

__all__ = ["PARTS", "ConsumerCoordinator"]

#: The parts the façade is composed of, in the order a reader meets them: (module, what it
#: owns). The one list (the package docstring and docs/architecture.md point here).
PARTS: tuple[tuple[str, str], ...] = (
    ("lifecycle", "the consumer's state and its transition table"),
    ("ledger", "RDY decided and written, totals, claims, settling, the max_in_flight bound"),
    ("distribution", "each connection's RDY target, the periodic check that moves scarce RDY"),
    ("backoff_control", "backoff's state machine, its RDY budget and test, what is reported"),
    ("retry", "requeue delays, the give-up rule, direct reconnects, pending dead letters"),
    ("pull", "pull mode: the fetch queue, allocation, rotation, expiry"),
    ("drain", "the drain deadline: give back, wait, CLS, close"),
    ("connections", "connections opened, set up, timed out, lost; lookupd answers; failure"),
    ("answers", "REQ, TOUCH, give-ups, dead letters, late answers, what an answer changes"),
)

_id: Callable[[Deliver], bytes] = itemgetter(DELIVER_ID)
_conn_id: Callable[[Deliver], int] = itemgetter(DELIVER_CONN_ID)
_deadline: Callable[[Deliver], float] = itemgetter(DELIVER_DEADLINE)
_attempts: Callable[[Deliver], int] = itemgetter(DELIVER_ATTEMPTS)


class _Counted:
    """A counter the façade shows and a part keeps (read-only here)."""

    def __init__(self, part: str) -> None:
        self.part = part

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, coordinator: object, owner: type | None = None) -> int:
        value: int = getattr(getattr(coordinator, self.part), self.name)
        return value


class ConsumerCoordinator:
    """Decides, for one topic/channel, what every nsqd connection sends and when.

    ``nsqd`` are direct addresses (retried with backoff), ``lookupd`` are polled for producers.
    ``rng`` makes every random choice (jitter, which connection gets RDY) replayable. ``pull``
    selects pull mode: messages only flow for :meth:`fetch` requests. ``nsqd_filter`` decides
    which addresses lookupd lists are connected to (all by default). ``dead_letter``: a
    message over ``max_attempts`` is not FIN'd here but handed to the transport as
    :class:`~nsq_sansio.consumer.actions.DeadLetter` to publish first.
    """

    requeued = _Counted("_answers")
    given_up = _Counted("_answers")
    taken_back = _Counted("_answers")
    dead_lettered = _Counted("_answers")
    dead_letter_failures = _Counted("_answers")
    #: lookupd answers that listed no nsqd for the topic (TopicNotFound says it once).
    topic_not_found = _Counted("_connections")

    def __init__(
        self,
        topic: str,
        channel: str,
        config: Config | None = None,
        *,
        rng: random.Random,
        nsqd: Iterable[str | NSQDAddress] = (),
        lookupd: Iterable[str | LookupdAddress] = (),
        pull: bool = False,
        nsqd_filter: NSQDFilter | None = None,
        dead_letter: bool = False,
    ) -> None:
        self.topic = validate_topic(topic)
        self.channel = validate_channel(channel)
        config = self._config = config if config is not None else Config()
        if config.heartbeat_interval is None:
            raise ConfigError(
                "heartbeat_interval=None: nsqd refuses SUB on a connection without heartbeats; "
                "allowed 1 <= heartbeat_interval <= 3600 (seconds) for a consumer"
            )
        self._pull = pull
        self._lifecycle = lifecycle = Lifecycle()
        self._retries = Retries(
            config, rng, [NSQDAddress.parse(a) for a in nsqd], dead_letter=dead_letter
        )
        poller = lookupd_poller([LookupdAddress.parse(a) for a in lookupd], self.topic, config, rng)
        if not self._retries.direct and poller is None:
            raise LocalProtocolError("a consumer needs at least one nsqd or lookupd address")
        if nsqd_filter is not None and not callable(nsqd_filter):
            raise ConfigError(
                f"nsqd_filter must be callable (NSQDAddress -> bool), got {nsqd_filter!r}"
            )
        self._links: dict[int, Link] = {}
        links = self._links
        self._actions: list[Action] = []
        #: Connections with something to write.
        self._dirty: set[int] = set()
        dirty = self._dirty
        self._ledger = ledger = RdyLedger(links, dirty, config.max_in_flight, self._recalm)
        self._backoff_control = BackoffControl(config)
        #: The backoff state machine (owned by the backoff part; read on the answer paths).
        self._backoff = self._backoff_control.backoff

        # Parts that call back into parts made after them do so through these.
        def rebalance(now: float, exclude: frozenset[int]) -> None:
            self._rdy.rebalance(now, exclude)

        def take_rdy_away(link: Link, now: float) -> None:
            self._rdy.take_away(link, now)

        def requeue_now(link: Link, delivery: Deliver) -> None:
            self._answers.requeue_now(link, delivery)

        def close(link: Link, now: float) -> None:
            self._connections.close(link, now)

        self._pull_mode = PullMode(
            config, rng, links, ledger, lifecycle, self._act, rebalance, requeue_now, take_rdy_away
        )
        self._drain = Drain(links, dirty, ledger, lifecycle, self._act, requeue_now, close)
        self._rdy = RdyDistribution(
            config,
            rng,
            links,
            ledger,
            lifecycle,
            self._backoff_control,
            self._pull_mode,
            self._act,
            self._recalm,
            pull=pull,
        )
        self._answers = Answers(
            config,
            links,
            dirty,
            ledger,
            lifecycle,
            self._backoff,
            self._retries,
            self._pull_mode,
            self._drain,
            self._rdy,
            self._act,
            pull=pull,
        )
        self._connections = Connections(
            self.topic,
            self.channel,
            config,
            links,
            dirty,
            poller,
            nsqd_filter,
            lifecycle=lifecycle,
            ledger=ledger,
            backoff=self._backoff,
            retries=self._retries,
            pull_mode=self._pull_mode,
            drain=self._drain,
            rdy=self._rdy,
            answers=self._answers,
            report=self._act,
            on_message=self._on_message,
            recalm=self._recalm,
            pull=pull,
        )
        #: True while running in push mode outside backoff and with no RDY settling: answers
        #: need no bookkeeping beyond the FIN itself (the hot path's test).
        self._calm = False
        #: The retry part's give-up limit, read by the per-message paths.
        self._max_attempts = self._retries.max_attempts
        self.received = 0
        self.finished = 0

    # --- the parts' fields, read by tests' invariants ------------------------------------------

    @property
    def _claimed(self) -> int:
        return self._ledger.claimed

    @property
    def _settling(self) -> set[int]:
        return self._ledger.settling

    @property
    def _fetches(self) -> FetchQueue:
        return self._pull_mode.fetches

    # --- introspection -------------------------------------------------------------------------
    # These only read (containers are copied in one C-level step before they are walked), so
    # a transport may call them from another thread (a metrics scrape) while its own thread
    # drives the coordinator: they never raise for that; a figure may be a moment old.

    @property
    def stats(self) -> dict[str, int]:
        """Counters: messages received, finished, requeued, given up, taken back; given up
        after a dead-letter publish (``dead_lettered``, also counted in ``given_up``), and
        dead-letter publishes that failed (each such message was requeued); lookupd answers
        that listed no nsqd for the topic (``topic_not_found``)."""
        return {
            "received": self.received,
            "finished": self.finished,
            "requeued": self.requeued,
            "given_up": self.given_up,
            "taken_back": self.taken_back,
            "topic_not_found": self.topic_not_found,
            "dead_lettered": self.dead_lettered,
            "dead_letter_failures": self.dead_letter_failures,
        }

    @property
    def state(self) -> ConsumerState:
        """Where the consumer is in its lifecycle (changed only by the lifecycle's table)."""
        return self._lifecycle.state

    @property
    def config(self) -> Config:
        """The configuration in use (``max_in_flight`` as last set)."""
        return self._config

    @property
    def failure(self) -> NSQError | None:
        """Why the consumer failed (state ``FAILED``), else None."""
        return self._connections.failure

    @property
    def max_in_flight(self) -> int:
        """The most messages held at once, over every connection."""
        return self._config.max_in_flight

    @property
    def total_rdy(self) -> int:
        """Sum of the last RDY sent on every connection (never above max_in_flight)."""
        return self._ledger.total

    @property
    def backoff_phase(self) -> BackoffPhase:
        """Backoff's phase: NORMAL, WAITING (a window: RDY 0) or TESTING."""
        return self._backoff.phase

    @property
    def backoff_level(self) -> int:
        """Backoff's level (0: no backoff); a window lasts ``multiplier * 2**level``, capped."""
        return self._backoff.level

    @property
    def backoff_allowance(self) -> int:
        """While backoff tests: the most messages the consumer may hold (what it held when
        the test began, one more, two more per success since); else 0."""
        return self._backoff.allowance

    @property
    def backoff_windows(self) -> int:
        """Backoff windows opened since the consumer started (a counter)."""
        return self._backoff.windows

    @property
    def dead_letters_pending(self) -> int:
        """How many DeadLetter actions wait for the transport's report."""
        return len(self._retries.dead_letters)

    def connection_ids(self) -> list[int]:
        """The ids of every connection the coordinator knows (connecting to closing)."""
        return list(self._links)

    def link_info(self, conn_id: int) -> tuple[LinkPhase, int, int] | None:
        """``(phase, last RDY sent, messages in flight)`` of a connection, or None."""
        link = self._links.get(conn_id)
        if link is None:
            return None
        return link.phase, link.rdy, max(link.held_count(), 0)

    def in_flight_count(self) -> int:
        """Messages in flight on every connection (handed out, not answered yet)."""
        return sum(max(link.held_count(), 0) for link in list(self._links.values()))

    def known_nodes(self) -> frozenset[NSQDAddress]:
        """nsqd addresses known from configuration and from lookupd (union)."""
        nodes = set(self._retries.direct)
        poller = self._connections.poller
        if poller is not None:
            nodes |= poller.known_nodes()
        return frozenset(nodes)

    def is_starved(self) -> bool:
        """The guide's is_starved: some connection holds >= 85% of its RDY in messages."""
        for link in self._links.values():
            if link.phase is LinkPhase.SUBSCRIBED and is_starved(link.held_count(), link.rdy):
                return True
        return False

    def deadline(self, delivery: Deliver) -> float | None:
        """When nsqd will time this message out (after TOUCHes), None if no longer ours."""
        return self._answers.deadline(delivery)

    def max_deadline(self, delivery: Deliver) -> float | None:
        """The furthest TOUCH can push the deadline (received + the server's max_msg_timeout)."""
        return self._answers.max_deadline(delivery)

    def next_touch(self, delivery: Deliver) -> float | None:
        """For long jobs: when to TOUCH next to keep the message, half-way to its
        deadline; None when it is no longer ours or TOUCH cannot extend it any more (the
        server's max_msg_timeout is reached: finish before :meth:`max_deadline`). The
        coordinator never touches by itself."""
        return self._answers.next_touch(delivery)

    def read_pause_limit(self, conn_id: int) -> float | None:
        """How long the transport may leave a subscribed connection unread, or None (not
        subscribed: never pause it). A transport stops reading while more messages wait for
        user code than ``max_in_flight``, and reads again once they are fewer, or after this.

        Half the shorter of the heartbeat interval and half nsqd's message timeout (and at
        least 0.25 s): heartbeats are answered before nsqd (after two intervals) or this side
        (after two and a half) give the connection up, and whatever nsqd sent during a pause
        is read well within the half message timeout after which the RDY bound counts a
        message as possibly timed out (so nsqd cannot have timed a message out and sent its
        replacement within one paused read: no false
        :class:`~nsq_sansio.errors.ReadyCountExceeded`)."""
        return self._connections.read_pause_limit(conn_id)

    # --- output and timers ---------------------------------------------------------------------

    def take_actions(self) -> list[Action]:
        """Everything decided since the last call, in order."""
        actions = self._actions
        self._actions = []
        return actions

    def data_to_send(self, conn_id: int) -> bytes:
        """Bytes to write on ``conn_id``."""
        return self._ledger.data_to_send(conn_id)

    def pending_data(self) -> list[tuple[int, bytes]]:
        """``(conn_id, bytes)`` for every connection with something to write, connections
        whose RDY was lowered first (write them in this order)."""
        return self._ledger.pending_data()

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must be called next (None: only on IO)."""
        candidates: list[float] = []
        state = self._lifecycle.state
        if state is ConsumerState.RUNNING:
            due = [
                self._backoff.deadline,
                self._ledger.next_settle(),
                self._retries.next_deadline(),
                self._rdy.next_deadline(),
            ]
            if self._connections.poller is not None:
                due.append(self._connections.poller.next_deadline())
            if self._pull:
                due.append(self._pull_mode.next_deadline())
            candidates += [at for at in due if at is not None]
        elif state is ConsumerState.DRAINING and self._drain.deadline is not None:
            candidates.append(self._drain.deadline)
        candidates += self._connections.next_deadline()
        return min(candidates) if candidates else None

    def handle_timer(self, now: float) -> None:
        """Do whatever is due at ``now``; call it when :meth:`next_deadline` passes."""
        self._connections.timers(now)
        state = self._lifecycle.state
        if state is ConsumerState.DRAINING:
            self._drain.due(now)
            return
        if state is not ConsumerState.RUNNING:
            return
        if self._backoff.handle_timer(now, self.in_flight_count()):
            self._rdy.backoff_moved(now)
        if self._ledger.settling and self._ledger.settle_due(now):
            self._rdy.grant_if_running(now)
        self._rdy.due(now)
        self._connections.discovery_due(now)
        if self._pull:
            self._pull_mode.due(now, self._rdy.subscribed())

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Connect to the configured nsqd and ask every lookupd (bootstrap)."""
        if self._lifecycle.state is not ConsumerState.CREATED:
            raise LocalProtocolError(f"start() in state {self._lifecycle.state.name}: call it once")
        self._lifecycle.apply(LifecycleEvent.START)
        self._recalm()
        self._rdy.start(now)
        self._connections.start(now)

    def drain(
        self, now: float, timeout: float | None = None, *, unseen: Iterable[Deliver] = ()
    ) -> None:
        """Graceful shutdown: stop the flow, give back what the user has not seen,
        wait for what the user holds (until ``timeout``, default ``config.drain_timeout``),
        then CLS every connection, wait for CLOSE_WAIT and close. Ends with DrainComplete.

        ``unseen``: deliveries the transport received but never handed to user code (still in
        its queue); they are requeued at once (REQ 0) so other consumers take them. Pull mode's
        own buffer is requeued the same way.

        Called again while draining, a ``timeout`` that ends sooner moves the deadline there
        (``0``: now, what the user holds is requeued at once); a later one changes nothing."""
        if timeout is not None and not (timeout >= 0 and math.isfinite(timeout)):
            raise LocalProtocolError(f"drain timeout must be >= 0 seconds, got {timeout!r}")
        state = self._lifecycle.state
        if state is ConsumerState.DRAINING:
            self._drain.shorten(now, timeout)
            return
        if state is ConsumerState.CLOSED or state is ConsumerState.FAILED:
            return  # FAILED: already closed, ConsumerFailed said so (no DrainComplete)
        self._lifecycle.apply(LifecycleEvent.DRAIN)
        if state is ConsumerState.CREATED:
            self._act(DrainComplete())
            return
        self._recalm()
        self._connections.stop_requests()
        if self._pull:
            self._pull_mode.end_all(FetchEnd.DRAINING, emptied=False)
        self._drain.begin(now, now + (self._config.drain_timeout if timeout is None else timeout))
        self._pull_mode.flush(None)
        self._drain.give_back(now, unseen, only_seen=self._answers.explicit_delivery)

    # --- transport -> coordinator: connections -------------------------------------------------

    def connection_made(self, conn_id: int, now: float) -> None:
        """TCP is up for ``conn_id``: IDENTIFY is queued (see pending_data)."""
        self._connections.made(conn_id, now)

    def connection_failed(
        self, conn_id: int, error: BaseException | str | None, now: float
    ) -> None:
        """Connecting failed, or the socket broke (reset, IO error, TLS failure)."""
        self._connections.failed(conn_id, error, now)

    def tls_established(self, conn_id: int, now: float) -> None:
        """The TLS handshake asked by :class:`StartTLS` succeeded."""
        self._connections.tls_established(conn_id)

    # --- transport -> coordinator: lookupd -----------------------------------------------------

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Raw bytes of a lookupd answer (``b""`` at EOF), parsed with h11."""
        poller = self._connections.poller
        if poller is not None:
            self._connections.on_lookup(request_id, poller.receive_data(request_id, data), now)

    def http_response(self, request_id: int, status: int, body: bytes, now: float) -> None:
        """A lookupd answer already parsed by the transport's own HTTP client."""
        poller = self._connections.poller
        if poller is not None:
            outcome = poller.receive_response(request_id, status, body)
            self._connections.on_lookup(request_id, outcome, now)

    def http_failed(self, request_id: int, error: BaseException | str, now: float) -> None:
        """The lookupd request could not be made (connect refused, reset, TLS...)."""
        poller = self._connections.poller
        if poller is not None:
            self._connections.on_lookup(request_id, poller.fail(request_id, error), now)

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once."""
        self._config = self._config.replace(max_in_flight=max_in_flight)
        self._ledger.max_in_flight = self._config.max_in_flight
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._rdy.rebalance(now)

    def _recalm(self) -> None:
        self._calm = (
            self._lifecycle.state is ConsumerState.RUNNING
            and not self._pull
            and self._backoff.phase is BackoffPhase.NORMAL
            and not self._ledger.settling
        )

    # --- pull mode -----------------------------------------------------------------------------

    def fetch(
        self,
        batch: int,
        now: float,
        *,
        expires: float | None = None,
        no_wait: bool = False,
    ) -> int:
        """Pull mode: ask for up to ``batch`` messages; returns the request id its
        :class:`FetchResult` will carry. ``expires`` (seconds) ends the wait with what arrived;
        ``no_wait`` answers at once with what is buffered."""
        if not self._pull:
            raise LocalProtocolError("fetch() needs a coordinator created with pull=True")
        return self._pull_mode.fetch(batch, now, expires, no_wait)

    def cancel_fetch(self, request_id: int, now: float) -> None:
        """The caller gave up on fetch ``request_id`` (cancelled, timed out on its side).

        The request stops waiting, and whatever it had gathered (even an answer still queued
        in :meth:`take_actions`) goes back to the front of the hold buffer for the next fetch,
        so a cancelled fetch never swallows messages. Unknown or finished ids are ignored."""
        self._pull_mode.cancel(request_id, now, self._actions)

    def give_back(self, deliveries: Sequence[Deliver], now: float) -> None:
        """A fetch answer the caller never saw (cancelled just as it was answered): its
        messages go back to the front of the hold buffer for the next fetch, as those of a
        request cancelled while waiting do, not back to nsqd (which would count another
        attempt). Messages no longer ours are skipped; once the consumer is draining or
        closed they are requeued (REQ 0) instead."""
        self._pull_mode.give_back(deliveries, now)

    def _pull_receive(self, link: Link, deliveries: list[Deliver], now: float) -> None:
        """A read of fresh messages in pull mode (the checks are the caller's): tracked by
        position as in push mode, then handed to the waiting fetches as one batch."""
        link.track_read(deliveries, now)
        self.received += len(deliveries)
        self._pull_mode.on_messages(link, deliveries, now)

    # --- transport -> coordinator: reading -----------------------------------------------------

    def receive_data(self, conn_id: int, data: bytes, now: float) -> None:
        """Bytes read from ``conn_id`` (``b""`` at EOF). Never raises on what nsqd sent."""
        link = self._links.get(conn_id)
        if link is None or link.proto is None:
            return
        proto = link.proto
        held = proto.in_flight_count
        # Message frames come as Deliver handles, built by the decoder.
        events = proto._receive_as(Deliver, conn_id, link.address, data, now, link.msg_timeout)
        self._dirty.add(conn_id)
        if not events:
            return
        if proto.state is ConnectionState.CLOSED:
            # The batch ends with ConnectionClosed: nothing before it can be answered any more
            # (nsqd requeues those messages), and no command may be sent.
            self._connections.close_from_events(link, events, now)
            return
        if now + link.msg_timeout < link.live_floor:  # what this read brings expires then
            link.live_floor = now + link.msg_timeout
        after = proto.in_flight_count
        calm = self._calm  # for this read: taking late messages in below does not change it
        if (
            after > link.claim
            and link.accepting
            and not self._ledger.take_late(
                link,
                sum(type(e) is Deliver for e in events),
                now,
                may_grow=self._lifecycle.state is ConsumerState.RUNNING,
            )
        ):
            # More than this connection may hold: nsqd sent under an RDY it had not read as
            # lowered yet. One by one: what still fits is delivered, the rest handed back.
            self._one_by_one(link, events, now)
            return
        if not (link.accepting and calm):
            if (
                self._pull
                and link.accepting
                and after - held == len(events)
                and (not self._max_attempts or max(map(_attempts, events)) <= self._max_attempts)
            ):
                # Pull mode's hot path: a read of messages only, each new to this connection
                # and under max_attempts (as push mode's below), handed on as one batch.
                self._pull_receive(link, cast("list[Deliver]", events), now)
                return
            self._one_by_one(link, events, now)
            return
        count = len(events)
        max_attempts = self._max_attempts
        deliveries = cast("list[Deliver]", events)  # if the test below passes
        if after - held == count and (
            not max_attempts or max(map(_attempts, deliveries)) <= max_attempts
        ):
            # The hot path: a subscribed push connection outside backoff and drain, and a read
            # of messages only. The connection's in-flight set grew by one per event, so every
            # event is a Deliver with an id new to this connection (none is held here: what is
            # tracked is in flight there), and none is over max_attempts. No per-message
            # Python loop: the decoder built the handles; the read's list is the actions and
            # the tracking.
            self._actions += deliveries
            link.track_read(deliveries, now)  # tracked from here, by position (see Link)
            self.received += count
            self._rdy.after_messages(link, now)
            return
        # Mixed reads (a heartbeat, a message sent again, one over max_attempts), one by one.
        tracked = link.tracked
        append = self._actions.append
        attempts_limit = self._max_attempts or 0xFFFF
        setdefault = tracked.setdefault
        count = 0
        for event in events:
            if type(event) is Deliver:
                if event[DELIVER_ATTEMPTS] > attempts_limit:
                    self._on_message(link, event, now)
                    continue
                if setdefault(event[DELIVER_ID], event) is not event:  # nsqd resent a held id
                    self._on_message(link, event, now)
                    continue
                append(event)
                count += 1
            else:
                self._connections.on_event(link, event, now)
                if link.conn_id not in self._links:
                    break
        if count:
            self.received += count
            link.remaining -= count
            link.last_message_at = now
            self._rdy.after_messages(link, now)

    def _on_message(self, link: Link, delivery: Deliver, now: float) -> None:
        """One message arrived on ``link`` (every case; the answers part decides)."""
        self.received += 1
        self._answers.on_message(link, delivery, now)

    def _one_by_one(self, link: Link, events: list[object], now: float) -> None:
        """A read's events, each on its own (every case the fast paths leave)."""
        for event in events:
            if type(event) is Deliver:
                self._on_message(link, event, now)
            else:
                self._connections.on_event(link, event, now)
                if link.conn_id not in self._links:
                    return

    # --- the user's answers --------------------------------------------------------------------

    def mark_delivered(self, delivery: Deliver) -> None:
        """The transport handed ``delivery`` to user code. Optional: a transport that calls it
        for every delivery lets drain requeue the unmarked ones at once (the alternative is
        ``drain(unseen=...)``); without it, every Deliver counts as handed over."""
        link = current_link(self._links, delivery)
        if link is not None:
            if not self._answers.explicit_delivery:
                self._answers.explicit_delivery = True
                self._pull_mode.mark_seen = True
            link.marks = True
            link.seen.add(delivery.id)

    def finish(self, delivery: Deliver, now: float) -> bool:
        """FIN: the message was handled. False (and a TakenBack) if it was no longer ours."""
        try:
            link = self._links[delivery[DELIVER_CONN_ID]]
        except KeyError:  # its connection is gone
            self._answers.report_gone(delivery, "FIN")
            return False
        message_id = delivery[DELIVER_ID]
        queue = link.queue
        head = link.head
        if queue and queue[head] is delivery:  # answered in delivery order
            head += 1
            if head == len(queue):
                queue.clear()
                head = 0
            link.head = head
        else:
            tracked = link.tracked
            current = tracked.pop(message_id, None)
            if current is not delivery:  # answered, taken back, or delivered again
                if current is not None:  # a newer delivery of that id: keep it
                    tracked[message_id] = current
                self._answers.report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._answers.report_gone(delivery, "FIN")
            return False
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += 1
        if link.marks:
            link.touched.pop(message_id, None)
            link.seen.discard(message_id)
        if not self._calm:
            self._answers.after_answer(link, Outcome.SUCCESS, now, delivery)
        return True

    def finish_many(
        self,
        deliveries: Iterable[Deliver],
        now: float,
        *,
        refused: list[Deliver] | None = None,
    ) -> int:
        """FIN every delivery, in order: the same as :meth:`finish` on each, for a transport
        that collects its users' answers (one call, one lookup per run of deliveries from the
        same connection; deliveries answered in the order they arrived are checked by position,
        with no dict work). Returns how many were FIN'd; each of the others was no longer ours
        and gave a TakenBack, exactly as :meth:`finish` would, and is appended to ``refused``
        when given (so a transport can tell which of its handles came too late)."""
        finish = self.finish
        if not self._calm:  # backoff, drain, pull or settling: answers have consequences
            if (
                self._lifecycle.state is ConsumerState.RUNNING
                and self._backoff.phase is BackoffPhase.NORMAL
            ):
                # Pull mode, or a lowered RDY settling: each FIN frees budget, but none
                # changes backoff, so the budget is recounted once for the whole batch.
                return self._finish_many_running(deliveries, now, refused)
            if refused is None:
                return sum([finish(delivery, now) for delivery in deliveries])
            done = 0
            for delivery in deliveries:
                if finish(delivery, now):
                    done += 1
                else:
                    refused.append(delivery)
            return done
        # Outside backoff a FIN only forgets the message: no per-answer decision to make.
        # Deliveries answered in the order they came are checked against the link's queue.
        links = self._links
        bulk = 0
        if type(deliveries) is list and deliveries:
            used, bulk = self._finish_in_order(deliveries, refused)  # all, or a first part
            if used == len(deliveries):
                return bulk
            if used:
                deliveries = deliveries[used:]
        done = 0  # FIN'd here; finish() counts its own
        others = 0
        conn_id = 0  # connection ids start at 1
        link: Link | None = None
        queue: list[Deliver] = []
        head = size = 0
        send_fin: Callable[[bytes], None] = fin_before_setup
        for delivery in deliveries:
            if delivery[DELIVER_CONN_ID] != conn_id:
                if link is not None:
                    self._queue_answered(link, head)
                conn_id = delivery[DELIVER_CONN_ID]
                link = links.get(conn_id)
                if link is not None and link.marks:
                    link = None  # touched/seen to clean up: one by one
                if link is None:
                    queue, head, size = [], 0, 0
                else:
                    queue = link.queue
                    head = link.head
                    size = len(queue)
                    send_fin = link.send_fin
                    if not link.dirty:
                        link.dirty = True
                        self._dirty.add(conn_id)
            if head < size and queue[head] is delivery:
                head += 1
                try:
                    send_fin(delivery[DELIVER_ID])
                except LocalProtocolError:  # that id was already answered in the same read
                    self._answers.report_gone(delivery, "FIN")
                    if refused is not None:
                        refused.append(delivery)
                    continue
                done += 1
                continue
            if link is not None:  # out of order: finish() looks it up (and moves the queue)
                self._queue_answered(link, head)
                link = None
            if finish(delivery, now):
                others += 1
            elif refused is not None:
                refused.append(delivery)
            conn_id = 0
        if link is not None:
            self._queue_answered(link, head)
        self.finished += done
        return bulk + done + others

    def _finish_many_running(
        self, deliveries: Iterable[Deliver], now: float, refused: list[Deliver] | None
    ) -> int:
        """finish_many while running outside backoff but not calm (pull mode, settling): the
        FINs as :meth:`finish` sends them (runs in delivery order by position), then what
        each answer would do to RDY, done once per connection (settling) and once overall
        (the budget), instead of once per message."""
        links = self._links
        ledger = self._ledger
        settling = ledger.settling
        answered: dict[int, list[Deliver]] = {}  # conn_id -> the FINs written
        done = 0
        for conn_id, group in groupby(deliveries, _conn_id):
            run = list(group)
            link = links.get(conn_id)
            if link is None:  # its connection is gone
                for delivery in run:
                    self._answers.report_gone(delivery, "FIN")
                if refused is not None:
                    refused += run
                continue
            used, fins = self._finish_in_order(run, refused)
            fin_list = run[:fins] if used else []
            for delivery in run[used:] if used else run:
                if self._fin_tracked(link, delivery):
                    fin_list.append(delivery)
                elif refused is not None:
                    refused.append(delivery)
            done += len(fin_list)
            answered.setdefault(conn_id, []).extend(fin_list)
        grant = False
        for conn_id, fin_list in answered.items():
            if fin_list and conn_id in settling:
                deadlines = list(map(_deadline, fin_list))
                grant = ledger.answered(links[conn_id], deadlines, now) or grant
        if grant:
            self._rdy.grant(now)
        if self._pull:
            for conn_id in answered:
                self._pull_mode.top_up(links[conn_id], now)
        return done

    def _fin_tracked(self, link: Link, delivery: Deliver) -> bool:
        """:meth:`finish`'s FIN without what follows it (RDY, backoff): False, and a
        TakenBack, when ``delivery`` is no longer in flight on ``link``."""
        message_id = delivery[DELIVER_ID]
        queue = link.queue
        head = link.head
        if queue and queue[head] is delivery:
            self._queue_answered(link, head + 1)
        else:
            tracked = link.tracked
            current = tracked.pop(message_id, None)
            if current is not delivery:  # answered, taken back, or delivered again
                if current is not None:  # a newer delivery of that id: keep it
                    tracked[message_id] = current
                self._answers.report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._answers.report_gone(delivery, "FIN")
            return False
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += 1
        if link.marks:
            link.touched.pop(message_id, None)
            link.seen.discard(message_id)
        return True

    def _finish_in_order(
        self, batch: list[Deliver], refused: list[Deliver] | None
    ) -> tuple[int, int]:
        """finish_many's common case without a Python loop: every delivery of ``batch`` is the
        next in its connection's queue (one read, answered in the order it came). Returns how
        many deliveries from the start of ``batch`` were answered, and how many of those were
        FIN'd (a FIN refused by the connection is reported, as finish() does); (0, 0) when it
        is not that case."""
        link = self._links.get(batch[0][DELIVER_CONN_ID])
        if link is None:
            return 0, 0
        queue = link.queue
        head = link.head
        count = len(batch)
        if len(queue) - head < count:
            return 0, 0
        window = queue[head : head + count] if head or count < len(queue) else queue
        if not all(map(is_, batch, window)):
            return 0, 0
        ids = list(map(_id, batch))
        used = done = count
        try:
            link.send_fins(ids)  # all or nothing
        except LocalProtocolError:  # one id was already answered in the same read
            rest = iter(ids)
            try:
                deque(map(link.send_fin, rest), maxlen=0)
            except LocalProtocolError:
                done = count - len(list(rest)) - 1
                used = done + 1
                self._answers.report_gone(batch[done], "FIN")
                if refused is not None:
                    refused.append(batch[done])
        self._queue_answered(link, head + used)
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += done
        if link.marks:  # TOUCHed or marked delivered: forget those marks too, as finish()
            fins = ids[:done] if done < count else ids
            if link.touched:
                deque(map(link.touched.pop, fins, repeat(None)), maxlen=0)
            if link.seen:
                link.seen.difference_update(fins)
        return used, done

    @staticmethod
    def _queue_answered(link: Link, head: int) -> None:
        """``queue[:head]`` of ``link`` were answered."""
        if head >= len(link.queue):
            link.queue.clear()
            link.head = 0
        else:
            link.head = head

    def requeue(
        self,
        delivery: Deliver,
        now: float,
        delay: float | None = None,
        *,
        backoff: bool = True,
    ) -> bool:
        """REQ: hand the message back. Without ``delay``: ``default_requeue_delay * attempts``
        capped. ``backoff=False`` keeps this failure from slowing the consumer down."""
        return self._answers.requeue(delivery, now, delay, backoff=backoff)

    def check_requeue_delay(self, delivery: Deliver, delay: float) -> None:
        """Raise for a ``requeue()`` delay nsqd would not take, changing nothing: not a number
        of seconds >= 0 (:class:`~nsq_sansio.errors.LocalProtocolError`), or above nsqd's
        ``max_req_timeout`` when it is known (given as ``Config.max_req_timeout``, or announced
        by that nsqd): :class:`~nsq_sansio.errors.DelayOutOfRange`, which names the unit. Only
        reads, so a transport may call it from the thread the answer comes from."""
        self._answers.check_requeue_delay(delivery, delay)

    def requeue_delay(self, attempts: int, conn_id: int | None = None) -> float:
        """The automatic REQ delay: ``default_requeue_delay * attempts``, capped (also by the
        server's ``max_req_timeout``, configured or announced, when ``conn_id`` is given)."""
        return self._answers.requeue_delay(attempts, conn_id)

    def touch(self, delivery: Deliver, now: float) -> float | None:
        """TOUCH: extend the message's timeout; returns the new deadline (None if not ours).
        The deadline never goes past received_at + the server's max_msg_timeout. A message
        whose deadline has passed is not ours any more (nsqd took it back at its own deadline,
        which came first): nothing is sent, and it is reported (TakenBack) as gone."""
        return self._answers.touch(delivery, now)

    def dead_letter_published(self, delivery: Deliver, now: float, topic: str | None) -> bool:
        """The DeadLetter ``delivery`` was published to ``topic`` (None: to nothing, the
        routing chose none): FIN it and report :class:`GiveUp`. False (and a TakenBack) when
        it was no longer ours: nsqd will deliver it again."""
        return self._answers.dead_letter_published(delivery, now, topic)

    def dead_letter_failed(self, delivery: Deliver, now: float) -> bool:
        """The DeadLetter ``delivery`` could not be published: requeue it (the automatic
        delay, no backoff) so it comes back and is dead-lettered again. False (and a
        TakenBack) when it was no longer ours: nsqd requeues it by itself."""
        return self._answers.dead_letter_failed(delivery, now)

    # --- shared helpers ------------------------------------------------------------------------

    def _act(self, action: Action) -> None:
        """Queue ``action`` for :meth:`take_actions` (the parts report through this)."""
        self._actions.append(action)

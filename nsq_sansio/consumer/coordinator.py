"""The consumer coordinator (:class:`ConsumerCoordinator`): one façade over composed parts.

Rules:

* The façade owns the connections (links by id and by address), the actions decided, the
  counters, the lookupd poller, and the per-message paths (``receive_data``, ``finish``,
  ``finish_many``), which read
  :class:`~nsq_sansio.consumer.link.Link` fields directly for speed.
* Everything else is decided by a part that owns its fields and states its rules at the top
  of its module (:data:`PARTS`): the lifecycle table, the RDY ledger (the only writer of RDY
  and of the max_in_flight bound), backoff, retries, pull mode, drain. The façade composes
  them: it asks each for its targets or its due work and hands the results to the ledger.
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
from ..connection import MAX_COMMAND_DELAY, ClientConnection, ConnectionState
from ..discovery import (
    LookupAnswer,
    LookupdAddress,
    LookupdPoller,
    LookupFailure,
    NSQDAddress,
    NSQDFilter,
)
from ..errors import (
    ConfigError,
    ConnectionLost,
    IncompatibleNSQD,
    LocalProtocolError,
    MessageGone,
    NSQError,
)
from ..events import (
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    Event,
    MessageTakenBack,
    ServerSettings,
    Subscribed,
    TLSUpgradeRequired,
)
from ..names import validate_channel, validate_topic
from .actions import (
    DELIVER_ATTEMPTS,
    DELIVER_CONN_ID,
    DELIVER_DEADLINE,
    DELIVER_ID,
    Action,
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConnectionUp,
    ConsumerFailed,
    DeadLetter,
    Deliver,
    Disconnected,
    DrainComplete,
    FetchEnd,
    FetchResult,
    GiveUp,
    LookupdFailed,
    NodeRefused,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
    TopicNotFound,
)
from .backoff_control import BackoffControl
from .drain import Drain
from .fetches import FetchQueue
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle, LifecycleEvent
from .link import RDY_SETTLE_MIN, Link, LinkPhase, current_link, fin_before_setup
from .pull import PullMode
from .rdy import even_shares, is_starved, needs_refresh
from .retry import Retries, over_attempts
from .shares import pick_holders

__all__ = ["PARTS", "ConsumerCoordinator"]

#: The parts the façade is composed of, in the order a reader meets them: (module, what it
#: owns). The one list (the package docstring and docs/architecture.md point here).
PARTS: tuple[tuple[str, str], ...] = (
    ("lifecycle", "the consumer's state and its transition table"),
    ("ledger", "RDY decided and written, totals, claims, settling, the max_in_flight bound"),
    ("backoff_control", "backoff's state machine, its RDY budget and test, what is reported"),
    ("retry", "requeue delays, the give-up rule, direct reconnects, pending dead letters"),
    ("pull", "pull mode: the fetch queue, allocation, rotation, expiry"),
    ("drain", "the drain deadline: give back, wait, CLS, close"),
)

_id: Callable[[Deliver], bytes] = itemgetter(DELIVER_ID)
_conn_id: Callable[[Deliver], int] = itemgetter(DELIVER_CONN_ID)
_deadline: Callable[[Deliver], float] = itemgetter(DELIVER_DEADLINE)
_attempts: Callable[[Deliver], int] = itemgetter(DELIVER_ATTEMPTS)

#: Refused addresses reported (each once); beyond this many, the others are refused silently.
_MAX_REFUSED_REPORTED = 1024

#: The shortest time :meth:`ConsumerCoordinator.read_pause_limit` gives (a quarter of the
#: shortest message timeout nsqd lets a client ask for): an nsqd announcing an absurdly short
#: timeout or heartbeat interval does not get the paused connection read at a higher pace.
_MIN_READ_PAUSE = 0.25


class ConsumerCoordinator:
    """Decides, for one topic/channel, what every nsqd connection sends and when.

    ``nsqd`` are direct addresses (retried with backoff), ``lookupd`` are polled for producers.
    ``rng`` makes every random choice (jitter, which connection gets RDY) replayable. ``pull``
    selects pull mode: messages only flow for :meth:`fetch` requests. ``nsqd_filter`` decides
    which addresses lookupd lists are connected to (all by default). ``dead_letter``: a
    message over ``max_attempts`` is not FIN'd here but handed to the transport as
    :class:`~nsq_sansio.consumer.actions.DeadLetter` to publish first.
    """

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
        self._config = config if config is not None else Config()
        if self._config.heartbeat_interval is None:
            raise ConfigError(
                "heartbeat_interval=None: nsqd refuses SUB on a connection without heartbeats; "
                "allowed 1 <= heartbeat_interval <= 3600 (seconds) for a consumer"
            )
        self._rng = rng
        self._pull = pull
        self._lifecycle = Lifecycle()
        self._retries = Retries(
            self._config, rng, [NSQDAddress.parse(a) for a in nsqd], dead_letter=dead_letter
        )
        lookupds = [LookupdAddress.parse(a) for a in lookupd]
        self._poller: LookupdPoller | None = None
        if lookupds:
            self._poller = LookupdPoller(
                lookupds,
                self.topic,
                interval=self._config.lookupd_poll_interval,
                jitter=self._config.lookupd_poll_jitter,
                timeout=self._config.lookupd_poll_timeout,
                rng=rng,
                user_agent=self._config.user_agent,
            )
        if not self._retries.direct and self._poller is None:
            raise LocalProtocolError("a consumer needs at least one nsqd or lookupd address")
        if nsqd_filter is not None and not callable(nsqd_filter):
            raise ConfigError(
                f"nsqd_filter must be callable (NSQDAddress -> bool), got {nsqd_filter!r}"
            )
        self._nsqd_filter = nsqd_filter
        #: Addresses the filter refused, each reported once (bounded).
        self._refused_nodes: set[NSQDAddress] = set()
        self._links: dict[int, Link] = {}
        self._by_address: dict[NSQDAddress, Link] = {}
        self._next_conn_id = 1
        self._actions: list[Action] = []
        #: Connections with something to write.
        self._dirty: set[int] = set()
        self._ledger = RdyLedger(self._links, self._dirty, self._config.max_in_flight, self._recalm)
        self._backoff_control = BackoffControl(self._config)
        #: The backoff state machine (owned by the backoff part; read on the answer paths).
        self._backoff = self._backoff_control.backoff
        self._pull_mode = PullMode(
            self._config,
            rng,
            self._links,
            self._ledger,
            self._lifecycle,
            self._act,
            self._rebalance,
            self._requeue_now,
            self._take_rdy_away,
        )
        self._drain = Drain(
            self._links,
            self._dirty,
            self._ledger,
            self._lifecycle,
            self._act,
            self._requeue_now,
            self._close,
        )
        self._next_redistribute: float | None = None
        #: True while running in push mode outside backoff and with no RDY settling: answers
        #: need no bookkeeping beyond the FIN itself (the hot path's test).
        self._calm = False
        #: Set by the first mark_delivered(): from then on only marked deliveries count as
        #: handed to user code, and drain requeues the others at once.
        self._explicit_delivery = False
        #: The retry part's give-up limit, read by the per-message paths.
        self._max_attempts = self._retries.max_attempts
        self._failure: NSQError | None = None
        self.received = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        self.taken_back = 0
        #: lookupd answers that listed no nsqd for the topic (TopicNotFound says it once).
        self.topic_not_found = 0
        self._topic_reported = False
        self.dead_lettered = 0
        self.dead_letter_failures = 0

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
        return self._failure

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
        if self._poller is not None:
            nodes |= self._poller.known_nodes()
        return frozenset(nodes)

    def is_starved(self) -> bool:
        """The guide's is_starved: some connection holds >= 85% of its RDY in messages."""
        for link in self._links.values():
            if link.phase is LinkPhase.SUBSCRIBED and is_starved(link.held_count(), link.rdy):
                return True
        return False

    def deadline(self, delivery: Deliver) -> float | None:
        """When nsqd will time this message out (after TOUCHes), None if no longer ours."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        return link.touched.get(delivery.id, delivery.deadline)

    def max_deadline(self, delivery: Deliver) -> float | None:
        """The furthest TOUCH can push the deadline (received + the server's max_msg_timeout)."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        return delivery.received_at + link.max_msg_timeout

    def next_touch(self, delivery: Deliver) -> float | None:
        """For long jobs: when to TOUCH next to keep the message, half-way to its
        deadline; None when it is no longer ours or TOUCH cannot extend it any more (the
        server's max_msg_timeout is reached: finish before :meth:`max_deadline`). The
        coordinator never touches by itself."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        deadline = link.touched.get(delivery.id, delivery.deadline)
        if deadline >= delivery.received_at + link.max_msg_timeout:
            return None
        return deadline - link.msg_timeout / 2

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
        link = self._links.get(conn_id)
        if link is None or link.phase is not LinkPhase.SUBSCRIBED or link.proto is None:
            return None
        proto = link.proto
        limit = proto.settings.msg_timeout / 4000 if proto.settings is not None else 15.0
        if proto.heartbeat_interval is not None:
            limit = min(limit, proto.heartbeat_interval / 2)
        return max(limit, _MIN_READ_PAUSE)

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
            ]
            if self._next_redistribute is not None and self._links:
                due.append(self._next_redistribute)
            if self._poller is not None:
                due.append(self._poller.next_deadline())
            if self._pull:
                due.append(self._pull_mode.next_deadline())
            candidates += [at for at in due if at is not None]
        elif state is ConsumerState.DRAINING and self._drain.deadline is not None:
            candidates.append(self._drain.deadline)
        for link in self._links.values():
            if link.handshake_deadline is not None:
                candidates.append(link.handshake_deadline)
            if link.close_deadline is not None:
                candidates.append(link.close_deadline)
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None:
                    candidates.append(beat)
        return min(candidates) if candidates else None

    def handle_timer(self, now: float) -> None:
        """Do whatever is due at ``now``; call it when :meth:`next_deadline` passes."""
        self._link_timers(now)
        state = self._lifecycle.state
        if state is ConsumerState.DRAINING:
            self._drain.due(now)
            return
        if state is not ConsumerState.RUNNING:
            return
        if self._backoff.handle_timer(now, self.in_flight_count()):
            self._backoff_moved(now)
        if self._ledger.settling and self._ledger.settle_due(now):
            self._grant_if_running(now)
        if self._next_redistribute is not None and now >= self._next_redistribute:
            self._next_redistribute = now + self._config.rdy_redistribute_interval
            self._redistribute(now)
        self._discovery_due(now)
        if self._pull:
            self._pull_mode.due(now, self._subscribed())

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Connect to the configured nsqd and ask every lookupd (bootstrap)."""
        if self._lifecycle.state is not ConsumerState.CREATED:
            raise LocalProtocolError(f"start() in state {self._lifecycle.state.name}: call it once")
        self._lifecycle.apply(LifecycleEvent.START)
        self._recalm()
        self._next_redistribute = now + self._config.rdy_redistribute_interval
        for address in self._retries.direct:
            self._connect(address, now)
        if self._poller is not None:
            for request in self._poller.start(now):
                self._act(SendHTTPRequest(request.request_id, request.lookupd, request.data))

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
        self._stop_requests()
        if self._pull:
            self._pull_mode.end_all(FetchEnd.DRAINING, emptied=False)
        self._drain.begin(now, now + (self._config.drain_timeout if timeout is None else timeout))
        self._pull_mode.flush(None)
        self._drain.give_back(now, unseen, only_seen=self._explicit_delivery)

    def _fail(self, error: NSQError, now: float) -> None:
        """Stop for good (:class:`ConsumerFailed`): no reconnect, no lookupd poll; what is in
        flight is requeued at once (nobody can answer it any more) and every connection
        closed. One rule for every node: the configuration is the same for all of them, so
        one refusal fails the consumer rather than leaving that nsqd's messages unread."""
        self._lifecycle.apply(LifecycleEvent.FAIL)
        self._failure = error
        self._recalm()
        self._stop_requests()
        for link in self._links.values():
            link.accepting = False
            if link.phase is LinkPhase.SUBSCRIBED:
                if link.rdy:
                    self._ledger.send(link, 0, now)  # before the REQs, as a drain does
                for delivery in list(link.tracked.values()):
                    self._requeue_now(link, delivery)
        if self._pull:  # what they gathered was just requeued: the answers are empty
            self._pull_mode.end_all(FetchEnd.FAILED, emptied=True)
            self._pull_mode.fetches.buffer.clear()
        for link in list(self._links.values()):
            self._drop(link, None, now, close=True)
        self._act(ConsumerFailed(error))

    def _stop_requests(self) -> None:
        """The consumer stops (drain, failure): backoff, lookupd polls and reconnects end."""
        self._backoff.reset()
        if self._poller is not None:
            for request_id in self._poller.stop():
                self._act(CloseHTTPRequest(request_id))
        self._retries.stop()

    # --- transport -> coordinator: connections -------------------------------------------------

    def connection_made(self, conn_id: int, now: float) -> None:
        """TCP is up for ``conn_id``: IDENTIFY is queued (see pending_data)."""
        link = self._links.get(conn_id)
        if link is None or link.phase is not LinkPhase.CONNECTING:
            return
        link.phase = LinkPhase.HANDSHAKING
        link.connected_at = now
        # The whole configuration (AUTH policy, a known max_req_timeout), and the address to
        # name in what goes wrong (nsqd's HTTP port, TLS it does not offer...).
        link.proto = ClientConnection.from_config(self._config, peer=str(link.address))
        link.send_fin = link.proto.finish
        link.send_fins = link.proto.finish_many
        self._dirty.add(conn_id)

    def connection_failed(
        self, conn_id: int, error: BaseException | str | None, now: float
    ) -> None:
        """Connecting failed, or the socket broke (reset, IO error, TLS failure)."""
        link = self._links.get(conn_id)
        if link is None:
            return
        if isinstance(error, NSQError):
            nsq_error: NSQError = error
        else:
            nsq_error = ConnectionLost(
                f"connection {conn_id} to {link.address} failed in phase {link.phase.name}: "
                f"{error or 'no reason given'}"
            )
        self._drop(link, nsq_error, now, close=False)

    def tls_established(self, conn_id: int, now: float) -> None:
        """The TLS handshake asked by :class:`StartTLS` succeeded."""
        link = self._links.get(conn_id)
        if link is None or link.proto is None:
            return
        link.proto.tls_established()
        self._dirty.add(conn_id)

    # --- transport -> coordinator: lookupd -----------------------------------------------------

    def http_data(self, request_id: int, data: bytes, now: float) -> None:
        """Raw bytes of a lookupd answer (``b""`` at EOF), parsed with h11."""
        if self._poller is not None:
            self._on_lookup(request_id, self._poller.receive_data(request_id, data), now)

    def http_response(self, request_id: int, status: int, body: bytes, now: float) -> None:
        """A lookupd answer already parsed by the transport's own HTTP client."""
        if self._poller is not None:
            outcome = self._poller.receive_response(request_id, status, body)
            self._on_lookup(request_id, outcome, now)

    def http_failed(self, request_id: int, error: BaseException | str, now: float) -> None:
        """The lookupd request could not be made (connect refused, reset, TLS...)."""
        if self._poller is not None:
            self._on_lookup(request_id, self._poller.fail(request_id, error), now)

    def _on_lookup(
        self, request_id: int, outcome: LookupAnswer | LookupFailure | None, now: float
    ) -> None:
        if outcome is None:
            return
        self._act(CloseHTTPRequest(request_id))
        if isinstance(outcome, LookupFailure):
            self._act(LookupdFailed(outcome.lookupd, outcome.error))
            return
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return
        self._note_producers(outcome)
        accepts = self._nsqd_filter
        for address in outcome.producers:
            if address in self._by_address:
                continue
            if accepts is not None and not accepts(address):
                refused = self._refused_nodes
                if address not in refused and len(refused) < _MAX_REFUSED_REPORTED:
                    refused.add(address)
                    self._act(NodeRefused(outcome.lookupd, address))
                continue
            self._connect(address, now)

    def _note_producers(self, answer: LookupAnswer) -> None:
        """Count a lookupd answer that lists no nsqd for the topic, and report it once
        (:class:`TopicNotFound`) while no lookupd lists one; a listed producer re-arms it."""
        if answer.producers:
            self._topic_reported = False
            return
        self.topic_not_found += 1
        assert self._poller is not None
        if not self._topic_reported and not self._poller.known_nodes():
            self._topic_reported = True
            self._act(TopicNotFound(answer.lookupd, self.topic))

    def _discovery_due(self, now: float) -> None:
        """Poll lookupd and reconnect direct addresses when their time came."""
        if self._poller is not None:
            requests, failures = self._poller.poll_due(now)
            for request_id, failure in failures:
                self._on_lookup(request_id, failure, now)
            for request in requests:
                self._act(SendHTTPRequest(request.request_id, request.lookupd, request.data))
        for address in self._retries.due(now):
            if address not in self._by_address:
                self._connect(address, now)

    # --- connections: open, time out, lose -----------------------------------------------------

    def _connect(self, address: NSQDAddress, now: float) -> None:
        conn_id = self._next_conn_id
        self._next_conn_id += 1
        link = Link(conn_id, address, now + self._config.connect_timeout)
        self._links[conn_id] = link
        self._by_address[address] = link
        self._act(Connect(conn_id, address))

    def _link_timers(self, now: float) -> None:
        """Drop connections past their handshake or close deadline; run heartbeat timers."""
        for link in list(self._links.values()):
            if link.conn_id not in self._links:
                continue  # dropped while handling another one
            if link.handshake_deadline is not None and now >= link.handshake_deadline:
                self._drop(
                    link,
                    ConnectionLost(
                        f"connection {link.conn_id} to {link.address} not subscribed after "
                        f"{self._config.connect_timeout:g}s (phase {link.phase.name})"
                    ),
                    now,
                    close=True,
                )
                continue
            if link.close_deadline is not None and now >= link.close_deadline:
                self._drop(link, None, now, close=True)
                continue
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None and now >= beat:
                    events = link.proto.handle_timer(now)
                    if events:
                        self._close_from_events(link, events, now)

    def _close(self, link: Link, now: float) -> None:
        """Close ``link`` on purpose (drain): no error."""
        self._drop(link, None, now, close=True)

    def _drop(self, link: Link, error: NSQError | None, now: float, *, close: bool) -> None:
        """Forget a connection: its RDY, its messages (nsqd requeues them), maybe reconnect."""
        conn_id = link.conn_id
        if self._links.pop(conn_id, None) is None:
            return
        if self._by_address.get(link.address) is link:
            del self._by_address[link.address]
        self._ledger.forget(link)
        self._pull_mode.release(link)
        final = b""
        if link.proto is not None:
            final = link.proto.data_to_send()
            link.proto.close()
        if close:
            self._act(CloseConnection(conn_id, final))
        unanswered = tuple(link.tracked)
        link.tracked.clear()
        link.touched.clear()
        link.seen.clear()
        link.accepting = False
        if self._pull and unanswered:
            self._pull_mode.forget_connection(conn_id)
        running = self._lifecycle.state is ConsumerState.RUNNING
        # nsqd refused the configuration: reconnecting cannot help, the consumer fails.
        refused = isinstance(error, IncompatibleNSQD) and running
        reconnect_at: float | None = None
        if running and not refused:
            reconnect_at = self._retries.lost(link.address, now)
        if link.phase is not LinkPhase.CONNECTING or error is not None:
            self._act(Disconnected(conn_id, link.address, error, unanswered, reconnect_at))
        if refused:
            assert error is not None
            self._fail(error, now)
        elif running:
            self._rebalance(now)
        else:
            self._drain.check_done()

    def _close_from_events(self, link: Link, events: list[Event], now: float) -> None:
        error: NSQError | None = ConnectionLost(f"connection {link.conn_id} closed")
        for event in events:
            if isinstance(event, MessageTakenBack):
                self.taken_back += 1
                self._act(
                    TakenBack(
                        link.conn_id, link.address, event.message_id, event.command, event.error
                    )
                )
            elif isinstance(event, ConnectionClosed):
                error = event.error
        self._drop(link, error, now, close=True)

    # --- RDY: targets per connection, given to the ledger --------------------------------------

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once."""
        self._config = self._config.replace(max_in_flight=max_in_flight)
        self._ledger.max_in_flight = self._config.max_in_flight
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._rebalance(now)

    def _rebalance(self, now: float, exclude: frozenset[int] = frozenset()) -> None:
        """Recompute every connection's RDY target (pull mode: what the fetches ask for;
        backoff's test; else even shares, or scarce RDY to a few) and have the ledger move
        RDY there (lowered first, raises within the bound)."""
        links = self._subscribed()
        if not links:
            self._pull_mode.next_expiry = None  # nothing in flight anywhere: nothing expires
            return
        budget = self._budget()
        if self._pull:
            targets = self._pull_mode.allocate(links, budget, now, exclude)
        elif self._backoff.phase is BackoffPhase.TESTING:
            targets = self._backoff_control.testing_targets(
                links, exclude, now, self._config.max_in_flight, self._rng
            )
        elif budget >= len(links):
            targets = even_shares(budget, [link.max_rdy if link.warm else 1 for link in links])
        else:
            targets = pick_holders(links, budget, exclude, [1] * len(links), self._rng)
        for link, target in zip(links, targets, strict=True):
            link.target = target
        self._ledger.apply_targets(links, now, quarter_steps=not self._pull)

    def _grant(self, now: float) -> None:
        """Budget came back: raise the connections still below their share."""
        if self._pull:
            self._rebalance(now)
        else:
            self._ledger.raise_to_targets(self._subscribed(), now, quarter_steps=True)

    def _grant_if_running(self, now: float) -> None:
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._grant(now)

    def _backoff_moved(self, now: float) -> None:
        """Backoff changed phase or level: RDY follows, and the change is reported."""
        self._recalm()
        self._rebalance(now)
        change = self._backoff_control.change_to_report()
        if change is not None:
            self._act(change)

    def _redistribute(self, now: float) -> None:
        """Periodic check: warm up idle newcomers, and with fewer RDY than connections move
        RDY away from connections that received nothing for low_rdy_idle_timeout, or that
        held it for low_rdy_timeout (so a busy nsqd cannot keep it from the others)."""
        links = self._subscribed()
        if not links:
            return
        idle_after = self._config.low_rdy_idle_timeout
        held_too_long = self._config.low_rdy_timeout
        released: set[int] = set()
        if self._backoff.phase is BackoffPhase.TESTING and not self._pull:
            # the test's few messages: their RDY moves off an nsqd that has nothing to send
            live = [link.live_count(now)[0] for link in links]
            scarce = self._testing_room(links, live) < len(links)
        else:
            scarce = self._budget() < len(links) or (
                self._pull and self._pull_mode.alloc_total < len(links)
            )
        # One move at a time: while a connection waits for the budget a move freed (a lowered
        # RDY settling), no holder gives RDY up. Else, with an idle timeout shorter than the
        # settle time, each tick took the RDY of one idle holder and handed it to another
        # holder released a tick before (which took its own unsettled RDY straight back):
        # the waiting connection, the one with the messages, never got any.
        if scarce and any(link.rdy < link.target for link in links):
            scarce = False
        for link in links:
            if not link.warm and now - link.rdy_at >= self._config.rdy_redistribute_interval:
                link.warm = True
            # Only a holder: a connection given a share that waits for budget (another one's
            # lowered RDY settling) has had no RDY to receive with, so it is not idle.
            if (
                scarce
                and link.rdy > 0
                and (
                    now - max(link.last_message_at, link.rdy_at) >= idle_after
                    or now - link.rdy_at >= held_too_long
                )
            ):
                released.add(link.conn_id)
                self._take_rdy_away(link, now)
        self._rebalance(now, frozenset(released))

    def _testing_room(self, links: list[Link], live: list[int]) -> int:
        """How many new messages backoff's test lets in now (none unless running)."""
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return 0
        return self._backoff_control.room(links, live, self._config.max_in_flight)

    def _take_rdy_away(self, link: Link, now: float) -> None:
        """``link`` gives its scarce RDY up (and in pull mode its share of the fetches); the
        caller rebalances with it excluded, so the RDY goes to another connection."""
        link.target = 0
        if self._pull:
            self._pull_mode.release(link)
        self._ledger.send(link, 0, now)

    def _subscribed(self) -> list[Link]:
        return [link for link in self._links.values() if link.phase is LinkPhase.SUBSCRIBED]

    def _budget(self) -> int:
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return 0
        return self._backoff_control.budget(self._config.max_in_flight)

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
        if self._pull_mode.cancel_waiting(request_id, now):
            return
        for index, action in enumerate(self._actions):
            if isinstance(action, FetchResult) and action.request_id == request_id:
                del self._actions[index]
                self.give_back(action.messages, now)
                return
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._rebalance(now)

    def give_back(self, deliveries: Sequence[Deliver], now: float) -> None:
        """A fetch answer the caller never saw (cancelled just as it was answered): its
        messages go back to the front of the hold buffer for the next fetch, as those of a
        request cancelled while waiting do, not back to nsqd (which would count another
        attempt). Messages no longer ours are skipped; once the consumer is draining or
        closed they are requeued (REQ 0) instead."""
        for delivery in deliveries:
            link = self._links.get(delivery.conn_id)
            if link is not None:
                link.seen.discard(delivery.id)
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._pull_mode.hold_again(deliveries, now)
            return
        for delivery in deliveries:
            link = current_link(self._links, delivery)
            if link is not None:
                self._requeue_now(link, delivery)

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
            self._close_from_events(link, events, now)
            return
        if now + link.msg_timeout < link.live_floor:  # what this read brings expires then
            link.live_floor = now + link.msg_timeout
        after = proto.in_flight_count
        calm = self._calm  # for this read: taking late messages in below does not change it
        if (
            after > link.claim
            and link.accepting
            and not self._take_late(link, sum(type(e) is Deliver for e in events), now)
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
            self._after_messages(link, now)
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
                self._on_event(link, event, now)
                if link.conn_id not in self._links:
                    break
        if count:
            self.received += count
            link.remaining -= count
            link.last_message_at = now
            self._after_messages(link, now)

    def _take_late(self, link: Link, arriving: int, now: float) -> bool:
        """More messages on ``link`` than its claim covers: the ledger decides whether they
        fit (its budget may grow only while the consumer runs)."""
        return self._ledger.take_late(
            link, arriving, now, may_grow=self._lifecycle.state is ConsumerState.RUNNING
        )

    def _one_by_one(self, link: Link, events: list[object], now: float) -> None:
        """A read's events, each on its own (every case the fast paths leave)."""
        for event in events:
            if type(event) is Deliver:
                self._on_message(link, event, now)
            else:
                self._on_event(link, event, now)
                if link.conn_id not in self._links:
                    return

    def _on_message(self, link: Link, delivery: Deliver, now: float) -> None:
        """One message arrived on ``link`` (every case; the common one is inlined in
        :meth:`receive_data`)."""
        link.remaining -= 1
        link.last_message_at = now
        self.received += 1
        proto = link.proto
        assert proto is not None
        message_id = delivery.id
        if link.tracked:
            previous = link.tracked.pop(message_id, None)
            if previous is not None:  # sent again: the copy the user holds timed out on nsqd
                link.touched.pop(message_id, None)
                link.seen.discard(message_id)
                if self._pull:
                    self._pull_mode.forget_gathered(previous)
                self._report_gone(previous, "TIMEOUT")
        if not proto.is_in_flight(message_id):
            return  # a copy earlier in this read was already answered: nsqd has one copy only
        if not link.accepting:
            self._ledger.emit(link)  # RDY 0 goes before the REQ
            proto.requeue(message_id, 0.0)  # draining: give it to another consumer at once
            self.requeued += 1
            return
        if over_attempts(delivery.attempts, self._max_attempts):
            if self._retries.dead_letter:
                # Held as if in user code until the transport reports the publish: FIN'd
                # only once it is stored elsewhere, requeued if that failed.
                link.tracked[message_id] = delivery
                if self._explicit_delivery:  # a drain must wait for it, not requeue it
                    link.marks = True
                    link.seen.add(message_id)
                self._retries.hand_over(delivery)
                self._act(DeadLetter(delivery))
                return
            proto.finish(message_id)
            self.given_up += 1
            self._act(GiveUp(link.conn_id, link.address, delivery.message))
            if self._backoff.record(Outcome.SUCCESS, now):  # a give-up FINs: a success
                self._backoff_moved(now)
            return
        if link.held_count() >= link.claim and not self._take_late(link, 1, now):
            # Beyond max_in_flight (see the ledger's take_late): handed back, unseen by the user.
            self._ledger.emit(link)
            proto.requeue(message_id, 0.0)
            self.requeued += 1
            return
        link.tracked[message_id] = delivery
        if self._pull:
            self._pull_mode.on_messages(link, [delivery], now)
            return
        self._actions.append(delivery)
        self._after_messages(link, now)

    def _after_messages(self, link: Link, now: float) -> None:
        """After messages arrived: warm a new connection up, refresh RDY when it runs low."""
        if not link.warm:
            link.warm = True
            self._rebalance(now)
        if link.target and needs_refresh(link.remaining, link.rdy):
            ledger = self._ledger
            ledger.send(link, min(link.target, ledger.budget_left(link)), now)

    def _on_event(self, link: Link, event: object, now: float) -> None:
        if isinstance(event, Deliver):
            self._on_message(link, event, now)
        elif isinstance(event, MessageTakenBack):
            # FIN/REQ: already forgotten here. TOUCH: the user still holds it; their FIN/REQ
            # goes out and nsqd answers E_*_FAILED again, harmlessly.
            self.taken_back += 1
            # A refused TOUCH is about the copy held now (nsqd had none in flight when it came,
            # so a newer copy comes after it); a refused FIN/REQ's handle is already forgotten.
            held = (
                link.tracked.get(event.message_id)
                if event.command == "TOUCH" and event.message_id is not None
                else None
            )
            if held is not None:
                # nsqd holds it no more: its deadline has passed (it counts no more against
                # max_in_flight, whatever TOUCH was believed to have won)
                link.touched[held.id] = min(now, link.touched.get(held.id, held.deadline))
                link.marks = True
                link.live_floor = -math.inf
            self._act(
                TakenBack(
                    link.conn_id,
                    link.address,
                    event.message_id,
                    event.command,
                    event.error,
                    held,
                )
            )
            if self._lifecycle.state is ConsumerState.DRAINING:
                self._drain.maybe_close(link, now)
                self._drain.check_done()
        elif isinstance(event, TLSUpgradeRequired):
            self._act(StartTLS(link.conn_id, event.trailing_data))
        elif isinstance(event, ConnectionReady):
            assert link.proto is not None
            if self._lifecycle.state is not ConsumerState.RUNNING:
                self._drop(link, None, now, close=True)
                return
            link.proto.subscribe(self.topic, self.channel)
            self._dirty.add(link.conn_id)
        elif isinstance(event, Subscribed):
            self._on_subscribed(link, now)
        elif isinstance(event, CloseWait):
            link.close_wait = True
            self._drain.maybe_close(link, now)
            self._drain.check_done()
        elif isinstance(event, ConnectionClosed):
            self._drop(link, event.error, now, close=True)

    def _on_subscribed(self, link: Link, now: float) -> None:
        proto = link.proto
        assert proto is not None
        settings = proto.settings or ServerSettings.default()
        running = self._lifecycle.state is ConsumerState.RUNNING
        link.phase = LinkPhase.SUBSCRIBED
        link.accepting = running
        link.handshake_deadline = None
        link.settle_delay = max(RDY_SETTLE_MIN, 4 * (now - link.connected_at))
        link.max_rdy = max(1, settings.max_rdy_count)
        link.msg_timeout = settings.msg_timeout / 1000
        link.max_msg_timeout = max(settings.max_msg_timeout / 1000, link.msg_timeout)
        max_req = settings.raw.get("max_req_timeout") if settings.raw else None
        if isinstance(max_req, int) and not isinstance(max_req, bool) and max_req >= 0:
            link.max_req_timeout = max_req / 1000
        self._retries.subscribed(link.address)
        self._act(ConnectionUp(link.conn_id, link.address, settings))
        if not running:
            self._drain.maybe_close(link, now)
            return
        self._rebalance(now)

    # --- the user's answers --------------------------------------------------------------------

    def mark_delivered(self, delivery: Deliver) -> None:
        """The transport handed ``delivery`` to user code. Optional: a transport that calls it
        for every delivery lets drain requeue the unmarked ones at once (the alternative is
        ``drain(unseen=...)``); without it, every Deliver counts as handed over."""
        link = current_link(self._links, delivery)
        if link is not None:
            if not self._explicit_delivery:
                self._explicit_delivery = True
                self._pull_mode.mark_seen = True
            link.marks = True
            link.seen.add(delivery.id)

    def finish(self, delivery: Deliver, now: float) -> bool:
        """FIN: the message was handled. False (and a TakenBack) if it was no longer ours."""
        try:
            link = self._links[delivery[DELIVER_CONN_ID]]
        except KeyError:  # its connection is gone
            self._report_gone(delivery, "FIN")
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
                self._report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "FIN")
            return False
        if not link.dirty:
            link.dirty = True
            self._dirty.add(link.conn_id)
        self.finished += 1
        if link.marks:
            link.touched.pop(message_id, None)
            link.seen.discard(message_id)
        if not self._calm:
            self._after_answer(link, Outcome.SUCCESS, now, delivery)
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
                    self._report_gone(delivery, "FIN")
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
                    self._report_gone(delivery, "FIN")
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
            self._grant(now)
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
                self._report_gone(delivery, "FIN")
                return False
        try:
            link.send_fin(message_id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "FIN")
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
                self._report_gone(batch[done], "FIN")
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
        if delay is not None:
            self.check_requeue_delay(delivery, delay)  # before anything is forgotten
        link = self._forget_answered(delivery, "REQ")
        if link is None:
            return False
        assert link.proto is not None
        if delay is None:
            delay = self._retries.requeue_delay(delivery.attempts, link)
        else:
            # nsqd clamps REQ to its --max-req-timeout; we clamp to what the wire can carry.
            delay = min(delay, MAX_COMMAND_DELAY)
            if link.max_req_timeout is not None:
                delay = min(delay, link.max_req_timeout)
        self._ledger.emit(link)
        message_id = delivery.id
        if not link.proto.is_in_flight(message_id):  # already answered in the same read
            self._report_gone(delivery, "REQ")
            return False
        if not (backoff and self._config.backoff_active):
            outcome = Outcome.NEUTRAL
        elif delivery.attempts > 1:  # failed before: does not raise the level (see backoff)
            outcome = Outcome.REPEATED_FAILURE
        else:
            outcome = Outcome.FAILURE
        if self._lifecycle.state is ConsumerState.RUNNING and self._backoff.record(outcome, now):
            # Backoff starts (or a test ends): RDY 0 goes on the wire before the REQ, else
            # nsqd could hand the message straight back, in flight for the whole window.
            self._backoff_moved(now)
            self._ledger.emit(link)
            link.proto.requeue(message_id, delay)
            self.requeued += 1
            if link.conn_id in self._ledger.settling:
                self._answered_while_settling(link, delivery, now)
            return True
        link.proto.requeue(message_id, delay)
        self.requeued += 1
        self._after_answer(link, outcome, now, delivery, recorded=True)
        return True

    def check_requeue_delay(self, delivery: Deliver, delay: float) -> None:
        """Raise for a ``requeue()`` delay nsqd would not take, changing nothing: not a number
        of seconds >= 0 (:class:`~nsq_sansio.errors.LocalProtocolError`), or above nsqd's
        ``max_req_timeout`` when it is known (given as ``Config.max_req_timeout``, or announced
        by that nsqd): :class:`~nsq_sansio.errors.DelayOutOfRange`, which names the unit. Only
        reads, so a transport may call it from the thread the answer comes from."""
        if not (delay >= 0 and math.isfinite(delay)):
            raise LocalProtocolError(f"requeue delay must be >= 0 seconds, got {delay!r}")
        link = self._links.get(delivery.conn_id)
        proto = link.proto if link is not None else None
        limit = proto.max_req_timeout if proto is not None else None
        if limit is not None and delay > limit:
            raise ClientConnection._delay_error("requeue()", delay, limit, assumed=False)

    def requeue_delay(self, attempts: int, conn_id: int | None = None) -> float:
        """The automatic REQ delay: ``default_requeue_delay * attempts``, capped (also by the
        server's ``max_req_timeout``, configured or announced, when ``conn_id`` is given)."""
        link = self._links.get(conn_id) if conn_id is not None else None
        return self._retries.requeue_delay(attempts, link)

    def touch(self, delivery: Deliver, now: float) -> float | None:
        """TOUCH: extend the message's timeout; returns the new deadline (None if not ours).
        The deadline never goes past received_at + the server's max_msg_timeout. A message
        whose deadline has passed is not ours any more (nsqd took it back at its own deadline,
        which came first): nothing is sent, and it is reported (TakenBack) as gone."""
        link = current_link(self._links, delivery)
        if (
            link is None
            or link.proto is None
            or link.touched.get(delivery.id, delivery.deadline) <= now
        ):
            self._report_gone(delivery, "TOUCH")
            return None
        try:
            link.proto.touch(delivery.id)
        except LocalProtocolError:  # that id was already answered in the same read
            self._report_gone(delivery, "TOUCH")
            return None
        self._dirty.add(link.conn_id)
        deadline = min(now + link.msg_timeout, delivery.received_at + link.max_msg_timeout)
        link.marks = True
        link.touched[delivery.id] = deadline
        return deadline

    # --- dead letters --------------------------------------------------------------------------

    def dead_letter_published(self, delivery: Deliver, now: float, topic: str | None) -> bool:
        """The DeadLetter ``delivery`` was published to ``topic`` (None: to nothing, the
        routing chose none): FIN it and report :class:`GiveUp`. False (and a TakenBack) when
        it was no longer ours: nsqd will deliver it again."""
        self._retries.take_dead_letter(delivery)
        link = self._forget_answered(delivery, "FIN")
        if link is None:
            return False
        assert link.proto is not None
        message_id = delivery[DELIVER_ID]
        if not link.proto.is_in_flight(message_id):  # already answered in the same read
            self._report_gone(delivery, "FIN")
            return False
        link.proto.finish(message_id)
        self.given_up += 1
        if topic is not None:
            self.dead_lettered += 1
        self._act(GiveUp(link.conn_id, link.address, delivery.message, topic))
        # FIN'd after a give-up: a success for backoff, as a give-up without dead letters is
        self._after_answer(link, Outcome.SUCCESS, now, delivery)
        return True

    def dead_letter_failed(self, delivery: Deliver, now: float) -> bool:
        """The DeadLetter ``delivery`` could not be published: requeue it (the automatic
        delay, no backoff) so it comes back and is dead-lettered again. False (and a
        TakenBack) when it was no longer ours: nsqd requeues it by itself."""
        self._retries.take_dead_letter(delivery)
        self.dead_letter_failures += 1
        return self.requeue(delivery, now, backoff=False)

    # --- what an answer changes ----------------------------------------------------------------

    def _forget_answered(self, delivery: Deliver, command: str) -> Link | None:
        """Forget a delivery about to be answered; None (and a TakenBack) if not ours."""
        link = self._links.get(delivery.conn_id)
        if link is not None and link.tracked.get(delivery.id) is delivery:
            del link.tracked[delivery.id]
            if link.touched:
                link.touched.pop(delivery.id, None)
            if link.seen:
                link.seen.discard(delivery.id)
            self._dirty.add(link.conn_id)
            return link
        self._report_gone(delivery, command)
        return None

    def _after_answer(
        self,
        link: Link,
        outcome: Outcome,
        now: float,
        delivery: Deliver,
        *,
        recorded: bool = False,
    ) -> None:
        """``delivery`` was answered on ``link``. ``recorded``: the outcome was already given
        to backoff (and changed nothing)."""
        if link.conn_id in self._ledger.settling:
            self._answered_while_settling(link, delivery, now)
        state = self._lifecycle.state
        if state is ConsumerState.RUNNING:
            if not recorded and self._backoff.record(outcome, now):
                self._backoff_moved(now)
            elif self._pull:
                self._pull_mode.top_up(link, now)
        elif state is ConsumerState.DRAINING:
            self._drain.maybe_close(link, now)
            self._drain.check_done()

    def _answered_while_settling(self, link: Link, delivery: Deliver, now: float) -> None:
        """An answer went out on a settling ``link``: the ledger counts it, and budget that
        came back is given out."""
        if self._ledger.answered(link, (delivery[DELIVER_DEADLINE],), now):
            self._grant_if_running(now)

    def _requeue_now(self, link: Link, delivery: Deliver) -> None:
        """REQ 0 for a message the user will not answer (drain, failure, pull's hold)."""
        message_id = delivery.id
        del link.tracked[message_id]
        link.touched.pop(message_id, None)
        link.seen.discard(message_id)
        assert link.proto is not None
        if link.proto.is_in_flight(message_id):
            self._ledger.emit(link)  # drain's RDY 0 goes before the REQ
            link.proto.requeue(message_id, 0.0)
            self._dirty.add(link.conn_id)
            self.requeued += 1

    # --- shared helpers ------------------------------------------------------------------------

    def _act(self, action: Action) -> None:
        """Queue ``action`` for :meth:`take_actions` (the parts report through this)."""
        self._actions.append(action)

    def _report_gone(self, delivery: Deliver, command: str) -> None:
        self.taken_back += 1
        self._act(
            TakenBack(
                delivery.conn_id,
                delivery.address,
                delivery.id,
                command,
                MessageGone(
                    f"{command} for message {delivery.id.decode('ascii', 'replace')} from "
                    f"{delivery.address}: "
                    "it is no longer in flight on this consumer (connection closed, requeued "
                    "by drain, or delivered again after timing out)"
                ),
                delivery,
            )
        )

"""What the consumer coordinator knows (:class:`CoordinatorState`), and what it answers about it.

The bottom layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`: every field the layers
above share (links by id and by address, the actions decided, the RDY ledger's totals, the
fetch queue, backoff, the lookupd poller, the direct addresses' retries, counters), the
read-only queries a transport or a metrics scrape makes, :meth:`~CoordinatorState.next_deadline`,
and the few helpers every layer uses. It decides nothing.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterable

from ..backoff import Backoff, BackoffPhase
from ..config import Config
from ..discovery import LookupdAddress, LookupdPoller, NSQDAddress, NSQDFilter
from ..errors import ConfigError, LocalProtocolError, MessageGone, NSQError
from ..names import validate_channel, validate_topic
from ..rdy import is_starved
from .actions import Action, Deliver, TakenBack
from .fetches import FetchQueue
from .link import Link, LinkPhase
from .retry import DirectRetry

__all__ = ["ConsumerState", "CoordinatorState"]


class ConsumerState(enum.Enum):
    """The coordinator's lifecycle."""

    CREATED = "created"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"
    #: Stopped by an error reconnecting cannot cure (see :class:`ConsumerFailed`).
    FAILED = "failed"


class CoordinatorState:
    """The coordinator's fields and queries (see the module docstring); the layers above add
    what it does. ``nsqd`` are direct addresses (retried with backoff), ``lookupd`` are polled
    for producers; ``rng`` makes every random choice replayable; ``pull`` selects pull mode;
    ``nsqd_filter`` decides which addresses lookupd lists are connected to (all by default)."""

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
        self._identify = self._config.identify_body()
        self._state = ConsumerState.CREATED
        self._direct: dict[NSQDAddress, DirectRetry] = {}
        for address in nsqd:
            self._direct.setdefault(NSQDAddress.parse(address), DirectRetry())
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
        if not self._direct and self._poller is None:
            raise LocalProtocolError("a consumer needs at least one nsqd or lookupd address")
        if nsqd_filter is not None and not callable(nsqd_filter):
            raise ConfigError(
                f"nsqd_filter must be callable (NSQDAddress -> bool), got {nsqd_filter!r}"
            )
        self._nsqd_filter = nsqd_filter
        #: Addresses the filter refused, each reported once (bounded: see connections.py).
        self._refused_nodes: set[NSQDAddress] = set()
        self._backoff = Backoff(
            self._config.backoff_multiplier,
            self._config.max_backoff_duration,
            enabled=self._config.backoff_enabled,
        )
        #: What BackoffChanged last reported: (phase, windows opened, level).
        self._backoff_reported = (BackoffPhase.NORMAL, 0, 0)
        self._links: dict[int, Link] = {}
        self._by_address: dict[NSQDAddress, Link] = {}
        self._next_conn_id = 1
        self._next_fetch_id = 1
        self._actions: list[Action] = []
        self._dirty: set[int] = set()
        #: Connections with an RDY decided but not handed to the connection yet; written by
        #: pending_data(), decreases first, so that the sum of RDY nsqd sees never exceeds
        #: max_in_flight, not even between two writes.
        self._rdy_due: set[int] = set()
        self._total_rdy = 0
        #: Sum of every connection's ``claim`` (max of its RDY and its ceiling): what may end
        #: up held; a raise never takes it over max_in_flight.
        self._claimed = 0
        #: Connections whose ceiling is above their written RDY (a lowered RDY whose old
        #: capacity may still be in use): answers there return budget, so none is calm.
        self._settling: set[int] = set()
        self._alloc_total = 0
        self._fetches = FetchQueue()
        self._next_redistribute: float | None = None
        #: Pull mode with fewer RDY than connections while a fetch waits: when to check
        #: whether a holder that delivers nothing should pass its RDY on.
        self._rotate_at: float | None = None
        self._drain_deadline: float | None = None
        #: Pull mode: the next deadline of a held message (the budget grows when it passes).
        self._next_expiry: float | None = None
        #: Pull mode: counts messages, so the link that delivered last is known exactly.
        self._pull_seq = 0
        #: True while running in push mode outside backoff: answers need no bookkeeping
        #: beyond the FIN itself (the hot path's test).
        self._calm = False
        #: Set by the first mark_delivered(): from then on only marked deliveries count as
        #: handed to user code, and drain requeues the others at once.
        self._explicit_delivery = False
        self._max_attempts = self._config.max_attempts
        #: A given-up message is handed to the transport (DeadLetter) instead of FIN'd here.
        self._dead_letter = bool(dead_letter)
        #: Deliveries handed over as DeadLetter and not reported on yet, by identity (nsqd
        #: may send the same id again meanwhile: each handle is reported on once).
        self._dead_letters: dict[int, Deliver] = {}
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

    # --- introspection -------------------------------------------------------------------------
    # These only read (containers are copied in one C-level step before they are walked), so
    # a transport may call them from another thread (a metrics scrape) while its own thread
    # drives the coordinator: they never raise for that; a figure may be a moment old.

    @property
    def state(self) -> ConsumerState:
        return self._state

    @property
    def config(self) -> Config:
        return self._config

    @property
    def failure(self) -> NSQError | None:
        """Why the consumer failed (state ``FAILED``), else None."""
        return self._failure

    @property
    def max_in_flight(self) -> int:
        return self._config.max_in_flight

    @property
    def total_rdy(self) -> int:
        """Sum of the last RDY sent on every connection (never above max_in_flight)."""
        return self._total_rdy

    @property
    def backoff_phase(self) -> BackoffPhase:
        return self._backoff.phase

    @property
    def backoff_level(self) -> int:
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

    def connection_ids(self) -> list[int]:
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
        nodes = set(self._direct)
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
        link = self._current(delivery)
        if link is None:
            return None
        return link.touched.get(delivery.id, delivery.deadline)

    def max_deadline(self, delivery: Deliver) -> float | None:
        """The furthest TOUCH can push the deadline (received + the server's max_msg_timeout)."""
        link = self._current(delivery)
        if link is None:
            return None
        return delivery.received_at + link.max_msg_timeout

    def next_touch(self, delivery: Deliver) -> float | None:
        """For long jobs: when to TOUCH next to keep the message, half-way to its
        deadline; None when it is no longer ours or TOUCH cannot extend it any more (the
        server's max_msg_timeout is reached: finish before :meth:`max_deadline`). The
        coordinator never touches by itself."""
        link = self._current(delivery)
        if link is None:
            return None
        deadline = link.touched.get(delivery.id, delivery.deadline)
        if deadline >= delivery.received_at + link.max_msg_timeout:
            return None
        return deadline - link.msg_timeout / 2

    # --- output and timers ---------------------------------------------------------------------

    def take_actions(self) -> list[Action]:
        """Everything decided since the last call, in order."""
        actions = self._actions
        self._actions = []
        return actions

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must be called next (None: only on IO)."""
        candidates: list[float] = []
        if self._state is ConsumerState.RUNNING:
            if self._backoff.deadline is not None:
                candidates.append(self._backoff.deadline)
            if self._next_redistribute is not None and self._links:
                candidates.append(self._next_redistribute)
            for conn_id in self._settling:
                settle_at = self._links[conn_id].settle_at
                if settle_at is not None:
                    candidates.append(settle_at)
            if self._poller is not None:
                poll = self._poller.next_deadline()
                if poll is not None:
                    candidates.append(poll)
            for retry in self._direct.values():
                if retry.retry_at is not None:
                    candidates.append(retry.retry_at)
            if self._pull:
                pull = self._fetches.next_deadline()
                if pull is not None:
                    candidates.append(pull)
                if self._next_expiry is not None and self._fetches.waiting:
                    candidates.append(self._next_expiry)
                if self._rotate_at is not None and self._fetches.waiting:
                    candidates.append(self._rotate_at)
        elif self._state is ConsumerState.DRAINING and self._drain_deadline is not None:
            candidates.append(self._drain_deadline)
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

    # --- shared helpers ------------------------------------------------------------------------

    def _current(self, delivery: Deliver) -> Link | None:
        """The link of a delivery that is still in flight here, else None."""
        link = self._links.get(delivery.conn_id)
        if link is None or link.tracked.get(delivery.id) is not delivery:
            return None
        return link

    def _report_gone(self, delivery: Deliver, command: str) -> None:
        self.taken_back += 1
        self._actions.append(
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

    def _recalm(self) -> None:
        self._calm = (
            self._state is ConsumerState.RUNNING
            and not self._pull
            and self._backoff.phase is BackoffPhase.NORMAL
            and not self._settling
        )

    def _subscribed(self) -> list[Link]:
        return [link for link in self._links.values() if link.phase is LinkPhase.SUBSCRIBED]

    def _budget(self) -> int:
        if self._state is not ConsumerState.RUNNING:
            return 0
        return self._backoff.rdy_budget(self._config.max_in_flight)

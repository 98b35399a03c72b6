"""The connections (:class:`Connections`): opened, set up, timed out, lost; lookupd's answers;
the consumer's failure.

Rules:

* A connection is opened for each configured nsqd at start, and for each address a lookupd
  answer lists that the ``nsqd_filter`` accepts and that has no connection yet (an address
  refused is reported once, :class:`~nsq_sansio.consumer.actions.NodeRefused`, up to
  ``_MAX_REFUSED_REPORTED`` of them). A lookupd answer listing no nsqd is counted and
  reported once (:class:`~nsq_sansio.consumer.actions.TopicNotFound`) while no lookupd lists
  one.
* Its phases: ``CONNECTING`` -> ``HANDSHAKING`` (TCP up, IDENTIFY queued) -> ``SUBSCRIBED``
  (SUB answered; nsqd's settings read) -> ``CLOSING`` (drain's CLS). A connection not
  subscribed within ``connect_timeout``, or that does not answer CLS by its close deadline,
  is cut.
* A connection lost forgets its RDY and its messages (nsqd requeues them) and is reported
  (:class:`~nsq_sansio.consumer.actions.Disconnected`); a configured address is tried again
  with backoff while the consumer runs (:mod:`~nsq_sansio.consumer.retry`), lookupd's are
  connected again by a later answer that still lists them.
* nsqd refusing the configuration (``IncompatibleNSQD``) fails the consumer for good: the
  configuration is the same for every nsqd, so one refusal stops it (what is in flight is
  requeued at once, every connection closed, ``ConsumerFailed``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..backoff import Backoff
from ..config import Config
from ..connection import ClientConnection
from ..discovery import (
    LookupAnswer,
    LookupdAddress,
    LookupdPoller,
    LookupFailure,
    NSQDAddress,
    NSQDFilter,
)
from ..errors import ConnectionLost, IncompatibleNSQD, NSQError
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
from .actions import (
    Action,
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConnectionUp,
    ConsumerFailed,
    Deliver,
    Disconnected,
    FetchEnd,
    LookupdFailed,
    NodeRefused,
    SendHTTPRequest,
    StartTLS,
    TopicNotFound,
)
from .answers import Answers
from .distribution import RdyDistribution
from .drain import Drain
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle, LifecycleEvent
from .link import RDY_SETTLE_MIN, Link, LinkPhase
from .pull import PullMode
from .retry import Retries

__all__ = ["Connections", "lookupd_poller"]

#: Refused addresses reported (each once); beyond this many, the others are refused silently.
_MAX_REFUSED_REPORTED = 1024

#: The shortest time :meth:`Connections.read_pause_limit` gives (a quarter of the shortest
#: message timeout nsqd lets a client ask for): an nsqd announcing an absurdly short timeout
#: or heartbeat interval does not get the paused connection read at a higher pace.
_MIN_READ_PAUSE = 0.25


def lookupd_poller(
    lookupds: list[LookupdAddress], topic: str, config: Config, rng: random.Random
) -> LookupdPoller | None:
    """The poller asking ``lookupds`` for ``topic``'s producers (None: no lookupd)."""
    if not lookupds:
        return None
    return LookupdPoller(
        lookupds,
        topic,
        interval=config.lookupd_poll_interval,
        jitter=config.lookupd_poll_jitter,
        timeout=config.lookupd_poll_timeout,
        rng=rng,
        user_agent=config.user_agent,
    )


class Connections:
    """Every connection's life and lookupd's answers (see the module docstring). ``report``
    queues an action, ``on_message`` takes a message an event list carried, ``recalm``
    recomputes the coordinator's hot-path test when the consumer fails."""

    __slots__ = (
        "_answers",
        "_backoff",
        "_channel",
        "_config",
        "_dirty",
        "_drain",
        "_ledger",
        "_lifecycle",
        "_links",
        "_nsqd_filter",
        "_on_message",
        "_pull",
        "_pull_mode",
        "_rdy",
        "_recalm",
        "_report",
        "_retries",
        "_topic",
        "_topic_reported",
        "by_address",
        "failure",
        "next_conn_id",
        "poller",
        "refused_nodes",
        "topic_not_found",
    )

    def __init__(
        self,
        topic: str,
        channel: str,
        config: Config,
        links: dict[int, Link],
        dirty: set[int],
        poller: LookupdPoller | None,
        nsqd_filter: NSQDFilter | None,
        *,
        lifecycle: Lifecycle,
        ledger: RdyLedger,
        backoff: Backoff,
        retries: Retries,
        pull_mode: PullMode,
        drain: Drain,
        rdy: RdyDistribution,
        answers: Answers,
        report: Callable[[Action], None],
        on_message: Callable[[Link, Deliver, float], None],
        recalm: Callable[[], None],
        pull: bool,
    ) -> None:
        self._topic = topic
        self._channel = channel
        self._config = config
        self._links = links
        self._dirty = dirty
        self.poller = poller
        self._nsqd_filter = nsqd_filter
        self._lifecycle = lifecycle
        self._ledger = ledger
        self._backoff = backoff
        self._retries = retries
        self._pull_mode = pull_mode
        self._drain = drain
        self._rdy = rdy
        self._answers = answers
        self._report = report
        self._on_message = on_message
        self._recalm = recalm
        self._pull = pull
        #: Every connection not closed yet, by address (one per address).
        self.by_address: dict[NSQDAddress, Link] = {}
        self.next_conn_id = 1
        #: Addresses the filter refused, each reported once (bounded).
        self.refused_nodes: set[NSQDAddress] = set()
        #: lookupd answers that listed no nsqd for the topic (TopicNotFound says it once).
        self.topic_not_found = 0
        self._topic_reported = False
        #: Why the consumer failed (state FAILED), else None.
        self.failure: NSQError | None = None

    # --- opening -------------------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Connect to the configured nsqd and ask every lookupd."""
        for address in self._retries.direct:
            self.connect(address, now)
        if self.poller is not None:
            for request in self.poller.start(now):
                self._report(SendHTTPRequest(request.request_id, request.lookupd, request.data))

    def connect(self, address: NSQDAddress, now: float) -> None:
        """Open a connection to ``address`` (``Connect``)."""
        conn_id = self.next_conn_id
        self.next_conn_id += 1
        link = Link(conn_id, address, now + self._config.connect_timeout)
        self._links[conn_id] = link
        self.by_address[address] = link
        self._report(Connect(conn_id, address))

    def made(self, conn_id: int, now: float) -> None:
        """TCP is up for ``conn_id``: IDENTIFY is queued."""
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

    def failed(self, conn_id: int, error: BaseException | str | None, now: float) -> None:
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
        self.drop(link, nsq_error, now, close=False)

    def tls_established(self, conn_id: int) -> None:
        """The TLS handshake asked by ``StartTLS`` succeeded."""
        link = self._links.get(conn_id)
        if link is None or link.proto is None:
            return
        link.proto.tls_established()
        self._dirty.add(conn_id)

    # --- events of a connection ----------------------------------------------------------------

    def on_event(self, link: Link, event: object, now: float) -> None:
        """An event of ``link``'s protocol other than a fresh message."""
        if isinstance(event, Deliver):
            self._on_message(link, event, now)
        elif isinstance(event, MessageTakenBack):
            self._answers.refused(link, event, now)
        elif isinstance(event, TLSUpgradeRequired):
            self._report(StartTLS(link.conn_id, event.trailing_data))
        elif isinstance(event, ConnectionReady):
            assert link.proto is not None
            if self._lifecycle.state is not ConsumerState.RUNNING:
                self.drop(link, None, now, close=True)
                return
            link.proto.subscribe(self._topic, self._channel)
            self._dirty.add(link.conn_id)
        elif isinstance(event, Subscribed):
            self._subscribed(link, now)
        elif isinstance(event, CloseWait):
            link.close_wait = True
            self._drain.maybe_close(link, now)
            self._drain.check_done()
        elif isinstance(event, ConnectionClosed):
            self.drop(link, event.error, now, close=True)

    def _subscribed(self, link: Link, now: float) -> None:
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
        self._report(ConnectionUp(link.conn_id, link.address, settings))
        if not running:
            self._drain.maybe_close(link, now)
            return
        self._rdy.rebalance(now)

    def read_pause_limit(self, conn_id: int) -> float | None:
        """How long a subscribed connection may be left unread (see the coordinator's
        method): half the shorter of the heartbeat interval and half the message timeout."""
        link = self._links.get(conn_id)
        if link is None or link.phase is not LinkPhase.SUBSCRIBED or link.proto is None:
            return None
        proto = link.proto
        limit = proto.settings.msg_timeout / 4000 if proto.settings is not None else 15.0
        if proto.heartbeat_interval is not None:
            limit = min(limit, proto.heartbeat_interval / 2)
        return max(limit, _MIN_READ_PAUSE)

    # --- lookupd -------------------------------------------------------------------------------

    def on_lookup(
        self, request_id: int, outcome: LookupAnswer | LookupFailure | None, now: float
    ) -> None:
        """A lookupd request ended (``outcome`` None: not yet)."""
        if outcome is None:
            return
        self._report(CloseHTTPRequest(request_id))
        if isinstance(outcome, LookupFailure):
            self._report(LookupdFailed(outcome.lookupd, outcome.error))
            return
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return
        self._note_producers(outcome)
        accepts = self._nsqd_filter
        for address in outcome.producers:
            if address in self.by_address:
                continue
            if accepts is not None and not accepts(address):
                refused = self.refused_nodes
                if address not in refused and len(refused) < _MAX_REFUSED_REPORTED:
                    refused.add(address)
                    self._report(NodeRefused(outcome.lookupd, address))
                continue
            self.connect(address, now)

    def _note_producers(self, answer: LookupAnswer) -> None:
        """Count a lookupd answer that lists no nsqd for the topic, and report it once
        (:class:`TopicNotFound`) while no lookupd lists one; a listed producer re-arms it."""
        if answer.producers:
            self._topic_reported = False
            return
        self.topic_not_found += 1
        assert self.poller is not None
        if not self._topic_reported and not self.poller.known_nodes():
            self._topic_reported = True
            self._report(TopicNotFound(answer.lookupd, self._topic))

    def discovery_due(self, now: float) -> None:
        """Poll lookupd and reconnect direct addresses when their time came."""
        if self.poller is not None:
            requests, failures = self.poller.poll_due(now)
            for request_id, failure in failures:
                self.on_lookup(request_id, failure, now)
            for request in requests:
                self._report(SendHTTPRequest(request.request_id, request.lookupd, request.data))
        for address in self._retries.due(now):
            if address not in self.by_address:
                self.connect(address, now)

    # --- timers, closing, loss -----------------------------------------------------------------

    def next_deadline(self) -> list[float]:
        """Every connection's handshake, close and heartbeat deadline."""
        candidates: list[float] = []
        for link in self._links.values():
            if link.handshake_deadline is not None:
                candidates.append(link.handshake_deadline)
            if link.close_deadline is not None:
                candidates.append(link.close_deadline)
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None:
                    candidates.append(beat)
        return candidates

    def timers(self, now: float) -> None:
        """Drop connections past their handshake or close deadline; run heartbeat timers."""
        for link in list(self._links.values()):
            if link.conn_id not in self._links:
                continue  # dropped while handling another one
            if link.handshake_deadline is not None and now >= link.handshake_deadline:
                self.drop(
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
                self.drop(link, None, now, close=True)
                continue
            if link.proto is not None:
                beat = link.proto.next_deadline()
                if beat is not None and now >= beat:
                    events = link.proto.handle_timer(now)
                    if events:
                        self.close_from_events(link, events, now)

    def close(self, link: Link, now: float) -> None:
        """Close ``link`` on purpose (drain): no error."""
        self.drop(link, None, now, close=True)

    def drop(self, link: Link, error: NSQError | None, now: float, *, close: bool) -> None:
        """Forget a connection: its RDY, its messages (nsqd requeues them), maybe reconnect."""
        conn_id = link.conn_id
        if self._links.pop(conn_id, None) is None:
            return
        if self.by_address.get(link.address) is link:
            del self.by_address[link.address]
        self._ledger.forget(link)
        self._pull_mode.release(link)
        final = b""
        if link.proto is not None:
            final = link.proto.data_to_send()
            link.proto.close()
        if close:
            self._report(CloseConnection(conn_id, final))
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
            self._report(Disconnected(conn_id, link.address, error, unanswered, reconnect_at))
        if refused:
            assert error is not None
            self.fail(error, now)
        elif running:
            self._rdy.rebalance(now)
        else:
            self._drain.check_done()

    def close_from_events(self, link: Link, events: list[Event], now: float) -> None:
        """A read or timer ended with the connection closed: report, then drop it."""
        error: NSQError | None = ConnectionLost(f"connection {link.conn_id} closed")
        for event in events:
            if isinstance(event, MessageTakenBack):
                self._answers.refused_at_close(link, event)
            elif isinstance(event, ConnectionClosed):
                error = event.error
        self.drop(link, error, now, close=True)

    # --- the consumer stops --------------------------------------------------------------------

    def fail(self, error: NSQError, now: float) -> None:
        """Stop for good (:class:`ConsumerFailed`): no reconnect, no lookupd poll; what is in
        flight is requeued at once (nobody can answer it any more) and every connection
        closed. One rule for every node: the configuration is the same for all of them, so
        one refusal fails the consumer rather than leaving that nsqd's messages unread."""
        self._lifecycle.apply(LifecycleEvent.FAIL)
        self.failure = error
        self._recalm()
        self.stop_requests()
        for link in self._links.values():
            link.accepting = False
            if link.phase is LinkPhase.SUBSCRIBED:
                if link.rdy:
                    self._ledger.send(link, 0, now)  # before the REQs, as a drain does
                for delivery in list(link.tracked.values()):
                    self._answers.requeue_now(link, delivery)
        if self._pull:  # what they gathered was just requeued: the answers are empty
            self._pull_mode.end_all(FetchEnd.FAILED, emptied=True)
            self._pull_mode.fetches.buffer.clear()
        for link in list(self._links.values()):
            self.drop(link, None, now, close=True)
        self._report(ConsumerFailed(error))

    def stop_requests(self) -> None:
        """The consumer stops (drain, failure): backoff, lookupd polls and reconnects end."""
        self._backoff.reset()
        if self.poller is not None:
            for request_id in self.poller.stop():
                self._report(CloseHTTPRequest(request_id))
        self._retries.stop()

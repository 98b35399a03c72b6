"""Connections of the consumer coordinator (:class:`Connections`): open, lose, reconnect, fail.

The fifth layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`, and its discovery glue.
Direct addresses are connected at :meth:`~Connections.start` and, when lost, retried on their
:class:`~nsq_sansio.consumer.retry.DirectRetry` schedule; lookupd answers
(:mod:`nsq_sansio.discovery`) connect the producers not connected yet (those the
``nsqd_filter`` accepts: a refused one is reported once, :class:`NodeRefused`), and a lost one
comes back only when a later poll lists it; a topic no lookupd lists an nsqd for is reported
once (:class:`~nsq_sansio.consumer.actions.TopicNotFound`) and counted. ``_drop`` forgets a
connection (its RDY, its messages: nsqd requeues them) and reports
:class:`~nsq_sansio.consumer.actions.Disconnected`; an nsqd that cannot serve the
configuration (:class:`~nsq_sansio.errors.IncompatibleNSQD`: IDENTIFY refused, nsqd's HTTP
port, TLS it does not offer...) fails the consumer for good (``_fail``,
:class:`ConsumerFailed`). Handshake, close and heartbeat deadlines of each connection are
checked by ``_link_timers``.
"""

from __future__ import annotations

from ..connection import ClientConnection
from ..discovery import LookupAnswer, LookupFailure, NSQDAddress
from ..errors import ConnectionLost, IncompatibleNSQD, LocalProtocolError, NSQError
from ..events import ConnectionClosed, Event, MessageTakenBack
from .actions import (
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConsumerFailed,
    Disconnected,
    DrainComplete,
    FetchEnd,
    LookupdFailed,
    NodeRefused,
    SendHTTPRequest,
    TakenBack,
    TopicNotFound,
)
from .link import Link, LinkPhase
from .pull import PullMode
from .state import ConsumerState

__all__ = ["Connections"]

#: Refused addresses reported (each once); beyond this many, the others are refused silently.
_MAX_REFUSED_REPORTED = 1024

#: The shortest time :meth:`Connections.read_pause_limit` gives (a quarter of the shortest
#: message timeout nsqd lets a client ask for): an nsqd announcing an absurdly short timeout
#: or heartbeat interval does not get the paused connection read at a higher pace than that.
_MIN_READ_PAUSE = 0.25


class Connections(PullMode):
    """Connecting, losing and failing (see the module docstring)."""

    def start(self, now: float) -> None:
        """Connect to the configured nsqd and ask every lookupd (bootstrap)."""
        if self._state is not ConsumerState.CREATED:
            raise LocalProtocolError(f"start() in state {self._state.name}: call it once")
        self._state = ConsumerState.RUNNING
        self._recalm()
        self._next_redistribute = now + self._config.rdy_redistribute_interval
        for address in self._direct:
            self._connect(address, now)
        if self._poller is not None:
            for request in self._poller.start(now):
                self._actions.append(
                    SendHTTPRequest(request.request_id, request.lookupd, request.data)
                )

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
        self._actions.append(CloseHTTPRequest(request_id))
        if isinstance(outcome, LookupFailure):
            self._actions.append(LookupdFailed(outcome.lookupd, outcome.error))
            return
        if self._state is not ConsumerState.RUNNING:
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
                    self._actions.append(NodeRefused(outcome.lookupd, address))
                continue
            self._connect(address, now)

    # --- transport -> coordinator: reading -----------------------------------------------------

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
            self._actions.append(TopicNotFound(answer.lookupd, self.topic))

    # --- timers --------------------------------------------------------------------------------

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

    def _discovery_due(self, now: float) -> None:
        """Poll lookupd and reconnect direct addresses when their time came."""
        if self._poller is not None:
            requests, failures = self._poller.poll_due(now)
            for request_id, failure in failures:
                self._on_lookup(request_id, failure, now)
            for request in requests:
                self._actions.append(
                    SendHTTPRequest(request.request_id, request.lookupd, request.data)
                )
        for address, retry in self._direct.items():
            if retry.retry_at is not None and now >= retry.retry_at:
                retry.retry_at = None
                if address not in self._by_address:
                    self._connect(address, now)

    # --- internals -----------------------------------------------------------------------------

    def _connect(self, address: NSQDAddress, now: float) -> None:
        conn_id = self._next_conn_id
        self._next_conn_id += 1
        link = Link(conn_id, address, now + self._config.connect_timeout)
        self._links[conn_id] = link
        self._by_address[address] = link
        self._actions.append(Connect(conn_id, address))

    def _drop(self, link: Link, error: NSQError | None, now: float, *, close: bool) -> None:
        """Forget a connection: its RDY, its messages (nsqd requeues them), maybe reconnect."""
        conn_id = link.conn_id
        if self._links.pop(conn_id, None) is None:
            return
        if self._by_address.get(link.address) is link:
            del self._by_address[link.address]
        self._dirty.discard(conn_id)
        self._rdy_due.discard(conn_id)
        self._total_rdy -= link.rdy
        self._alloc_total -= link.alloc
        self._claimed -= link.claim
        link.rdy = link.alloc = link.target = link.claim = link.ceiling = 0
        if self._settling:
            self._settling.discard(conn_id)
            if not self._settling:
                self._recalm()
        final = b""
        if link.proto is not None:
            final = link.proto.data_to_send()
            link.proto.close()
        if close:
            self._actions.append(CloseConnection(conn_id, final))
        unanswered = tuple(link.tracked)
        link.tracked.clear()
        link.touched.clear()
        link.seen.clear()
        link.accepting = False
        if self._pull and unanswered:
            self._forget_pull_messages(conn_id)
        # nsqd refused the configuration: reconnecting cannot help, the consumer fails.
        refused = isinstance(error, IncompatibleNSQD) and self._state is ConsumerState.RUNNING
        reconnect_at: float | None = None
        retry = self._direct.get(link.address)
        if retry is not None and self._state is ConsumerState.RUNNING and not refused:
            reconnect_at = retry.schedule(now, self._config, self._rng)
        if link.phase is not LinkPhase.CONNECTING or error is not None:
            self._actions.append(
                Disconnected(conn_id, link.address, error, unanswered, reconnect_at)
            )
        if refused:
            assert error is not None
            self._fail(error, now)
        elif self._state is ConsumerState.RUNNING:
            self._rebalance(now)
        else:
            self._check_drained()

    def _fail(self, error: NSQError, now: float) -> None:
        """Stop for good (:class:`ConsumerFailed`): no reconnect, no lookupd poll; what is in
        flight is requeued at once (nobody can answer it any more) and every connection
        closed. One rule for every node: the configuration is the same for all of them, so
        one refusal fails the consumer rather than leaving that nsqd's messages unread."""
        self._state = ConsumerState.FAILED
        self._failure = error
        self._calm = False
        self._backoff.reset()
        if self._poller is not None:
            for request_id in self._poller.stop():
                self._actions.append(CloseHTTPRequest(request_id))
        for retry in self._direct.values():
            retry.retry_at = None
        for link in self._links.values():
            link.accepting = False
            if link.phase is LinkPhase.SUBSCRIBED:
                if link.rdy:
                    self._send_rdy(link, 0, now)  # before the REQs, as a drain does
                for delivery in list(link.tracked.values()):
                    self._requeue_now(link, delivery)
        if self._pull:  # what they gathered was just requeued: the answers are empty
            for fetch in self._fetches.take_all():
                fetch.messages = []
                self._answer_fetch(fetch, FetchEnd.FAILED)
            self._fetches.buffer.clear()
        for link in list(self._links.values()):
            self._drop(link, None, now, close=True)
        self._actions.append(ConsumerFailed(error))

    def _check_drained(self) -> None:
        if self._state is ConsumerState.DRAINING and not self._links:
            self._state = ConsumerState.CLOSED
            self._drain_deadline = None
            self._actions.append(DrainComplete())

    def _close_from_events(self, link: Link, events: list[Event], now: float) -> None:
        error: NSQError | None = ConnectionLost(f"connection {link.conn_id} closed")
        for event in events:
            if isinstance(event, MessageTakenBack):
                self.taken_back += 1
                self._actions.append(
                    TakenBack(
                        link.conn_id, link.address, event.message_id, event.command, event.error
                    )
                )
            elif isinstance(event, ConnectionClosed):
                error = event.error
        self._drop(link, error, now, close=True)

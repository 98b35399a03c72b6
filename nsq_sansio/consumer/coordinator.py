"""The consumer coordinator itself (:class:`ConsumerCoordinator`): messages in, and the layers
composed.

The top layer: what nsqd sends (:meth:`~ConsumerCoordinator.receive_data`, the per-message hot
path, and the connection's other events: subscription, CLOSE_WAIT, refused answers, errors),
and the timer that calls each layer's due work in turn. Everything else comes from the layers
below, one concern each (see :mod:`nsq_sansio.consumer`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter
from typing import cast

from ..backoff import Outcome
from ..connection import ConnectionState
from ..events import (
    CloseWait,
    ConnectionClosed,
    ConnectionReady,
    MessageTakenBack,
    ServerSettings,
    Subscribed,
    TLSUpgradeRequired,
)
from ..rdy import needs_refresh
from .actions import ConnectionUp, DeadLetter, Deliver, GiveUp, StartTLS, TakenBack
from .dead_letters import DeadLetters
from .link import RDY_SETTLE_MIN, Link, LinkPhase
from .retry import over_attempts
from .state import ConsumerState

__all__ = ["ConsumerCoordinator"]

_attempts: Callable[[Deliver], int] = itemgetter(4)  # Deliver.attempts


class ConsumerCoordinator(DeadLetters):
    """Decides, for one topic/channel, what every nsqd connection sends and when.

    ``nsqd`` are direct addresses (retried with backoff), ``lookupd`` are polled for producers.
    ``rng`` makes every random choice (jitter, which connection gets RDY) replayable. ``pull``
    selects pull mode: messages only flow for :meth:`fetch` requests. ``dead_letter``: a
    message over ``max_attempts`` is not FIN'd here but handed to the transport as
    :class:`~nsq_sansio.consumer.actions.DeadLetter` to publish first.
    """

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
                if event[4] > attempts_limit:
                    self._on_message(link, event, now)
                    continue
                if setdefault(event[1], event) is not event:  # nsqd resent a held id
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

    def handle_timer(self, now: float) -> None:
        """Do whatever is due at ``now``; call it when :meth:`next_deadline` passes."""
        self._link_timers(now)
        if self._state is ConsumerState.DRAINING:
            self._drain_due(now)
            return
        if self._state is not ConsumerState.RUNNING:
            return
        if self._backoff.handle_timer(now, self.in_flight_count()):
            self._backoff_moved(now)
        if self._settling:
            self._settle_due(now)
        if self._next_redistribute is not None and now >= self._next_redistribute:
            self._next_redistribute = now + self._config.rdy_redistribute_interval
            self._redistribute(now)
        self._discovery_due(now)
        if self._pull:
            self._pull_due(now)

    # --- internals: messages and connection events ---------------------------------------------

    def _one_by_one(self, link: Link, events: list[object], now: float) -> None:
        """A read's events, each on its own (every case the fast paths leave)."""
        for event in events:
            if type(event) is Deliver:
                self._on_message(link, event, now)
            else:
                self._on_event(link, event, now)
                if link.conn_id not in self._links:
                    return

    def _take_late(self, link: Link, arriving: int, now: float) -> bool:
        """``arriving`` more messages on ``link`` than its claim covers: nsqd sent them under
        an RDY it had not read as lowered when the settle time released that capacity (a
        partition held the bytes longer). True when they fit anyway (the ceiling grows into
        budget nobody claims); False: what does not fit must be handed back.

        A held message near its deadline (less than a settle time ahead: nsqd's deadline runs
        from its send, before ours) may already be taken back by nsqd, which may fill its slot:
        handing that message back would have nsqd send it again, again and again. So what
        arrives is taken when it fits the claim without the messages nsqd may have timed out,
        and the RDY written, which nsqd may be using, covers it. Beyond that RDY nsqd sent under
        an older, higher one (a partition held the lower one back), and the messages near their
        deadline count: nsqd may not have timed them out yet."""
        live = link.live_count(now)[0] + arriving
        if live <= link.claim:
            return True
        if link.live_count(now + link.settle_delay)[0] + arriving <= link.wire_rdy:
            return True  # into slots nsqd's timeouts freed, under the RDY it has
        excess = live - link.claim
        if (
            self._state is not ConsumerState.RUNNING
            or self._claimed + excess > self._config.max_in_flight
        ):
            return False
        link.ceiling = live
        self._reclaim(link)
        if link.ceiling > link.wire_rdy and link.conn_id not in self._settling:
            self._settling.add(link.conn_id)
            self._calm = False
            link.settle_at = now + link.settle_delay
        return True

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
                    self._forget_gathered(previous)
                self._report_gone(previous, "TIMEOUT")
        if not proto.is_in_flight(message_id):
            return  # a copy earlier in this read was already answered: nsqd has one copy only
        if not link.accepting:
            self._emit_rdy(link)  # RDY 0 goes before the REQ
            proto.requeue(message_id, 0.0)  # draining: give it to another consumer at once
            self.requeued += 1
            return
        if over_attempts(delivery.attempts, self._max_attempts):
            if self._dead_letter:
                # Held as if in user code until the transport reports the publish: FIN'd
                # only once it is stored elsewhere, requeued if that failed.
                link.tracked[message_id] = delivery
                if self._explicit_delivery:  # a drain must wait for it, not requeue it
                    link.marks = True
                    link.seen.add(message_id)
                self._dead_letters[id(delivery)] = delivery
                self._actions.append(DeadLetter(delivery))
                return
            proto.finish(message_id)
            self.given_up += 1
            self._actions.append(GiveUp(link.conn_id, link.address, delivery.message))
            if self._backoff.record(Outcome.SUCCESS, now):  # a give-up FINs: a success
                self._backoff_moved(now)
            return
        if link.held_count() >= link.claim and not self._take_late(link, 1, now):
            # Beyond max_in_flight (see _take_late): handed back, the user never sees it.
            self._emit_rdy(link)
            proto.requeue(message_id, 0.0)
            self.requeued += 1
            return
        link.tracked[message_id] = delivery
        if self._pull:
            self._on_pull_messages(link, [delivery], now)
            return
        self._actions.append(delivery)
        self._after_messages(link, now)

    def _after_messages(self, link: Link, now: float) -> None:
        """After messages arrived: warm a new connection up, refresh RDY when it runs low."""
        if not link.warm:
            link.warm = True
            self._rebalance(now)
        if link.target and needs_refresh(link.remaining, link.rdy):
            self._send_rdy(link, min(link.target, self._budget_left(link)), now)

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
            self._actions.append(
                TakenBack(
                    link.conn_id,
                    link.address,
                    event.message_id,
                    event.command,
                    event.error,
                    held,
                )
            )
            if self._state is ConsumerState.DRAINING:
                self._maybe_close_drained(link, now)
                self._check_drained()
        elif isinstance(event, TLSUpgradeRequired):
            self._actions.append(StartTLS(link.conn_id, event.trailing_data))
        elif isinstance(event, ConnectionReady):
            assert link.proto is not None
            if self._state is not ConsumerState.RUNNING:
                self._drop(link, None, now, close=True)
                return
            link.proto.subscribe(self.topic, self.channel)
            self._dirty.add(link.conn_id)
        elif isinstance(event, Subscribed):
            self._on_subscribed(link, now)
        elif isinstance(event, CloseWait):
            link.close_wait = True
            self._maybe_close_drained(link, now)
            self._check_drained()
        elif isinstance(event, ConnectionClosed):
            self._drop(link, event.error, now, close=True)

    def _on_subscribed(self, link: Link, now: float) -> None:
        proto = link.proto
        assert proto is not None
        settings = proto.settings or ServerSettings.default()
        link.phase = LinkPhase.SUBSCRIBED
        link.accepting = self._state is ConsumerState.RUNNING
        link.handshake_deadline = None
        link.settle_delay = max(RDY_SETTLE_MIN, 4 * (now - link.connected_at))
        link.max_rdy = max(1, settings.max_rdy_count)
        link.msg_timeout = settings.msg_timeout / 1000
        link.max_msg_timeout = max(settings.max_msg_timeout / 1000, link.msg_timeout)
        max_req = settings.raw.get("max_req_timeout") if settings.raw else None
        if isinstance(max_req, int) and not isinstance(max_req, bool) and max_req >= 0:
            link.max_req_timeout = max_req / 1000
        retry = self._direct.get(link.address)
        if retry is not None:
            retry.failures = 0
        self._actions.append(ConnectionUp(link.conn_id, link.address, settings))
        if self._state is not ConsumerState.RUNNING:
            self._maybe_close_drained(link, now)
            return
        self._rebalance(now)

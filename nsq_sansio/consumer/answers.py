"""The answers (:class:`Answers`): the user's REQ and TOUCH, the answers the consumer gives by
itself (give-ups, REQ 0), dead letters, late answers, and what an answer changes.

Rules:

* An answer is sent only for the handle the user holds: a handle no longer in flight on its
  connection (the connection closed, the message was requeued by a drain, or delivered again
  after timing out on nsqd) sends nothing and is reported as
  :class:`~nsq_sansio.consumer.actions.TakenBack`, never raised. nsqd refusing an answer
  (``E_FIN_FAILED``...) is reported the same way.
* REQ: the delay is ``default_requeue_delay * attempts`` capped when none is given (see
  :mod:`~nsq_sansio.consumer.retry`), else clamped to nsqd's ``max_req_timeout`` and to what
  the wire carries; a delay nsqd would refuse raises before anything is forgotten. A first
  failure is a backoff ``FAILURE``, a message that failed before a ``REPEATED_FAILURE``,
  ``backoff=False`` ``NEUTRAL``. When the REQ starts backoff, RDY 0 goes on the wire before it.
* TOUCH moves the deadline to ``now + msg_timeout``, never past ``received_at +
  max_msg_timeout``; a message past its deadline is not ours any more (nothing is sent).
* A message arriving over ``max_attempts`` is FIN'd and reported (``GiveUp``, a backoff
  success), or with dead letters held as if in user code and handed over (``DeadLetter``):
  FIN'd once the transport reports it stored, requeued (no backoff) if that failed. A message
  arriving while the consumer does not accept, or beyond what its connection may hold, is
  handed back at once (REQ 0, RDY written first).
* What an answer changes: a settling connection counts it (budget that came back is given
  out), backoff records its outcome, pull mode tops the connection up, a drain closes what
  holds nothing any more.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..backoff import Backoff, Outcome
from ..config import Config
from ..connection import MAX_COMMAND_DELAY, ClientConnection
from ..errors import LocalProtocolError, MessageGone
from ..events import MessageTakenBack
from .actions import DELIVER_DEADLINE, DELIVER_ID, Action, DeadLetter, Deliver, GiveUp, TakenBack
from .distribution import RdyDistribution
from .drain import Drain
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle
from .link import Link, current_link
from .pull import PullMode
from .retry import Retries, over_attempts

__all__ = ["Answers"]


class Answers:
    """Answers and their consequences (see the module docstring). ``report`` queues an
    action; the counters are the consumer's (``requeued``, ``given_up``, ``taken_back``,
    ``dead_lettered``, ``dead_letter_failures``)."""

    __slots__ = (
        "_backoff",
        "_config",
        "_dirty",
        "_drain",
        "_ledger",
        "_lifecycle",
        "_links",
        "_pull",
        "_pull_mode",
        "_rdy",
        "_report",
        "_retries",
        "dead_letter_failures",
        "dead_lettered",
        "explicit_delivery",
        "given_up",
        "requeued",
        "taken_back",
    )

    def __init__(
        self,
        config: Config,
        links: dict[int, Link],
        dirty: set[int],
        ledger: RdyLedger,
        lifecycle: Lifecycle,
        backoff: Backoff,
        retries: Retries,
        pull_mode: PullMode,
        drain: Drain,
        rdy: RdyDistribution,
        report: Callable[[Action], None],
        *,
        pull: bool,
    ) -> None:
        self._config = config
        self._links = links
        self._dirty = dirty
        self._ledger = ledger
        self._lifecycle = lifecycle
        self._backoff = backoff
        self._retries = retries
        self._pull_mode = pull_mode
        self._drain = drain
        self._rdy = rdy
        self._report = report
        self._pull = pull
        #: Set by the first mark_delivered(): from then on only marked deliveries count as
        #: handed to user code, and drain requeues the others at once.
        self.explicit_delivery = False
        self.requeued = 0
        self.given_up = 0
        self.taken_back = 0
        self.dead_lettered = 0
        self.dead_letter_failures = 0

    # --- REQ and TOUCH -------------------------------------------------------------------------

    def requeue(
        self, delivery: Deliver, now: float, delay: float | None = None, *, backoff: bool = True
    ) -> bool:
        """REQ (see :meth:`~nsq_sansio.consumer.ConsumerCoordinator.requeue`)."""
        if delay is not None:
            self.check_requeue_delay(delivery, delay)  # before anything is forgotten
        link = self.forget_answered(delivery, "REQ")
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
            self.report_gone(delivery, "REQ")
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
            self._rdy.backoff_moved(now)
            self._ledger.emit(link)
            link.proto.requeue(message_id, delay)
            self.requeued += 1
            if link.conn_id in self._ledger.settling:
                self.answered_while_settling(link, delivery, now)
            return True
        link.proto.requeue(message_id, delay)
        self.requeued += 1
        self.after_answer(link, outcome, now, delivery, recorded=True)
        return True

    def check_requeue_delay(self, delivery: Deliver, delay: float) -> None:
        """Raise for a REQ delay nsqd would not take, changing nothing."""
        if not (delay >= 0 and math.isfinite(delay)):
            raise LocalProtocolError(f"requeue delay must be >= 0 seconds, got {delay!r}")
        link = self._links.get(delivery.conn_id)
        proto = link.proto if link is not None else None
        limit = proto.max_req_timeout if proto is not None else None
        if limit is not None and delay > limit:
            raise ClientConnection._delay_error("requeue()", delay, limit, assumed=False)

    def requeue_delay(self, attempts: int, conn_id: int | None) -> float:
        """The automatic REQ delay, capped also by ``conn_id``'s server when given."""
        link = self._links.get(conn_id) if conn_id is not None else None
        return self._retries.requeue_delay(attempts, link)

    def touch(self, delivery: Deliver, now: float) -> float | None:
        """TOUCH; the new deadline, or None (and a TakenBack) when not ours."""
        link = current_link(self._links, delivery)
        if (
            link is None
            or link.proto is None
            or link.touched.get(delivery.id, delivery.deadline) <= now
        ):
            self.report_gone(delivery, "TOUCH")
            return None
        try:
            link.proto.touch(delivery.id)
        except LocalProtocolError:  # that id was already answered in the same read
            self.report_gone(delivery, "TOUCH")
            return None
        self._dirty.add(link.conn_id)
        deadline = min(now + link.msg_timeout, delivery.received_at + link.max_msg_timeout)
        link.marks = True
        link.touched[delivery.id] = deadline
        return deadline

    def deadline(self, delivery: Deliver) -> float | None:
        """When nsqd times the message out (after TOUCHes), None if no longer ours."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        return link.touched.get(delivery.id, delivery.deadline)

    def max_deadline(self, delivery: Deliver) -> float | None:
        """The furthest TOUCH can push the deadline, None if no longer ours."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        return delivery.received_at + link.max_msg_timeout

    def next_touch(self, delivery: Deliver) -> float | None:
        """When to TOUCH next (half-way to the deadline), None when not ours or at the cap."""
        link = current_link(self._links, delivery)
        if link is None:
            return None
        deadline = link.touched.get(delivery.id, delivery.deadline)
        if deadline >= delivery.received_at + link.max_msg_timeout:
            return None
        return deadline - link.msg_timeout / 2

    # --- messages answered here ----------------------------------------------------------------

    def on_message(self, link: Link, delivery: Deliver, now: float) -> None:
        """One message arrived on ``link`` (every case; the common one is inlined in the
        coordinator's ``receive_data``, which counts it): a copy sent again, a late one, one
        over max_attempts, one beyond the claim; else it is delivered."""
        link.remaining -= 1
        link.last_message_at = now
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
                self.report_gone(previous, "TIMEOUT")
        if not proto.is_in_flight(message_id):
            return  # a copy earlier in this read was already answered: nsqd has one copy only
        if not link.accepting:
            self._ledger.emit(link)  # RDY 0 goes before the REQ
            proto.requeue(message_id, 0.0)  # draining: give it to another consumer at once
            self.requeued += 1
            return
        if over_attempts(delivery.attempts, self._retries.max_attempts):
            if self._retries.dead_letter:
                # Held as if in user code until the transport reports the publish: FIN'd
                # only once it is stored elsewhere, requeued if that failed.
                link.tracked[message_id] = delivery
                if self.explicit_delivery:  # a drain must wait for it, not requeue it
                    link.marks = True
                    link.seen.add(message_id)
                self._retries.hand_over(delivery)
                self._report(DeadLetter(delivery))
                return
            proto.finish(message_id)
            self.given_up += 1
            self._report(GiveUp(link.conn_id, link.address, delivery.message))
            if self._backoff.record(Outcome.SUCCESS, now):  # a give-up FINs: a success
                self._rdy.backoff_moved(now)
            return
        if link.held_count() >= link.claim and not self._ledger.take_late(
            link, 1, now, may_grow=self._lifecycle.state is ConsumerState.RUNNING
        ):
            # Beyond max_in_flight (see the ledger's take_late): handed back, unseen by the user.
            self._ledger.emit(link)
            proto.requeue(message_id, 0.0)
            self.requeued += 1
            return
        link.tracked[message_id] = delivery
        if self._pull:
            self._pull_mode.on_messages(link, [delivery], now)
            return
        self._report(delivery)
        self._rdy.after_messages(link, now)

    # --- dead letters --------------------------------------------------------------------------

    def dead_letter_published(self, delivery: Deliver, now: float, topic: str | None) -> bool:
        """The DeadLetter was stored (see the coordinator's method): FIN and GiveUp."""
        self._retries.take_dead_letter(delivery)
        link = self.forget_answered(delivery, "FIN")
        if link is None:
            return False
        assert link.proto is not None
        message_id = delivery[DELIVER_ID]
        if not link.proto.is_in_flight(message_id):  # already answered in the same read
            self.report_gone(delivery, "FIN")
            return False
        link.proto.finish(message_id)
        self.given_up += 1
        if topic is not None:
            self.dead_lettered += 1
        self._report(GiveUp(link.conn_id, link.address, delivery.message, topic))
        # FIN'd after a give-up: a success for backoff, as a give-up without dead letters is
        self.after_answer(link, Outcome.SUCCESS, now, delivery)
        return True

    def dead_letter_failed(self, delivery: Deliver, now: float) -> bool:
        """The DeadLetter could not be published: requeue it (automatic delay, no backoff)."""
        self._retries.take_dead_letter(delivery)
        self.dead_letter_failures += 1
        return self.requeue(delivery, now, backoff=False)

    # --- what an answer changes ----------------------------------------------------------------

    def forget_answered(self, delivery: Deliver, command: str) -> Link | None:
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
        self.report_gone(delivery, command)
        return None

    def after_answer(
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
            self.answered_while_settling(link, delivery, now)
        state = self._lifecycle.state
        if state is ConsumerState.RUNNING:
            if not recorded and self._backoff.record(outcome, now):
                self._rdy.backoff_moved(now)
            elif self._pull:
                self._pull_mode.top_up(link, now)
        elif state is ConsumerState.DRAINING:
            self._drain.maybe_close(link, now)
            self._drain.check_done()

    def answered_while_settling(self, link: Link, delivery: Deliver, now: float) -> None:
        """An answer went out on a settling ``link``: the ledger counts it, and budget that
        came back is given out."""
        if self._ledger.answered(link, (delivery[DELIVER_DEADLINE],), now):
            self._rdy.grant_if_running(now)

    def requeue_now(self, link: Link, delivery: Deliver) -> None:
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

    # --- late answers --------------------------------------------------------------------------

    def refused(self, link: Link, event: MessageTakenBack, now: float) -> None:
        """nsqd refused an answer (``E_FIN_FAILED``...), or a TOUCH came too late."""
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
        self._report(
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

    def refused_at_close(self, link: Link, event: MessageTakenBack) -> None:
        """An answer refused in the read that closed the connection: reported only."""
        self.taken_back += 1
        self._report(
            TakenBack(link.conn_id, link.address, event.message_id, event.command, event.error)
        )

    def report_gone(self, delivery: Deliver, command: str) -> None:
        """``command`` for ``delivery`` came too late: nothing sent, a TakenBack reported."""
        self.taken_back += 1
        self._report(
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

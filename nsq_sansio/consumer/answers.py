"""The user's answers to messages (:class:`Answers`): FIN, REQ, TOUCH, and what they change.

The seventh layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. An answer is checked
against what is in flight (a handle no longer ours gives a
:class:`~nsq_sansio.consumer.actions.TakenBack`, never an exception), written to its
connection, and then, unless the consumer is *calm* (push mode, running, outside backoff, no
lowered RDY settling), fed to backoff, the RDY bound and drain. :meth:`~Answers.finish_many`
is the cheapest way to answer: deliveries answered in the order they came are checked by
position, and FIN'd in one call per read. The requeue delay is
:func:`nsq_sansio.consumer.retry.requeue_delay`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from itertools import groupby, repeat
from operator import is_, itemgetter

from ..backoff import BackoffPhase, Outcome
from ..connection import MAX_COMMAND_DELAY, ClientConnection
from ..errors import LocalProtocolError
from . import retry
from .actions import Deliver
from .drain import Drain
from .link import Link, fin_before_setup
from .state import ConsumerState

__all__ = ["Answers"]

_id: Callable[[Deliver], bytes] = itemgetter(1)  # Deliver.id
_conn_id: Callable[[Deliver], int] = itemgetter(0)  # Deliver.conn_id
_deadline: Callable[[Deliver], float] = itemgetter(7)  # Deliver.deadline


class Answers(Drain):
    """FIN, REQ, TOUCH and their consequences (see the module docstring)."""

    def mark_delivered(self, delivery: Deliver) -> None:
        """The transport handed ``delivery`` to user code. Optional: a transport that calls it
        for every delivery lets drain requeue the unmarked ones at once (the alternative is
        ``drain(unseen=...)``); without it, every Deliver counts as handed over."""
        link = self._current(delivery)
        if link is not None:
            self._explicit_delivery = True
            link.marks = True
            link.seen.add(delivery.id)

    def finish(self, delivery: Deliver, now: float) -> bool:
        """FIN: the message was handled. False (and a TakenBack) if it was no longer ours."""
        try:
            link = self._links[delivery[0]]
        except KeyError:  # its connection is gone
            self._report_gone(delivery, "FIN")
            return False
        message_id = delivery[1]
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
            if self._state is ConsumerState.RUNNING and self._backoff.phase is BackoffPhase.NORMAL:
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
            if delivery[0] != conn_id:
                if link is not None:
                    self._queue_answered(link, head)
                conn_id = delivery[0]
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
                    send_fin(delivery[1])
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
        settling = self._settling
        answered: dict[int, list[int]] = {}  # conn_id -> [FINs that count for settling]
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
            counted = answered.setdefault(conn_id, [0])
            if conn_id in settling and fin_list:
                # As _answered_while_settling: not those nsqd may have timed out already.
                after = now + link.settle_delay
                counted[0] += sum(map(after.__lt__, map(_deadline, fin_list)))
        grant = False
        for conn_id, (count,) in answered.items():
            link = links[conn_id]
            if count and conn_id in settling:
                if link.ceiling > link.wire_rdy:
                    link.ceiling -= min(count, link.ceiling - link.wire_rdy)
                if link.ceiling <= link.wire_rdy:
                    self._settled(link)
                self._reclaim(link)
                grant = True
        if grant:
            self._grant(now)
        if self._pull:
            for conn_id in answered:
                link = links[conn_id]
                if link.alloc > 0:
                    count = self._live_in_flight(link, now) + link.alloc
                    self._send_rdy(link, min(count, self._budget_left(link)), now)
        return done

    def _fin_tracked(self, link: Link, delivery: Deliver) -> bool:
        """:meth:`finish`'s FIN without what follows it (RDY, backoff): False, and a
        TakenBack, when ``delivery`` is no longer in flight on ``link``."""
        message_id = delivery[1]
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
        link = self._links.get(batch[0][0])
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
            self.check_requeue_delay(delivery, delay)  # before anything is settled
        link = self._settle(delivery, "REQ")
        if link is None:
            return False
        assert link.proto is not None
        if delay is None:
            delay = self.requeue_delay(delivery.attempts, link.conn_id)
        else:
            # nsqd clamps REQ to its --max-req-timeout; we clamp to what the wire can carry.
            delay = min(delay, MAX_COMMAND_DELAY)
            if link.max_req_timeout is not None:
                delay = min(delay, link.max_req_timeout)
        self._emit_rdy(link)
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
        if self._state is ConsumerState.RUNNING and self._backoff.record(outcome, now):
            # Backoff starts (or a test ends): RDY 0 goes on the wire before the REQ, else
            # nsqd could hand the message straight back, in flight for the whole window.
            self._backoff_moved(now)
            self._emit_rdy(link)
            link.proto.requeue(message_id, delay)
            self.requeued += 1
            if link.conn_id in self._settling:
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
        max_req_timeout = link.max_req_timeout if link is not None else None
        if link is not None and link.proto is not None:
            known = link.proto.max_req_timeout  # configured, or announced by nsqd
            if known is not None and (max_req_timeout is None or known < max_req_timeout):
                max_req_timeout = known
        return retry.requeue_delay(self._config, attempts, max_req_timeout)

    def touch(self, delivery: Deliver, now: float) -> float | None:
        """TOUCH: extend the message's timeout; returns the new deadline (None if not ours).
        The deadline never goes past received_at + the server's max_msg_timeout. A message
        whose deadline has passed is not ours any more (nsqd took it back at its own deadline,
        which came first): nothing is sent, and it is reported (TakenBack) as gone."""
        link = self._current(delivery)
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

    def _settle(self, delivery: Deliver, command: str) -> Link | None:
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
        if link.conn_id in self._settling:
            self._answered_while_settling(link, delivery, now)
        if self._state is ConsumerState.RUNNING:
            if not recorded and self._backoff.record(outcome, now):
                self._backoff_moved(now)
            elif self._pull and link.alloc > 0:
                count = self._live_in_flight(link, now) + link.alloc
                self._send_rdy(link, min(count, self._budget_left(link)), now)
        elif self._state is ConsumerState.DRAINING:
            self._maybe_close_drained(link, now)
            self._check_drained()

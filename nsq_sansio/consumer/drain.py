"""Graceful shutdown (:class:`Drain`): stop, give back, wait, close.

Rules:

* The flow stops first (RDY 0 everywhere, before any REQ: nsqd must not resend what is
  given back); connections still connecting or handshaking are closed at once.
* What the user has not seen is requeued at once (REQ 0); what the user holds is waited for,
  up to a deadline after which it is requeued too (reported: ``DrainTimedOut``). A drain
  asked again with a sooner deadline (``0``: stop now) moves it; a later one changes nothing.
* A connection with nothing in flight is sent CLS and closed when nsqd answers CLOSE_WAIT
  (or ``CLOSE_WAIT_GRACE`` after the deadline); when the last one is gone the consumer is
  ``CLOSED`` (the lifecycle's ``DRAINED``) and says ``DrainComplete``.

The part owns the deadline; the coordinator stops the flow of requests (lookupd, reconnects,
fetches) and calls :meth:`Drain.begin`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .actions import Action, Deliver, DrainComplete, DrainTimedOut
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle, LifecycleEvent
from .link import Link, LinkPhase, current_link

__all__ = ["CLOSE_WAIT_GRACE", "Drain"]

#: How long after the drain deadline a CLS may wait for CLOSE_WAIT before the socket is cut.
CLOSE_WAIT_GRACE = 5.0


class Drain:
    """The drain's deadline and its rules (see the module docstring). ``requeue_now`` hands a
    message back at once, ``drop`` closes a connection, ``report`` queues an action."""

    __slots__ = (
        "_dirty",
        "_drop",
        "_ledger",
        "_lifecycle",
        "_links",
        "_report",
        "_requeue_now",
        "deadline",
    )

    def __init__(
        self,
        links: dict[int, Link],
        dirty: set[int],
        ledger: RdyLedger,
        lifecycle: Lifecycle,
        report: Callable[[Action], None],
        requeue_now: Callable[[Link, Deliver], None],
        drop: Callable[[Link, float], None],
    ) -> None:
        self._links = links
        self._dirty = dirty
        self._ledger = ledger
        self._lifecycle = lifecycle
        self._report = report
        self._requeue_now = requeue_now
        self._drop = drop
        self.deadline: float | None = None

    def begin(self, now: float, deadline: float) -> None:
        """The consumer is draining (its requests stopped): connections not subscribed yet
        are closed, the others get RDY 0 and take no new message."""
        self.deadline = deadline
        for link in list(self._links.values()):
            if link.phase is LinkPhase.CONNECTING or link.phase is LinkPhase.HANDSHAKING:
                self._drop(link, now)
                continue
            link.accepting = False
            if link.rdy:
                self._ledger.send(link, 0, now)  # before any REQ: nsqd must not resend them
            link.target = 0

    def give_back(self, now: float, unseen: Iterable[Deliver], *, only_seen: bool) -> None:
        """Requeue what the user never saw (``unseen``; with ``only_seen``, every delivery
        not marked delivered), then close what can be (or all, deadline 0)."""
        for delivery in unseen:
            found = current_link(self._links, delivery)
            if found is not None:
                self._requeue_now(found, delivery)
        if only_seen:
            for link in self._links.values():
                for delivery in list(link.tracked.values()):
                    if delivery.id not in link.seen:
                        self._requeue_now(link, delivery)
        if self.deadline is not None and now >= self.deadline:  # timeout 0: now
            self.due(now)
            return
        for link in list(self._links.values()):
            self.maybe_close(link, now)
        self.check_done()

    def shorten(self, now: float, timeout: float | None) -> None:
        """A drain asked again while draining: the sooner deadline wins."""
        if timeout is None or self.deadline is None:
            return
        self.deadline = min(self.deadline, now + timeout)
        if now >= self.deadline:
            self.due(now)

    def due(self, now: float) -> None:
        """The timer while draining: once the deadline passed, requeue what the user still holds
        (reported as :class:`DrainTimedOut`) and close what can be; CLOSED when no connection
        is left."""
        if self.deadline is not None and now >= self.deadline:
            self.deadline = None
            held: list[Deliver] = []
            for link in list(self._links.values()):
                for delivery in list(link.tracked.values()):
                    held.append(delivery)
                    self._requeue_now(link, delivery)
                self.maybe_close(link, now)
            if held:
                self._report(DrainTimedOut(tuple(held)))
        self.check_done()

    def maybe_close(self, link: Link, now: float) -> None:
        """CLS ``link`` once it holds nothing; close it once nsqd said CLOSE_WAIT."""
        if self._lifecycle.state is ConsumerState.RUNNING or link.conn_id not in self._links:
            return
        if link.phase is LinkPhase.SUBSCRIBED and not link.tracked:
            assert link.proto is not None
            link.accepting = False
            self._ledger.emit(link)
            link.proto.close()  # CLS
            self._dirty.add(link.conn_id)
            link.phase = LinkPhase.CLOSING
            base = self.deadline if self.deadline is not None else now
            link.close_deadline = max(base, now) + CLOSE_WAIT_GRACE
        elif link.phase is LinkPhase.CLOSING and link.close_wait and not link.tracked:
            self._drop(link, now)

    def check_done(self) -> None:
        """The last connection of a drain is gone: CLOSED, and DrainComplete."""
        if self._lifecycle.state is ConsumerState.DRAINING and not self._links:
            self._lifecycle.apply(LifecycleEvent.DRAINED)
            self.deadline = None
            self._report(DrainComplete())

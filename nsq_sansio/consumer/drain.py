"""Graceful shutdown of the consumer coordinator (:class:`Drain`).

The sixth layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. :meth:`~Drain.drain`
stops the flow (RDY 0 everywhere, lookupd polling and reconnects stopped, waiting fetches
answered ``DRAINING``), requeues at once what the user has not seen, and waits for what the
user holds, up to a deadline after which that is requeued too. A connection with nothing in
flight is sent CLS and closed when nsqd answers CLOSE_WAIT (or ``CLOSE_WAIT_GRACE`` after the
deadline); when the last one is gone the consumer is ``CLOSED`` and says
:class:`~nsq_sansio.consumer.actions.DrainComplete`. What the deadline took back from the user
is reported (:class:`~nsq_sansio.consumer.actions.DrainTimedOut`); a drain asked again with a
sooner deadline (``0``: stop now) moves it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..errors import LocalProtocolError
from .actions import CloseHTTPRequest, Deliver, DrainComplete, DrainTimedOut, FetchEnd
from .connections import Connections
from .link import Link, LinkPhase
from .state import ConsumerState

__all__ = ["CLOSE_WAIT_GRACE", "Drain"]

#: How long after the drain deadline a CLS may wait for CLOSE_WAIT before the socket is cut.
CLOSE_WAIT_GRACE = 5.0


class Drain(Connections):
    """Drain: stop, give back, wait, close (see the module docstring)."""

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
        if self._state is ConsumerState.DRAINING:
            self._shorten_drain(now, timeout)
            return
        if self._state in (ConsumerState.CLOSED, ConsumerState.FAILED):
            return  # FAILED: already closed, ConsumerFailed said so (no DrainComplete)
        if self._state is ConsumerState.CREATED:
            self._state = ConsumerState.CLOSED
            self._actions.append(DrainComplete())
            return
        self._state = ConsumerState.DRAINING
        self._calm = False
        self._drain_deadline = now + (self._config.drain_timeout if timeout is None else timeout)
        self._backoff.reset()
        if self._poller is not None:
            for request_id in self._poller.stop():
                self._actions.append(CloseHTTPRequest(request_id))
        for retry in self._direct.values():
            retry.retry_at = None
        if self._pull:
            for fetch in self._fetches.take_all():
                self._answer_fetch(fetch, FetchEnd.DRAINING)
        for link in list(self._links.values()):
            if link.phase is LinkPhase.CONNECTING or link.phase is LinkPhase.HANDSHAKING:
                self._drop(link, None, now, close=True)
                continue
            link.accepting = False
            if link.rdy:
                self._send_rdy(link, 0, now)  # before any REQ: nsqd must not resend them
            link.target = 0
        self._flush_buffer(None)
        for delivery in unseen:
            found = self._current(delivery)
            if found is not None:
                self._requeue_now(found, delivery)
        if self._explicit_delivery:
            for link in self._links.values():
                for delivery in list(link.tracked.values()):
                    if delivery.id not in link.seen:
                        self._requeue_now(link, delivery)
        if self._drain_deadline is not None and now >= self._drain_deadline:  # timeout 0: now
            self._drain_due(now)
            return
        for link in list(self._links.values()):
            self._maybe_close_drained(link, now)
        self._check_drained()

    def _shorten_drain(self, now: float, timeout: float | None) -> None:
        """A drain asked again while draining: the sooner deadline wins."""
        if timeout is None or self._drain_deadline is None:
            return
        self._drain_deadline = min(self._drain_deadline, now + timeout)
        if now >= self._drain_deadline:
            self._drain_due(now)

    def _drain_due(self, now: float) -> None:
        """The timer while draining: once the deadline passed, requeue what the user still holds
        (reported as :class:`DrainTimedOut`) and close what can be; CLOSED when no connection
        is left."""
        if self._drain_deadline is not None and now >= self._drain_deadline:
            self._drain_deadline = None
            held: list[Deliver] = []
            for link in list(self._links.values()):
                for delivery in list(link.tracked.values()):
                    held.append(delivery)
                    self._requeue_now(link, delivery)
                self._maybe_close_drained(link, now)
            if held:
                self._actions.append(DrainTimedOut(tuple(held)))
        self._check_drained()

    def _maybe_close_drained(self, link: Link, now: float) -> None:
        if self._state is ConsumerState.RUNNING or link.conn_id not in self._links:
            return
        if link.phase is LinkPhase.SUBSCRIBED and not link.tracked:
            assert link.proto is not None
            link.accepting = False
            self._emit_rdy(link)
            link.proto.close()  # CLS
            self._dirty.add(link.conn_id)
            link.phase = LinkPhase.CLOSING
            base = self._drain_deadline if self._drain_deadline is not None else now
            link.close_deadline = max(base, now) + CLOSE_WAIT_GRACE
        elif link.phase is LinkPhase.CLOSING and link.close_wait and not link.tracked:
            self._drop(link, None, now, close=True)

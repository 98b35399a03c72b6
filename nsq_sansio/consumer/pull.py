"""Pull mode, the coordinator's side (:class:`PullMode`): fetches in, messages out to them.

The fourth layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. :meth:`~PullMode.fetch`
registers a request in the :class:`~nsq_sansio.consumer.fetches.FetchQueue` (or answers it at
once from the hold buffer), the distribution layer turns the outstanding requests into RDY
(:func:`~nsq_sansio.consumer.shares.pull_shares`), and messages read go to the oldest waiting
request as one batch per read; what finds no request is held for ``pull_hold_timeout`` and then
requeued. A link that used up its share is topped up at once. Expired and aged requests are
answered by the timer; a lost connection's messages leave the requests that gathered them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat

from ..errors import LocalProtocolError
from .actions import Deliver, FetchEnd, FetchResult
from .distribution import RdyDistribution
from .fetches import FetchRequest
from .link import Link
from .state import ConsumerState

__all__ = ["PullMode"]


class PullMode(RdyDistribution):
    """Fetch requests and the messages that answer them (see the module docstring)."""

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
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if expires is not None and not (expires > 0 and math.isfinite(expires)):
            raise LocalProtocolError(f"fetch expires must be > 0 seconds or None, got {expires!r}")
        request_id = self._next_fetch_id
        self._next_fetch_id += 1
        request = FetchRequest(request_id, batch, None if expires is None else now + expires)
        if self._state is not ConsumerState.RUNNING:
            failed = self._state is ConsumerState.FAILED
            self._answer_fetch(request, FetchEnd.FAILED if failed else FetchEnd.DRAINING)
            return request_id
        if not no_wait and len(self._fetches.waiting) >= self._config.max_waiting_fetches:
            self._answer_fetch(request, FetchEnd.TOO_MANY_WAITING)
            return request_id
        buffer = self._fetches.buffer
        while buffer and request.remaining:
            _, delivery = buffer.popleft()
            link = self._current(delivery)
            if link is None:
                continue
            if link.touched.get(delivery.id, delivery.deadline) <= now:
                continue  # nsqd timed it out already: a stale copy, it will come again
            request.messages.append(delivery)
            request.remaining -= 1
        if no_wait:
            reason = FetchEnd.NO_WAIT if request.messages else FetchEnd.NO_MESSAGES
            self._answer_fetch(request, reason)
        elif request.remaining == 0:
            self._answer_fetch(request, FetchEnd.FILLED)
        else:
            self._fetches.add(request)
            self._rebalance(now)
        return request_id

    def cancel_fetch(self, request_id: int, now: float) -> None:
        """The caller gave up on fetch ``request_id`` (cancelled, timed out on its side).

        The request stops waiting, and whatever it had gathered (even an answer still queued
        in :meth:`take_actions`) goes back to the front of the hold buffer for the next fetch,
        so a cancelled fetch never swallows messages. Unknown or finished ids are ignored."""
        for request in self._fetches.waiting:
            if request.request_id == request_id:
                self._fetches.remove(request)
                self._hold_again(request.messages, now)
                return
        for index, action in enumerate(self._actions):
            if isinstance(action, FetchResult) and action.request_id == request_id:
                del self._actions[index]
                self.give_back(action.messages, now)
                return
        if self._state is ConsumerState.RUNNING:
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
        if self._state is ConsumerState.RUNNING:
            self._hold_again(deliveries, now)
            return
        for delivery in deliveries:
            link = self._current(delivery)
            if link is not None:
                self._requeue_now(link, delivery)

    def _hold_again(self, deliveries: Sequence[Deliver], now: float) -> None:
        hold_until = now + self._config.pull_hold_timeout
        buffer = self._fetches.buffer
        for delivery in reversed(deliveries):
            if self._current(delivery) is not None:
                buffer.appendleft((hold_until, delivery))
        if self._state is ConsumerState.RUNNING:
            self._rebalance(now)

    def _pull_receive(self, link: Link, deliveries: list[Deliver], now: float) -> None:
        """A read of fresh messages in pull mode (the checks are the caller's): tracked by
        position as in push mode, then handed to the waiting fetches as one batch."""
        link.track_read(deliveries, now)
        self.received += len(deliveries)
        self._on_pull_messages(link, deliveries, now)

    def _on_pull_messages(self, link: Link, deliveries: list[Deliver], now: float) -> None:
        """Messages (tracked already) arrived on ``link``, in order: use up its share, give
        them to the waiting fetches (oldest first), hold the rest for the next fetch."""
        count = len(deliveries)
        self._pull_seq += count
        link.pull_seq = self._pull_seq
        used_up = False
        alloc = link.alloc
        if alloc > 0:
            used = count if count < alloc else alloc
            link.alloc = alloc - used
            self._alloc_total -= used
            if used == alloc:
                used_up = True
                link.target = 0
                self._send_rdy(link, 0, now)
        fetches = self._fetches
        given = 0
        if fetches.waiting:
            filled, given = fetches.give_many(deliveries)
            for request in filled:
                self._answer_fetch(request, FetchEnd.FILLED)
        if given < count:
            hold_until = now + self._config.pull_hold_timeout
            fetches.buffer.extend(
                zip(repeat(hold_until), deliveries[given:] if given else deliveries)
            )
        if self._alloc_total > fetches.outstanding or (used_up and fetches.outstanding):
            # A link that used up its share while others may sit on empty nsqd: top it up
            # from theirs now (it is active; they keep a probe), not after an idle timeout.
            self._rebalance(now)

    def _pull_due(self, now: float) -> None:
        """Answer the fetches that expired or aged, requeue what was held too long, and
        recompute the shares (the budget grows as held messages pass their deadline)."""
        for fetch in self._fetches.expired(now):
            expired = fetch.expires_at is not None and fetch.expires_at <= now
            self._answer_fetch(fetch, FetchEnd.EXPIRED if expired else FetchEnd.AGED)
        self._flush_buffer(now)
        if self._rotate_at is not None and now >= self._rotate_at:
            self._rotate_at = None
            self._pass_dry_rdy_on(now)
        self._rebalance(now)

    def _pass_dry_rdy_on(self, now: float) -> None:
        """Fewer RDY than connections while a fetch waits: a holder that delivered nothing
        for twice its settle time since it got its share (so nsqd had its RDY and nothing to
        send; fetches that came and went meanwhile do not count as new shares) passes the RDY
        on, to the connections that never ran dry first, then to the longest dry. Without
        this a fetch waited for ``low_rdy_idle_timeout`` plus the redistribution period
        (10-15 s) while messages sat on another nsqd."""
        links = self._subscribed()
        if not self._fetches.waiting or all(link.alloc for link in links):
            return
        released: set[int] = set()
        soonest: float | None = None
        for link in links:
            if not link.alloc or not link.wire_rdy:
                continue
            due = max(link.last_message_at, link.share_at) + 2 * link.settle_delay
            if due <= now:
                released.add(link.conn_id)
                link.dry_at = now
                self._take_rdy_away(link, now)
            elif soonest is None or due < soonest:
                soonest = due
        if released:
            self._rebalance(now, frozenset(released))
        elif soonest is not None:
            self._rotate_at = soonest

    def _answer_fetch(self, request: FetchRequest, reason: FetchEnd) -> None:
        # Every message a request gathered is still ours: those of a lost connection and
        # those nsqd delivered again leave the requests at once (_forget_pull_messages,
        # _forget_gathered), so the answer is the gathered list as is.
        messages = tuple(request.messages)
        if self._explicit_delivery:  # a fetch answer is in the user's hands
            for delivery in messages:
                self._links[delivery.conn_id].seen.add(delivery.id)
        self._actions.append(FetchResult(request.request_id, messages, reason))

    def _flush_buffer(self, now: float | None) -> None:
        """Requeue held pull messages whose hold ended (all of them when ``now`` is None)."""
        buffer = self._fetches.buffer
        while buffer and (now is None or buffer[0][0] <= now):
            _, delivery = buffer.popleft()
            link = self._current(delivery)
            if link is not None:
                self._requeue_now(link, delivery)

    def _forget_pull_messages(self, conn_id: int) -> None:
        fetches = self._fetches
        kept = [(t, d) for t, d in fetches.buffer if d.conn_id != conn_id]
        fetches.buffer.clear()
        fetches.buffer.extend(kept)
        for request in fetches.waiting:
            lost = [d for d in request.messages if d.conn_id == conn_id]
            if lost:
                request.messages = [d for d in request.messages if d.conn_id != conn_id]
                request.remaining += len(lost)
                fetches.outstanding += len(lost)

    def _forget_gathered(self, delivery: Deliver) -> None:
        """nsqd delivered ``delivery``'s message again (it timed out there): a waiting request
        that gathered the old copy loses it and waits for one more message (rare: a request
        answers AGED long before its messages time out)."""
        fetches = self._fetches
        for request in fetches.waiting:
            messages = request.messages
            for index, gathered in enumerate(messages):
                if gathered is delivery:
                    del messages[index]
                    request.remaining += 1
                    fetches.outstanding += 1
                    return

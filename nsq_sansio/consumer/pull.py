"""Pull mode (:class:`PullMode`): fetches in, RDY allocated to them, messages out to them.

Rules:

* RDY follows the outstanding fetches: a connection gets what it holds (live: not past its
  deadline) plus its share (:meth:`~PullMode.allocate`, by
  :func:`~nsq_sansio.consumer.shares.pull_shares`), never more than was asked.
* Messages go to the oldest waiting request, one batch per read; what finds no request is
  held for ``pull_hold_timeout``, then requeued. A link that used up its share is topped up
  at once.
* Rotation: with fewer RDY than connections while a fetch waits, a holder that delivered
  nothing for twice its settle time passes its RDY on (:meth:`~PullMode.rotate`).
* Expiry: the budget is recomputed when a held message passes its deadline; expired and aged
  requests are answered by the timer; a lost connection's messages leave the requests.

The part owns the fetch queue, the allocation total, the rotation and expiry times; it moves
RDY only through the ledger and asks the coordinator (``rebalance``) to recompute targets.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from itertools import repeat

from ..config import Config
from ..errors import LocalProtocolError
from .actions import Action, Deliver, FetchEnd, FetchResult
from .fetches import FetchQueue, FetchRequest
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle
from .link import RDY_SETTLE_MIN, Link, current_link
from .shares import pull_shares

__all__ = ["PullMode"]


class PullMode:
    """Fetch requests, their RDY, and the messages that answer them (see the module
    docstring). ``report`` queues an action; ``rebalance(now, exclude)`` recomputes every
    target; ``requeue_now`` hands a message back to nsqd at once; ``take_rdy_away`` takes a
    holder's scarce RDY (and share) away."""

    __slots__ = (
        "_hold_timeout",
        "_idle_timeout",
        "_ledger",
        "_lifecycle",
        "_links",
        "_max_waiting",
        "_rebalance",
        "_report",
        "_requeue_now",
        "_rng",
        "_take_rdy_away",
        "alloc_total",
        "fetches",
        "mark_seen",
        "next_expiry",
        "next_fetch_id",
        "rotate_at",
        "seq",
    )

    def __init__(
        self,
        config: Config,
        rng: random.Random,
        links: dict[int, Link],
        ledger: RdyLedger,
        lifecycle: Lifecycle,
        report: Callable[[Action], None],
        rebalance: Callable[[float, frozenset[int]], None],
        requeue_now: Callable[[Link, Deliver], None],
        take_rdy_away: Callable[[Link, float], None],
    ) -> None:
        self._hold_timeout = config.pull_hold_timeout
        self._max_waiting = config.max_waiting_fetches
        self._idle_timeout = config.low_rdy_idle_timeout
        self._rng = rng
        self._links = links
        self._ledger = ledger
        self._lifecycle = lifecycle
        self._report = report
        self._rebalance = rebalance
        self._requeue_now = requeue_now
        self._take_rdy_away = take_rdy_away
        self.fetches = FetchQueue()
        self.next_fetch_id = 1
        #: Sum of every link's ``alloc`` (its share of the outstanding fetches).
        self.alloc_total = 0
        #: With fewer RDY than connections while a fetch waits: when to check whether a
        #: holder that delivers nothing should pass its RDY on.
        self.rotate_at: float | None = None
        #: The next deadline of a held message (the budget grows when it passes).
        self.next_expiry: float | None = None
        #: Counts messages, so the link that delivered last is known exactly.
        self.seq = 0
        #: The transport marks deliveries (mark_delivered): a fetch answer is in user hands.
        self.mark_seen = False

    # --- requests in ---------------------------------------------------------------------------

    def fetch(self, batch: int, now: float, expires: float | None, no_wait: bool) -> int:
        """Register (or answer at once) a fetch; returns its request id (see
        :meth:`~nsq_sansio.consumer.ConsumerCoordinator.fetch`)."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise LocalProtocolError(f"fetch batch must be an int >= 1, got {batch!r}")
        if expires is not None and not (expires > 0 and math.isfinite(expires)):
            raise LocalProtocolError(f"fetch expires must be > 0 seconds or None, got {expires!r}")
        request_id = self.next_fetch_id
        self.next_fetch_id += 1
        request = FetchRequest(request_id, batch, None if expires is None else now + expires)
        state = self._lifecycle.state
        if state is not ConsumerState.RUNNING:
            failed = state is ConsumerState.FAILED
            self.answer(request, FetchEnd.FAILED if failed else FetchEnd.DRAINING)
            return request_id
        if not no_wait and len(self.fetches.waiting) >= self._max_waiting:
            self.answer(request, FetchEnd.TOO_MANY_WAITING)
            return request_id
        buffer = self.fetches.buffer
        while buffer and request.remaining:
            _, delivery = buffer.popleft()
            link = current_link(self._links, delivery)
            if link is None:
                continue
            if link.touched.get(delivery.id, delivery.deadline) <= now:
                continue  # nsqd timed it out already: a stale copy, it will come again
            request.messages.append(delivery)
            request.remaining -= 1
        if no_wait:
            reason = FetchEnd.NO_WAIT if request.messages else FetchEnd.NO_MESSAGES
            self.answer(request, reason)
        elif request.remaining == 0:
            self.answer(request, FetchEnd.FILLED)
        else:
            self.fetches.add(request)
            self._rebalance(now, frozenset())
        return request_id

    def cancel_waiting(self, request_id: int, now: float) -> bool:
        """A waiting request is cancelled: what it gathered is held again. False when no
        request with that id waits."""
        for request in self.fetches.waiting:
            if request.request_id == request_id:
                self.fetches.remove(request)
                self.hold_again(request.messages, now)
                return True
        return False

    def cancel(self, request_id: int, now: float, queued: list[Action]) -> None:
        """The caller gave up on fetch ``request_id``: what it gathered, even an answer still
        among the ``queued`` actions (taken out of them), is held again for the next fetch."""
        if self.cancel_waiting(request_id, now):
            return
        for index, action in enumerate(queued):
            if isinstance(action, FetchResult) and action.request_id == request_id:
                del queued[index]
                self.give_back(action.messages, now)
                return
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._rebalance(now, frozenset())

    def give_back(self, deliveries: Sequence[Deliver], now: float) -> None:
        """A fetch answer the caller never saw: held again while running, else requeued."""
        for delivery in deliveries:
            link = self._links.get(delivery.conn_id)
            if link is not None:
                link.seen.discard(delivery.id)
        if self._lifecycle.state is ConsumerState.RUNNING:
            self.hold_again(deliveries, now)
            return
        for delivery in deliveries:
            link = current_link(self._links, delivery)
            if link is not None:
                self._requeue_now(link, delivery)

    def hold_again(self, deliveries: Sequence[Deliver], now: float) -> None:
        """Messages the caller never saw go back to the front of the hold buffer."""
        hold_until = now + self._hold_timeout
        buffer = self.fetches.buffer
        for delivery in reversed(deliveries):
            if current_link(self._links, delivery) is not None:
                buffer.appendleft((hold_until, delivery))
        if self._lifecycle.state is ConsumerState.RUNNING:
            self._rebalance(now, frozenset())

    def answer(self, request: FetchRequest, reason: FetchEnd) -> None:
        """Answer ``request`` with what it gathered."""
        # Every message a request gathered is still ours: those of a lost connection and
        # those nsqd delivered again leave the requests at once (forget_connection,
        # forget_gathered), so the answer is the gathered list as is.
        messages = tuple(request.messages)
        if self.mark_seen:  # a fetch answer is in the user's hands
            for delivery in messages:
                self._links[delivery.conn_id].seen.add(delivery.id)
        self._report(FetchResult(request.request_id, messages, reason))

    def end_all(self, reason: FetchEnd, *, emptied: bool) -> None:
        """Answer every waiting request (the consumer stops); ``emptied``: what they gathered
        was requeued already, the answers are empty."""
        for fetch in self.fetches.take_all():
            if emptied:
                fetch.messages = []
            self.answer(fetch, reason)

    # --- RDY: the allocation -------------------------------------------------------------------

    def allocate(
        self, links: list[Link], budget: int, now: float, exclude: frozenset[int]
    ) -> list[int]:
        """Each subscribed link's RDY target: what nsqd counts in flight there (messages past
        their deadline were taken back already: a stuck handler must not hold the budget
        forever) plus its share of the outstanding fetches."""
        self.next_expiry = None
        live = [self.live(link, now) for link in links]
        wanted = max(0, min(self.fetches.outstanding, budget - sum(live)))
        caps = [max(0, link.max_rdy - n) for link, n in zip(links, live, strict=True)]
        allocs = pull_shares(links, wanted, now, exclude, caps, self._idle_timeout, self._rng, live)
        self.alloc_total = sum(allocs)
        if 0 in allocs and self.fetches.waiting and self.rotate_at is None:
            # fewer RDY than connections: a holder that delivers nothing passes it on
            self.rotate_at = now + 2 * RDY_SETTLE_MIN
        targets = []
        for link, alloc, n in zip(links, allocs, live, strict=True):
            link.alloc = alloc
            targets.append(n + alloc if alloc else 0)
        return targets

    def live(self, link: Link, now: float) -> int:
        """Messages held on ``link`` that nsqd still counts in flight (deadline not passed);
        notes the next deadline so the budget is recomputed when it passes."""
        live, expiry = link.live_count(now)
        if expiry is not None and (self.next_expiry is None or expiry < self.next_expiry):
            self.next_expiry = expiry
        return live

    def top_up(self, link: Link, now: float) -> None:
        """An answer on ``link`` freed a slot of its share: its RDY follows at once."""
        if link.alloc > 0:
            count = self.live(link, now) + link.alloc
            self._ledger.send(link, min(count, self._ledger.budget_left(link)), now)

    def release(self, link: Link) -> None:
        """``link`` gives its share up (its RDY is taken away)."""
        self.alloc_total -= link.alloc
        link.alloc = 0

    # --- messages out --------------------------------------------------------------------------

    def on_messages(self, link: Link, deliveries: list[Deliver], now: float) -> None:
        """Messages (tracked already) arrived on ``link``, in order: use up its share, give
        them to the waiting fetches (oldest first), hold the rest for the next fetch."""
        count = len(deliveries)
        self.seq += count
        link.pull_seq = self.seq
        used_up = False
        alloc = link.alloc
        if alloc > 0:
            used = count if count < alloc else alloc
            link.alloc = alloc - used
            self.alloc_total -= used
            if used == alloc:
                used_up = True
                link.target = 0
                self._ledger.send(link, 0, now)
        fetches = self.fetches
        given = 0
        if fetches.waiting:
            filled, given = fetches.give_many(deliveries)
            for request in filled:
                self.answer(request, FetchEnd.FILLED)
        if given < count:
            hold_until = now + self._hold_timeout
            fetches.buffer.extend(
                zip(repeat(hold_until), deliveries[given:] if given else deliveries)
            )
        if self.alloc_total > fetches.outstanding or (used_up and fetches.outstanding):
            # A link that used up its share while others may sit on empty nsqd: top it up
            # from theirs now (it is active; they keep a probe), not after an idle timeout.
            self._rebalance(now, frozenset())

    # --- the timer -----------------------------------------------------------------------------

    def due(self, now: float, subscribed: list[Link]) -> None:
        """Answer the fetches that expired or aged, requeue what was held too long, rotate,
        and recompute the shares (the budget grows as held messages pass their deadline)."""
        for fetch in self.fetches.expired(now):
            expired = fetch.expires_at is not None and fetch.expires_at <= now
            self.answer(fetch, FetchEnd.EXPIRED if expired else FetchEnd.AGED)
        self.flush(now)
        if self.rotate_at is not None and now >= self.rotate_at:
            self.rotate_at = None
            self.rotate(now, subscribed)
        self._rebalance(now, frozenset())

    def next_deadline(self) -> float | None:
        """When the timer has work for pull mode (requests, the buffer, expiry, rotation)."""
        best = self.fetches.next_deadline()
        if self.fetches.waiting:
            for at in (self.next_expiry, self.rotate_at):
                if at is not None and (best is None or at < best):
                    best = at
        return best

    def rotate(self, now: float, links: list[Link]) -> None:
        """Fewer RDY than connections while a fetch waits: a holder that delivered nothing
        for twice its settle time since it got its share (so nsqd had its RDY and nothing to
        send; fetches that came and went meanwhile do not count as new shares) passes the RDY
        on, to the connections that never ran dry first, then to the longest dry. Without
        this a fetch waited for ``low_rdy_idle_timeout`` plus the redistribution period
        (10-15 s) while messages sat on another nsqd."""
        if not self.fetches.waiting or all(link.alloc for link in links):
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
            self.rotate_at = soonest

    def flush(self, now: float | None) -> None:
        """Requeue held messages whose hold ended (all of them when ``now`` is None)."""
        buffer = self.fetches.buffer
        while buffer and (now is None or buffer[0][0] <= now):
            _, delivery = buffer.popleft()
            link = current_link(self._links, delivery)
            if link is not None:
                self._requeue_now(link, delivery)

    # --- messages that are no longer ours ------------------------------------------------------

    def forget_connection(self, conn_id: int) -> None:
        """A lost connection's messages leave the buffer and the requests that gathered them."""
        fetches = self.fetches
        kept = [(t, d) for t, d in fetches.buffer if d.conn_id != conn_id]
        fetches.buffer.clear()
        fetches.buffer.extend(kept)
        for request in fetches.waiting:
            lost = [d for d in request.messages if d.conn_id == conn_id]
            if lost:
                request.messages = [d for d in request.messages if d.conn_id != conn_id]
                request.remaining += len(lost)
                fetches.outstanding += len(lost)

    def forget_gathered(self, delivery: Deliver) -> None:
        """nsqd delivered ``delivery``'s message again (it timed out there): a waiting request
        that gathered the old copy loses it and waits for one more message (rare: a request
        answers AGED long before its messages time out)."""
        fetches = self.fetches
        for request in fetches.waiting:
            messages = request.messages
            for index, gathered in enumerate(messages):
                if gathered is delivery:
                    del messages[index]
                    request.remaining += 1
                    fetches.outstanding += 1
                    return

"""How RDY is spread over the connections, and when it moves (:class:`RdyDistribution`).

The third layer of :class:`~nsq_sansio.consumer.ConsumerCoordinator`. ``_rebalance`` turns the
budget (``max_in_flight``, or what backoff allows; in pull mode what the fetches ask for, less
what is held) into a target per subscribed connection (:mod:`~nsq_sansio.consumer.shares` says
who: even shares, scarce RDY to a few, pull shares by activity), lowers first, then raises as
far as the max_in_flight bound allows. ``_redistribute`` (every ``rdy_redistribute_interval``)
warms up new connections and moves scarce RDY away from idle ones; budget that comes back
(an answer after a lowered RDY, a settle time reached) is given out by ``_grant``.
"""

from __future__ import annotations

from ..backoff import BackoffPhase
from ..rdy import even_shares
from .actions import BackoffChanged, Deliver
from .link import RDY_SETTLE_MIN, Link
from .rdy_bound import RdyBound
from .shares import pick_holders, pull_shares
from .state import ConsumerState

__all__ = ["RdyDistribution"]


class RdyDistribution(RdyBound):
    """Targets per connection, and moving RDY (see the module docstring)."""

    def set_max_in_flight(self, max_in_flight: int, now: float) -> None:
        """Change max_in_flight at run time (0 pauses); RDY is redistributed at once."""
        self._config = self._config.replace(max_in_flight=max_in_flight)
        if self._state is ConsumerState.RUNNING:
            self._rebalance(now)

    def _rebalance(self, now: float, exclude: frozenset[int] = frozenset()) -> None:
        """Recompute every connection's RDY target and send what changed (lower ones first)."""
        links = self._subscribed()
        if not links:
            self._next_expiry = None  # nothing in flight anywhere: no expiry to wake up for
            return
        budget = self._budget()
        if self._pull:
            # What nsqd counts in flight: messages past their deadline were taken back already
            # (a stuck handler must not hold the budget forever).
            self._next_expiry = None
            live = [self._live_in_flight(link, now) for link in links]
            wanted = max(0, min(self._fetches.outstanding, budget - sum(live)))
            caps = [max(0, link.max_rdy - n) for link, n in zip(links, live, strict=True)]
            allocs = pull_shares(
                links,
                wanted,
                now,
                exclude,
                caps,
                self._config.low_rdy_idle_timeout,
                self._rng,
                live,
            )
            self._alloc_total = sum(allocs)
            if 0 in allocs and self._fetches.waiting and self._rotate_at is None:
                # fewer RDY than connections: a holder that delivers nothing passes it on
                self._rotate_at = now + 2 * RDY_SETTLE_MIN
            targets = []
            for link, alloc, n in zip(links, allocs, live, strict=True):
                link.alloc = alloc
                targets.append(n + alloc if alloc else 0)
        elif self._backoff.phase is BackoffPhase.TESTING:
            targets = self._testing_targets(links, exclude, now)
        elif budget >= len(links):
            targets = even_shares(budget, [link.max_rdy if link.warm else 1 for link in links])
        else:
            targets = pick_holders(links, budget, exclude, [1] * len(links), self._rng)
        for link, target in zip(links, targets, strict=True):
            link.target = target
        for link in links:
            if link.rdy > link.target:
                self._send_rdy(link, link.target, now)
        if self._claimed > self._config.max_in_flight:
            # max_in_flight was lowered under what may be held: no connection takes a new
            # message (RDY 0) until enough is answered; then the shares come back.
            for link in links:
                if link.rdy:
                    self._send_rdy(link, 0, now)
            return
        self._raise_to_targets(links, now)

    def _testing_targets(self, links: list[Link], exclude: frozenset[int], now: float) -> list[int]:
        """Backoff's test: the messages it lets in (:meth:`_testing_room`) go to one
        connection at random (a few once successes let more in), each given RDY = what nsqd
        counts in flight there + its share. RDY counts messages in flight on nsqd, so a plain
        RDY 1 on a connection whose handlers still run would let no test message in at all."""
        live = [link.live_count(now)[0] for link in links]
        new = self._testing_room(links, live)
        if new <= 0:
            return [0] * len(links)
        room = [max(0, link.max_rdy - count) for link, count in zip(links, live, strict=True)]
        if new >= len(links):
            shares = even_shares(new, room)
        else:
            shares = pick_holders(links, new, exclude, [min(1, r) for r in room], self._rng)
        return [count + share if share else 0 for count, share in zip(live, shares, strict=True)]

    def _testing_room(self, links: list[Link], live: list[int]) -> int:
        """How many new messages backoff's test lets in now: what its allowance leaves beside
        every message the user holds, within what max_in_flight leaves beside those nsqd
        still counts in flight (``live``). A message whose deadline passed was taken back by
        nsqd (a handler that hangs): no result can come of it, so when nothing held is still
        in flight the test lets one message in whatever the handlers hold; else a test held
        back by hung handlers would wait for good (and with max_in_flight 1, one hung message
        held when the window ended left room for none)."""
        budget = self._budget()
        if budget <= 0:
            return 0
        in_flight = sum(live)
        held = sum(max(link.held_count(), 0) for link in links)
        new = min(self._backoff.allowance - held, self._config.max_in_flight - in_flight)
        return max(new, 1) if in_flight == 0 else new

    def _backoff_moved(self, now: float) -> None:
        """Backoff changed phase or level: RDY follows, and a change of phase, a window
        opened or a test's level is reported (a level lowered inside a window is not: the
        window goes on, only its end says so)."""
        self._recalm()
        self._rebalance(now)
        backoff = self._backoff
        seen = (backoff.phase, backoff.windows, backoff.level)
        last = self._backoff_reported
        self._backoff_reported = seen
        if seen[:2] == last[:2] and (seen[0] is not BackoffPhase.TESTING or seen == last):
            return
        self._actions.append(
            BackoffChanged(backoff.phase, backoff.level, backoff.window, backoff.failures)
        )

    def _raise_to_targets(self, links: list[Link], now: float) -> None:
        """Raise every link below its target as far as the bound allows. In push mode a link
        that has RDY is raised by at least a quarter of its target (or to it), so budget that
        comes back one answer at a time is not written as one RDY per answer."""
        for link in links:
            if link.rdy < link.target:
                count = min(link.target, self._budget_left(link))
                if count <= link.rdy:
                    continue
                if (
                    count < link.target
                    and link.rdy
                    and not self._pull
                    and (count - link.rdy) * 4 < link.target
                ):
                    continue
                self._send_rdy(link, count, now)

    def _grant(self, now: float) -> None:
        """Budget came back: raise the connections still below their share."""
        if self._pull:
            self._rebalance(now)
        else:
            self._raise_to_targets(self._subscribed(), now)

    def _answered_while_settling(self, link: Link, delivery: Deliver, now: float) -> None:
        """A FIN/REQ for ``delivery`` went out after ``link``'s lowered RDY: nsqd reads it after
        that RDY, so one slot of the old RDY is free for good and goes to whoever waits for it.
        Not so for a message nsqd may have timed out already (its slot was freed then, and
        maybe filled again): those are counted when the ceiling settles."""
        if delivery.deadline - now <= link.settle_delay:
            return
        if link.ceiling > link.wire_rdy:
            link.ceiling -= 1
        if link.ceiling <= link.wire_rdy:
            self._settled(link)
        self._reclaim(link)
        if self._state is ConsumerState.RUNNING:
            self._grant(now)

    def _settle_due(self, now: float) -> None:
        """Release the ceilings whose settle time came: what nsqd sent under an old RDY has
        arrived, so the ceiling falls to the RDY, or to the messages still held (unexpired)."""
        released = False
        for conn_id in list(self._settling):
            link = self._links[conn_id]
            if link.settle_at is None or now < link.settle_at:
                continue
            live, expiry = link.live_count(now)
            ceiling = max(link.wire_rdy, live)
            released = released or ceiling < link.ceiling
            link.ceiling = ceiling
            if ceiling > link.wire_rdy:
                link.settle_at = expiry  # the user holds more than the RDY: wait for answers
            else:
                self._settled(link)
            self._reclaim(link)
        if released and self._state is ConsumerState.RUNNING:
            self._grant(now)

    def _live_in_flight(self, link: Link, now: float) -> int:
        """Messages held here that nsqd still counts in flight (deadline not passed); notes the
        next deadline so the budget is recomputed when it passes (pull mode)."""
        live, expiry = link.live_count(now)
        if expiry is not None and (self._next_expiry is None or expiry < self._next_expiry):
            self._next_expiry = expiry
        return live

    def _redistribute(self, now: float) -> None:
        """Periodic check: warm up idle newcomers, and with fewer RDY than connections move
        RDY away from connections that received nothing for low_rdy_idle_timeout, or that
        held it for low_rdy_timeout (so a busy nsqd cannot keep it from the others)."""
        links = self._subscribed()
        if not links:
            return
        idle_after = self._config.low_rdy_idle_timeout
        held_too_long = self._config.low_rdy_timeout
        released: set[int] = set()
        if self._backoff.phase is BackoffPhase.TESTING and not self._pull:
            # the test's few messages: their RDY moves off an nsqd that has nothing to send
            live = [link.live_count(now)[0] for link in links]
            scarce = self._testing_room(links, live) < len(links)
        else:
            scarce = self._budget() < len(links) or (self._pull and self._alloc_total < len(links))
        # One move at a time: while a connection waits for the budget a move freed (a lowered
        # RDY settling), no holder gives RDY up. Else, with an idle timeout shorter than the
        # settle time, each tick took the RDY of one idle holder and handed it to another
        # holder released a tick before (which took its own unsettled RDY straight back):
        # the waiting connection, the one with the messages, never got any.
        if scarce and any(link.rdy < link.target for link in links):
            scarce = False
        for link in links:
            if not link.warm and now - link.rdy_at >= self._config.rdy_redistribute_interval:
                link.warm = True
            # Only a holder: a connection given a share that waits for budget (another one's
            # lowered RDY settling) has had no RDY to receive with, so it is not idle.
            if (
                scarce
                and link.rdy > 0
                and (
                    now - max(link.last_message_at, link.rdy_at) >= idle_after
                    or now - link.rdy_at >= held_too_long
                )
            ):
                released.add(link.conn_id)
                self._take_rdy_away(link, now)
        self._rebalance(now, frozenset(released))

    def _take_rdy_away(self, link: Link, now: float) -> None:
        """``link`` gives its scarce RDY up (and in pull mode its share of the fetches); the
        caller rebalances with it excluded, so the RDY goes to another connection."""
        link.target = 0
        if self._pull:
            self._alloc_total -= link.alloc
            link.alloc = 0
        self._send_rdy(link, 0, now)

"""RDY distribution (:class:`RdyDistribution`): each connection's RDY target, handed to the
ledger, and the periodic check that moves scarce RDY.

Rules:

* Targets, recomputed when something changes (a connection subscribed or lost, backoff moved,
  max_in_flight set, a fetch): in pull mode what the fetches ask for
  (:meth:`~nsq_sansio.consumer.pull.PullMode.allocate`); during backoff's test what the test
  lets in (:mod:`~nsq_sansio.consumer.backoff_control`); else the budget in even shares
  (a connection not warm yet: 1), or with fewer RDY than connections RDY 1 to a few picked at
  random. The ledger moves RDY there: lowered first, raises within the max_in_flight bound.
* A connection warms up with its first messages or after ``rdy_redistribute_interval``; RDY is
  re-sent when the count left is 0 or under 25% of the last value.
* Every ``rdy_redistribute_interval``, with scarce RDY, a holder that received nothing for
  ``low_rdy_idle_timeout`` or held RDY for ``low_rdy_timeout`` gives it up to another
  connection, one move at a time (none while a connection still waits for budget).
* Budget that comes back (a lowered RDY settled) goes to the connections below their target.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ..backoff import BackoffPhase
from ..config import Config
from .actions import Action
from .backoff_control import BackoffControl
from .ledger import RdyLedger
from .lifecycle import ConsumerState, Lifecycle
from .link import Link, LinkPhase
from .pull import PullMode
from .rdy import even_shares, needs_refresh
from .shares import pick_holders

__all__ = ["RdyDistribution"]


class RdyDistribution:
    """RDY targets per connection (see the module docstring). ``report`` queues an action,
    ``recalm`` recomputes the coordinator's hot-path test after backoff moved."""

    __slots__ = (
        "_backoff",
        "_backoff_control",
        "_held_too_long",
        "_idle_after",
        "_interval",
        "_ledger",
        "_lifecycle",
        "_links",
        "_pull",
        "_pull_mode",
        "_recalm",
        "_report",
        "_rng",
        "next_redistribute",
    )

    def __init__(
        self,
        config: Config,
        rng: random.Random,
        links: dict[int, Link],
        ledger: RdyLedger,
        lifecycle: Lifecycle,
        backoff_control: BackoffControl,
        pull_mode: PullMode,
        report: Callable[[Action], None],
        recalm: Callable[[], None],
        *,
        pull: bool,
    ) -> None:
        self._interval = config.rdy_redistribute_interval
        self._idle_after = config.low_rdy_idle_timeout
        self._held_too_long = config.low_rdy_timeout
        self._rng = rng
        self._links = links
        self._ledger = ledger
        self._lifecycle = lifecycle
        self._backoff_control = backoff_control
        self._backoff = backoff_control.backoff
        self._pull_mode = pull_mode
        self._report = report
        self._recalm = recalm
        self._pull = pull
        #: When the periodic check runs next (None before start).
        self.next_redistribute: float | None = None

    def start(self, now: float) -> None:
        """The consumer runs: the periodic check starts."""
        self.next_redistribute = now + self._interval

    def next_deadline(self) -> float | None:
        """The periodic check, while there are connections."""
        return self.next_redistribute if self._links else None

    def rebalance(self, now: float, exclude: frozenset[int] = frozenset()) -> None:
        """Recompute every connection's RDY target (pull mode: what the fetches ask for;
        backoff's test; else even shares, or scarce RDY to a few) and have the ledger move
        RDY there (lowered first, raises within the bound)."""
        links = self.subscribed()
        if not links:
            self._pull_mode.next_expiry = None  # nothing in flight anywhere: nothing expires
            return
        budget = self.budget()
        if self._pull:
            targets = self._pull_mode.allocate(links, budget, now, exclude)
        elif self._backoff.phase is BackoffPhase.TESTING:
            targets = self._backoff_control.testing_targets(
                links, exclude, now, self._ledger.max_in_flight, self._rng
            )
        elif budget >= len(links):
            targets = even_shares(budget, [link.max_rdy if link.warm else 1 for link in links])
        else:
            targets = pick_holders(links, budget, exclude, [1] * len(links), self._rng)
        for link, target in zip(links, targets, strict=True):
            link.target = target
        self._ledger.apply_targets(links, now, quarter_steps=not self._pull)

    def grant(self, now: float) -> None:
        """Budget came back: raise the connections still below their share."""
        if self._pull:
            self.rebalance(now)
        else:
            self._ledger.raise_to_targets(self.subscribed(), now, quarter_steps=True)

    def grant_if_running(self, now: float) -> None:
        """:meth:`grant`, while the consumer runs."""
        if self._lifecycle.state is ConsumerState.RUNNING:
            self.grant(now)

    def backoff_moved(self, now: float) -> None:
        """Backoff changed phase or level: RDY follows, and the change is reported."""
        self._recalm()
        self.rebalance(now)
        change = self._backoff_control.change_to_report()
        if change is not None:
            self._report(change)

    def after_messages(self, link: Link, now: float) -> None:
        """After messages arrived: warm a new connection up, refresh RDY when it runs low."""
        if not link.warm:
            link.warm = True
            self.rebalance(now)
        if link.target and needs_refresh(link.remaining, link.rdy):
            ledger = self._ledger
            ledger.send(link, min(link.target, ledger.budget_left(link)), now)

    def due(self, now: float) -> None:
        """The timer: the periodic check when its time came."""
        if self.next_redistribute is not None and now >= self.next_redistribute:
            self.next_redistribute = now + self._interval
            self.redistribute(now)

    def redistribute(self, now: float) -> None:
        """Periodic check: warm up idle newcomers, and with fewer RDY than connections move
        RDY away from connections that received nothing for low_rdy_idle_timeout, or that
        held it for low_rdy_timeout (so a busy nsqd cannot keep it from the others)."""
        links = self.subscribed()
        if not links:
            return
        idle_after = self._idle_after
        held_too_long = self._held_too_long
        released: set[int] = set()
        if self._backoff.phase is BackoffPhase.TESTING and not self._pull:
            # the test's few messages: their RDY moves off an nsqd that has nothing to send
            live = [link.live_count(now)[0] for link in links]
            scarce = self._testing_room(links, live) < len(links)
        else:
            scarce = self.budget() < len(links) or (
                self._pull and self._pull_mode.alloc_total < len(links)
            )
        # One move at a time: while a connection waits for the budget a move freed (a lowered
        # RDY settling), no holder gives RDY up. Else, with an idle timeout shorter than the
        # settle time, each tick took the RDY of one idle holder and handed it to another
        # holder released a tick before (which took its own unsettled RDY straight back):
        # the waiting connection, the one with the messages, never got any.
        if scarce and any(link.rdy < link.target for link in links):
            scarce = False
        for link in links:
            if not link.warm and now - link.rdy_at >= self._interval:
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
                self.take_away(link, now)
        self.rebalance(now, frozenset(released))

    def _testing_room(self, links: list[Link], live: list[int]) -> int:
        """How many new messages backoff's test lets in now (none unless running)."""
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return 0
        return self._backoff_control.room(links, live, self._ledger.max_in_flight)

    def take_away(self, link: Link, now: float) -> None:
        """``link`` gives its scarce RDY up (and in pull mode its share of the fetches); the
        caller rebalances with it excluded, so the RDY goes to another connection."""
        link.target = 0
        if self._pull:
            self._pull_mode.release(link)
        self._ledger.send(link, 0, now)

    def subscribed(self) -> list[Link]:
        """The connections messages may flow on."""
        return [link for link in self._links.values() if link.phase is LinkPhase.SUBSCRIBED]

    def budget(self) -> int:
        """The RDY the consumer may give out now (none unless running)."""
        if self._lifecycle.state is not ConsumerState.RUNNING:
            return 0
        return self._backoff_control.budget(self._ledger.max_in_flight)

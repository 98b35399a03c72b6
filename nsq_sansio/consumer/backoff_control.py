"""Backoff as the coordinator sees it (:class:`BackoffControl`): the state machine, its RDY
budget, backoff's test, and what is reported.

Rules:

* The state machine is :class:`~nsq_sansio.backoff.Backoff` (windows, levels, outcomes); this
  part turns its phase into RDY: the whole budget while ``NORMAL``, none while ``WAITING``,
  and while ``TESTING`` only the messages the test lets in (:meth:`~BackoffControl.room`),
  to one connection at random (a few once successes let more in).
* RDY counts messages in flight on nsqd, so a test connection's RDY is what nsqd counts in
  flight there plus its share; a message past its deadline was taken back by nsqd and holds
  no test back.
* A change of phase, a window opened or a test's level is reported once
  (:class:`~nsq_sansio.consumer.actions.BackoffChanged`); a level lowered inside a window is
  not (the window goes on, only its end says so).
"""

from __future__ import annotations

import random

from ..backoff import Backoff, BackoffPhase
from ..config import Config
from .actions import BackoffChanged
from .link import Link
from .rdy import even_shares
from .shares import pick_holders

__all__ = ["BackoffControl"]


class BackoffControl:
    """The consumer's backoff and what it lets in (see the module docstring)."""

    __slots__ = ("backoff", "reported")

    def __init__(self, config: Config) -> None:
        self.backoff = Backoff(
            config.backoff_multiplier,
            config.max_backoff_duration,
            enabled=config.backoff_enabled,
        )
        #: What BackoffChanged last reported: (phase, windows opened, level).
        self.reported = (BackoffPhase.NORMAL, 0, 0)

    def budget(self, max_in_flight: int) -> int:
        """The RDY the phase allows (the consumer running)."""
        return self.backoff.rdy_budget(max_in_flight)

    def testing_targets(
        self,
        links: list[Link],
        exclude: frozenset[int],
        now: float,
        max_in_flight: int,
        rng: random.Random,
    ) -> list[int]:
        """Backoff's test: each link's RDY target (what nsqd counts in flight there, plus its
        share of the messages the test lets in)."""
        live = [link.live_count(now)[0] for link in links]
        new = self.room(links, live, max_in_flight)
        if new <= 0:
            return [0] * len(links)
        room = [max(0, link.max_rdy - count) for link, count in zip(links, live, strict=True)]
        if new >= len(links):
            shares = even_shares(new, room)
        else:
            shares = pick_holders(links, new, exclude, [min(1, r) for r in room], rng)
        return [count + share if share else 0 for count, share in zip(live, shares, strict=True)]

    def room(self, links: list[Link], live: list[int], max_in_flight: int) -> int:
        """How many new messages backoff's test lets in now: what its allowance leaves beside
        every message the user holds, within what max_in_flight leaves beside those nsqd
        still counts in flight (``live``). A message whose deadline passed was taken back by
        nsqd (a handler that hangs): no result can come of it, so when nothing held is still
        in flight the test lets one message in whatever the handlers hold; else a test held
        back by hung handlers would wait for good (and with max_in_flight 1, one hung message
        held when the window ended left room for none)."""
        if self.budget(max_in_flight) <= 0:
            return 0
        in_flight = sum(live)
        held = sum(max(link.held_count(), 0) for link in links)
        new = min(self.backoff.allowance - held, max_in_flight - in_flight)
        return max(new, 1) if in_flight == 0 else new

    def change_to_report(self) -> BackoffChanged | None:
        """The :class:`BackoffChanged` to report after the state machine moved, if any."""
        backoff = self.backoff
        seen = (backoff.phase, backoff.windows, backoff.level)
        last = self.reported
        self.reported = seen
        if seen[:2] == last[:2] and (seen[0] is not BackoffPhase.TESTING or seen == last):
            return None
        return BackoffChanged(backoff.phase, backoff.level, backoff.window, backoff.failures)

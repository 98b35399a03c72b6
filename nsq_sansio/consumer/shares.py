"""Who gets RDY, pure: the shares of push mode's scarce RDY and of pull mode's fetches.

The coordinator (:mod:`nsq_sansio.consumer.coordinator`) decides *how
much* there is to give (``max_in_flight`` under backoff, or what the fetches ask for); these
functions decide *who* gets it, as per-link targets:

* push mode, budget at least one per connection: :func:`nsq_sansio.consumer.rdy.even_shares`;
* fewer RDY than connections (push or pull): :func:`pick_holders`, RDY 1 to the current
  holders first, then at random (the coordinator moves it away from idle holders);
* pull mode: :func:`pull_shares`, the budget to the connections that delivered recently, a
  probe of 1 to each idle one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from .link import Link
from .rdy import even_shares

__all__ = ["pick_holders", "pull_shares"]


def pull_shares(
    links: list[Link],
    wanted: int,
    now: float,
    exclude: frozenset[int],
    caps: list[int],
    idle_timeout: float,
    rng: random.Random,
    live: Sequence[int],
) -> list[int]:
    """Pull mode: spread the outstanding fetch budget (``wanted``) over ``links``.

    Links that delivered within ``low_rdy_idle_timeout`` and did not run dry since (see
    :func:`_delivering`) are *active*: they get the budget, while every idle link keeps a
    probe of 1 (so messages that show up on any nsqd are still found; a probe that delivers
    makes its link active). With no active
    link (or all of them active) the budget is spread evenly. With fewer RDY than links,
    active links come first, most recent first. The caller rebalances as soon as a link
    has used up its share, so budget parked on an empty nsqd moves to the busy one at once.
    """
    n = len(links)
    usable = [i for i in range(n) if caps[i] > 0]
    if wanted <= 0 or not usable:
        return [0] * n
    recent_after = now - idle_timeout
    active = [
        i
        for i in usable
        if links[i].conn_id not in exclude and _delivering(links[i], live[i], now, recent_after)
    ]
    active.sort(key=lambda i: (links[i].last_message_at, links[i].pull_seq), reverse=True)
    if wanted < len(usable):
        return pick_holders(links, wanted, exclude, caps, rng, active)
    if not active or len(active) == len(usable):
        return even_shares(wanted, caps)
    shares = [0] * n
    chosen = set(active)
    idle = [i for i in usable if i not in chosen]
    for i in idle:
        shares[i] = 1
    rest = wanted - len(idle)
    for i, share in zip(active, even_shares(rest, [caps[i] for i in active]), strict=True):
        shares[i] = share
        rest -= share
    if rest > 0:  # the active links are capped: the idle ones take the rest
        extra = even_shares(rest, [caps[i] - 1 for i in idle])
        for i, share in zip(idle, extra, strict=True):
            shares[i] += share
    return shares


def pick_holders(
    links: list[Link],
    count: int,
    exclude: frozenset[int],
    caps: list[int],
    rng: random.Random,
    first: Sequence[int] = (),
) -> list[int]:
    """Fewer RDY than connections: 1 each to ``first`` (pull mode's active links), then
    the current holders, then at random."""
    shares = [0] * len(links)
    if count <= 0:
        return shares
    if first:
        for i in first[:count]:
            shares[i] = 1
        count -= min(count, len(first))
        if count == 0:
            return shares
        caps = [0 if shares[i] else cap for i, cap in enumerate(caps)]
    held = [i for i, link in enumerate(links) if link.target > 0 and caps[i] > 0]
    if len(held) > count:
        held.sort(key=lambda i: links[i].last_message_at, reverse=True)
        held = held[:count]
    free = [
        i
        for i, link in enumerate(links)
        if i not in held and caps[i] > 0 and link.conn_id not in exclude
    ]
    if len(held) + len(free) < count:  # not enough fresh ones: allow the excluded back
        free += [
            i for i, link in enumerate(links) if i not in held and i not in free and caps[i] > 0
        ]
    need = min(len(free), count - len(held))
    fresh = [i for i in free if links[i].dry_at == -math.inf]
    if len(fresh) == len(free):
        chosen = held + rng.sample(free, need)
    else:  # pull mode passed RDY on from some: never dry ones first, then the longest dry
        picked = rng.sample(fresh, min(len(fresh), need))
        dry = sorted(
            (i for i in free if links[i].dry_at != -math.inf), key=lambda i: links[i].dry_at
        )
        chosen = held + picked + dry[: need - len(picked)]
    for i in chosen:
        shares[i] = 1
    return shares


def _delivering(link: Link, live: int, now: float, recent_after: float) -> bool:
    """Pull mode's *active*: delivered since ``recent_after`` and has not run dry since:
    neither passed its RDY on (``dry_at``) nor left RDY unused (nsqd's RDY above the ``live``
    messages in flight there) for a settle time after its last message or raise, which
    means nsqd had nothing more to send there."""
    last = link.last_message_at
    if last <= recent_after or last <= link.dry_at:
        return False
    quiet = now - (last if last > link.raised_at else link.raised_at)
    return not (link.wire_rdy > live and quiet >= link.settle_delay)

"""RDY arithmetic shared by the coordinator's push and pull modes, pure and allocation-light.

* :func:`even_shares` spreads a budget over connections: ``budget // n`` each, the remainder
  one by one to the first connections, each share capped (by nsqd's ``max_rdy_count``) with what
  a capped connection cannot take handed to the others. The sum never exceeds the budget.
* :func:`needs_refresh` is the client guide's rule: re-send RDY when the count left is 0 or below
  ~25% of the last value sent, not on every message.
* :func:`is_starved` is the guide's ``is_starved`` for one connection.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["STARVED_RATIO", "even_shares", "is_starved", "needs_refresh"]

#: The guide's constant: anticipate starvation at 85% of the connection's RDY, not 100%.
STARVED_RATIO = 0.85


def even_shares(budget: int, caps: Sequence[int]) -> list[int]:
    """Split ``budget`` over ``len(caps)`` connections as evenly as the caps allow.

    Order matters: the remainder (``budget % n``) goes to the first connections, so callers put
    the connections they prefer first. ``sum(result) <= budget`` and ``result[i] <= caps[i]``.
    """
    n = len(caps)
    if n == 0 or budget <= 0:
        return [0] * n
    shares = [0] * n
    capped = [False] * n
    left, k = budget, n
    # Water-fill from the smallest cap: a connection whose cap is at or below the fair share
    # takes its cap; the rest split what is left evenly (and are all strictly above it).
    for i in sorted(range(n), key=caps.__getitem__):
        cap = max(caps[i], 0)
        if cap > left // k:
            break
        shares[i] = cap
        capped[i] = True
        left -= cap
        k -= 1
        if k == 0:
            return shares
    base, remainder = divmod(left, k)
    for i in range(n):
        if not capped[i]:
            shares[i] = base + (1 if remainder > 0 else 0)
            remainder -= 1
    return shares


def needs_refresh(remaining: int, last_sent: int) -> bool:
    """True when RDY should be re-sent: nothing left, or under a quarter of the last value."""
    return last_sent > 0 and (remaining <= 0 or remaining * 4 < last_sent)


def is_starved(in_flight: int, last_rdy: int) -> bool:
    """The guide's test for one connection: it holds (almost) as many messages as its RDY."""
    return in_flight > 0 and in_flight >= last_rdy * STARVED_RATIO

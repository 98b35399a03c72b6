"""The rules a simulated cluster must keep (:class:`Invariant`) and what breaking one looks like
(:class:`Violation`, and :class:`InvariantViolation` when a run fails).

They sit apart from the checks themselves (:mod:`.invariants`) so that the nodes can report a
broken rule (the client API raising, for one) without importing the monitor that watches them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Invariant", "InvariantViolation", "Violation"]


class Invariant(enum.Enum):
    """The properties the monitor checks (each violation names one)."""

    RDY_SUM = "rdy_sum"
    RDY_IN_FLIGHT = "rdy_in_flight"
    HELD = "held"
    BACKOFF_RDY = "backoff_rdy"
    AT_LEAST_ONCE = "at_least_once"
    DRAIN = "drain"
    DISCOVERY = "discovery"
    BROKER_EMPTY = "broker_empty"
    CLIENT_API = "client_api"
    ATTEMPTS = "attempts"


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken invariant: which, at what virtual time, and what was seen."""

    invariant: Invariant
    time: float
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant.value} @ {self.time:.3f}s] {self.detail}"


class InvariantViolation(AssertionError):
    """Raised when an invariant fails; the message ends with the line that replays the run."""

    def __init__(self, violations: list[Violation], replay: str) -> None:
        shown = "\n  ".join(str(v) for v in violations[:10])
        more = f"\n  ... and {len(violations) - 10} more" if len(violations) > 10 else ""
        super().__init__(
            f"{len(violations)} invariant violation(s):\n  {shown}{more}\nreplay: {replay}"
        )
        self.violations = violations
        self.replay = replay

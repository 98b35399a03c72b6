"""Consumer-wide backoff after failed messages (NSQ client guide, "Backoff"), pure.

Three phases: ``NORMAL`` (full RDY), ``WAITING`` (a backoff window: RDY 0 everywhere, results
ignored) and ``TESTING`` (the window expired: RDY 1 on one connection; the next result decides).
A failure raises the level and opens a window of ``multiplier * 2**level`` seconds (capped at
``max_duration``); a success lowers the level and, at level 0, returns to ``NORMAL``. Only one
result counts per window, so a burst of failures already in flight cannot push the level to the
maximum at once. A neutral result (REQ without backoff, a give-up) while testing opens another
window at the same level, as go-nsq does.

Also here: :func:`reconnect_delay`, the capped, jittered exponential delay for direct-mode
reconnection.
"""

from __future__ import annotations

import enum
import random

__all__ = ["Backoff", "BackoffPhase", "Outcome", "reconnect_delay"]

_MAX_LEVEL_LIMIT = 62


class BackoffPhase(enum.Enum):
    """Where the consumer is in its backoff cycle."""

    NORMAL = "normal"
    WAITING = "waiting"
    TESTING = "testing"


class Outcome(enum.Enum):
    """What the handling of one message says about the downstream system."""

    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


class Backoff:
    """The backoff state machine; the coordinator turns its phase into an RDY budget."""

    __slots__ = (
        "_deadline",
        "_enabled",
        "_level",
        "_max_duration",
        "_max_level",
        "_multiplier",
        "_phase",
    )

    def __init__(self, multiplier: float, max_duration: float, *, enabled: bool = True) -> None:
        self._multiplier = multiplier
        self._max_duration = max_duration
        self._enabled = enabled and multiplier > 0 and max_duration > 0
        self._level = 0
        self._phase = BackoffPhase.NORMAL
        self._deadline: float | None = None
        level = 0
        while self._enabled and multiplier * 2.0**level < max_duration and level < _MAX_LEVEL_LIMIT:
            level += 1
        self._max_level = max(level, 1)

    @property
    def phase(self) -> BackoffPhase:
        """Where the consumer is: running normally, waiting out a window, or testing with RDY 1."""
        return self._phase

    @property
    def level(self) -> int:
        """Consecutive failures not yet made up for; 0 when not backing off."""
        return self._level

    @property
    def max_level(self) -> int:
        """The level at which the window stops growing (its duration reaches the cap)."""
        return self._max_level

    @property
    def deadline(self) -> float | None:
        """When the current window ends (``WAITING`` only)."""
        return self._deadline

    @property
    def enabled(self) -> bool:
        """False when backoff is turned off (``backoff_enabled`` or a zero duration cap)."""
        return self._enabled

    def duration(self, level: int) -> float:
        """Length of a window at ``level``: ``multiplier * 2**level``, capped."""
        if level <= 0:
            return 0.0
        return min(self._multiplier * 2.0 ** min(level, _MAX_LEVEL_LIMIT), self._max_duration)

    def rdy_budget(self, max_in_flight: int) -> int:
        """Total RDY the phase allows: everything, nothing, or the single test RDY 1."""
        if self._phase is BackoffPhase.NORMAL:
            return max_in_flight
        if self._phase is BackoffPhase.WAITING:
            return 0
        return min(1, max_in_flight)

    def record(self, outcome: Outcome, now: float) -> bool:
        """Count one result; returns True when the phase changed (RDY must be redone)."""
        if not self._enabled or self._phase is BackoffPhase.WAITING:
            return False
        if outcome is Outcome.FAILURE:
            if self._level < self._max_level:
                self._level += 1
            self._open_window(now)
            return True
        if self._level == 0:  # NORMAL: successes and neutral results change nothing
            return False
        if outcome is Outcome.SUCCESS:
            self._level -= 1
            if self._level == 0:
                self._phase = BackoffPhase.NORMAL
                self._deadline = None
                return True
        self._open_window(now)
        return True

    def handle_timer(self, now: float) -> bool:
        """End the window when its deadline passed; True when the phase changed to TESTING."""
        if (
            self._phase is BackoffPhase.WAITING
            and self._deadline is not None
            and now >= self._deadline
        ):
            self._phase = BackoffPhase.TESTING
            self._deadline = None
            return True
        return False

    def reset(self) -> None:
        """Forget all backoff (used when the consumer drains or is reconfigured)."""
        self._level = 0
        self._phase = BackoffPhase.NORMAL
        self._deadline = None

    def _open_window(self, now: float) -> None:
        self._phase = BackoffPhase.WAITING
        self._deadline = now + self.duration(self._level)


def reconnect_delay(
    failures: int, base: float, cap: float, jitter: float, rng: random.Random
) -> float:
    """Delay before reconnect attempt number ``failures`` (1-based): ``base * 2**(failures-1)``
    capped at ``cap``, minus a random fraction up to ``jitter`` so clients spread out."""
    exponent = min(max(failures - 1, 0), _MAX_LEVEL_LIMIT)
    delay = min(base * 2.0**exponent, cap)
    return delay * (1.0 - jitter * rng.random())

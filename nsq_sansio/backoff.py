"""Consumer-wide backoff after failed messages (NSQ client guide, "Backoff"), pure.

Three phases: ``NORMAL`` (full RDY), ``WAITING`` (a backoff window: RDY 0 everywhere) and
``TESTING`` (the window is over: one new message at a time is let in, and every result
counts).

* A **failure** (REQ with backoff) of a message on its first delivery raises the level by one
  and opens a window of ``multiplier * 2**level`` seconds (capped at ``max_duration``; the level
  stops growing once the cap is reached).
* A **repeated failure** (a message delivered before, ``attempts > 1``, fails again) opens a
  window at the level the consumer is at, level 1 at least, but does not raise it: a poison
  message on its way to ``max_attempts`` raises the level once, however often it fails, so a
  steady trickle of them cannot push the consumer into long windows.
* A **success** (FIN, or a give-up: it FINs, as in go-nsq and pynsq) lowers the level by one;
  at level 0 the consumer is back to ``NORMAL``. While testing, a success above level 0 does
  not open another window: the test goes on and lets two more messages in (one for the slot
  it freed, one more), so a consumer whose downstream recovered is back to full speed after
  ``level`` successes, sooner with many handlers.
* A **neutral** result (REQ without backoff) while testing opens another window at the same
  level (nothing was learned), as go-nsq and pynsq do; otherwise it changes nothing.

Results that arrive while ``WAITING`` come from messages already in flight when the window
opened: they never raise the level (a burst of failures cannot push it to the maximum at
once), but once their successes outnumber their failures (the one that opened the window
included), each further success lowers the level, and at 0 the window ends early (as in
pynsq, successes always count): one poison message among handlers that succeed costs
nothing, while a downstream where most calls fail keeps the window. The test phase lets in
one message more than the consumer holds when it begins (handlers still running keep their
messages and do not hold the test back); the coordinator turns :meth:`Backoff.rdy_budget`
into RDY, counting messages nsqd took back (past their deadline: a handler that hangs) out
of ``max_in_flight``, and letting one message in whenever nothing held is still in flight
(no result can come of a taken-back message: the test must never wait for one).

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
    #: A failure of a message delivered before (``attempts > 1``): a retry that failed again.
    REPEATED_FAILURE = "repeated_failure"
    NEUTRAL = "neutral"


class Backoff:
    """The backoff state machine; the coordinator turns its phase into an RDY budget."""

    __slots__ = (
        "_allowance",
        "_balance",
        "_deadline",
        "_enabled",
        "_failures",
        "_level",
        "_max_duration",
        "_max_level",
        "_multiplier",
        "_phase",
        "_window",
        "_windows",
    )

    def __init__(self, multiplier: float, max_duration: float, *, enabled: bool = True) -> None:
        self._multiplier = multiplier
        self._max_duration = max_duration
        self._enabled = enabled and multiplier > 0 and max_duration > 0
        self._level = 0
        self._phase = BackoffPhase.NORMAL
        self._deadline: float | None = None
        self._window = 0.0
        self._windows = 0
        self._failures = 0
        self._allowance = 0
        #: While waiting: successes minus failures of the window so far.
        self._balance = 0
        level = 0
        while self._enabled and multiplier * 2.0**level < max_duration and level < _MAX_LEVEL_LIMIT:
            level += 1
        self._max_level = max(level, 1)

    @property
    def phase(self) -> BackoffPhase:
        """Where the consumer is: running normally, waiting out a window, or testing."""
        return self._phase

    @property
    def level(self) -> int:
        """How far the consumer backs off (a window lasts ``multiplier * 2**level``); 0 when
        it does not."""
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
    def window(self) -> float:
        """How long the current window lasts (``WAITING`` only, else 0)."""
        return self._window if self._phase is BackoffPhase.WAITING else 0.0

    @property
    def windows(self) -> int:
        """How many windows were opened since the consumer started (a counter)."""
        return self._windows

    @property
    def failures(self) -> int:
        """Failures counted since the consumer last ran normally (0 when it does)."""
        return self._failures

    @property
    def allowance(self) -> int:
        """While testing: how many messages the consumer may hold (those it held when the
        test began, plus one, plus two per success since); else 0."""
        return self._allowance if self._phase is BackoffPhase.TESTING else 0

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
        """Total RDY the phase allows: everything, nothing, or (testing) the allowance."""
        if self._phase is BackoffPhase.NORMAL:
            return max_in_flight
        if self._phase is BackoffPhase.WAITING:
            return 0
        return min(self._allowance, max_in_flight)

    def record(self, outcome: Outcome, now: float) -> bool:
        """Count one result; True when the phase or the level changed (RDY must be redone)."""
        if not self._enabled:
            return False
        failed = outcome is Outcome.FAILURE or outcome is Outcome.REPEATED_FAILURE
        if self._phase is BackoffPhase.WAITING:
            return self._in_window(outcome, failed)
        if failed:
            self._failures += 1
            if outcome is Outcome.FAILURE or self._level == 0:
                self._level = min(self._level + 1, self._max_level)
            self._open_window(now, balance=-1)
            return True
        if self._level == 0:  # NORMAL: successes and neutral results change nothing
            return False
        if outcome is Outcome.SUCCESS:
            self._level -= 1
            if self._level == 0:
                self.reset()
            else:  # testing: the freed slot, and one more
                self._allowance += 1
            return True
        self._open_window(now, balance=0)  # neutral while testing: nothing learned, wait again
        return True

    def _in_window(self, outcome: Outcome, failed: bool) -> bool:
        """A result while waiting: it never raises the level; a success that makes the
        window's successes outnumber its failures lowers it (ending the window at 0)."""
        if failed:
            self._balance -= 1
            return False
        if outcome is not Outcome.SUCCESS:
            return False
        self._balance += 1
        if self._balance <= 0:
            return False
        self._balance = 0
        self._level -= 1
        if self._level == 0:
            self.reset()
        return True

    def handle_timer(self, now: float, held: int = 0) -> bool:
        """End the window when its deadline passed (the consumer holds ``held`` messages):
        True when the phase changed to TESTING."""
        if (
            self._phase is BackoffPhase.WAITING
            and self._deadline is not None
            and now >= self._deadline
        ):
            self._phase = BackoffPhase.TESTING
            self._deadline = None
            self._allowance = held + 1
            return True
        return False

    def reset(self) -> None:
        """Forget all backoff (used when the consumer drains or is reconfigured)."""
        self._level = 0
        self._phase = BackoffPhase.NORMAL
        self._deadline = None
        self._failures = 0
        self._allowance = 0

    def _open_window(self, now: float, *, balance: int) -> None:
        self._phase = BackoffPhase.WAITING
        self._balance = balance
        self._window = self.duration(self._level)
        self._deadline = now + self._window
        self._windows += 1
        self._allowance = 0


def reconnect_delay(
    failures: int, base: float, cap: float, jitter: float, rng: random.Random
) -> float:
    """Delay before reconnect attempt number ``failures`` (1-based): ``base * 2**(failures-1)``
    capped at ``cap``, minus a random fraction up to ``jitter`` so clients spread out."""
    exponent = min(max(failures - 1, 0), _MAX_LEVEL_LIMIT)
    delay = min(base * 2.0**exponent, cap)
    return delay * (1.0 - jitter * rng.random())

"""The user handler a simulated consumer runs: a plain function plus simulated timing and
failures (how long a job takes, how often it fails or hangs, whether it keeps the message alive).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..consumer import Deliver

__all__ = ["HANG", "Handler"]


@dataclass(frozen=True, slots=True)
class Handler:
    """A user handler as a plain function plus simulated timing and failures.

    ``fn(body)`` is the user's own logic, called when the simulated work ends; raising makes the
    message fail (REQ). ``duration`` (seconds, or a function of the delivery) and ``jitter``
    (a random extra up to that) give the time it takes; ``failure_rate`` fails that share of
    messages at random; ``keepalive`` TOUCHes the message while the job runs (up to the server's
    max_msg_timeout). ``requeue_delay``/``backoff`` are passed to ``requeue``.
    """

    fn: Callable[[bytes], object] | None = None
    duration: float | Callable[[Deliver], float] = 0.001
    jitter: float = 0.0
    failure_rate: float = 0.0
    keepalive: bool = False
    requeue_delay: float | None = None
    backoff: bool = True
    hang_rate: float = 0.0
    #: Jobs run at once; more deliveries wait in a local buffer, not yet in user code (a drain
    #: requeues those at once). ``None``: every delivery starts at once.
    concurrency: int | None = None

    def decide(self, delivery: Deliver, rng: random.Random) -> tuple[float, bool]:
        """(duration, hang) for one delivery; the outcome is decided when the work ends."""
        base = self.duration(delivery) if callable(self.duration) else self.duration
        if self.jitter:
            base += rng.random() * self.jitter
        hang = self.hang_rate > 0 and rng.random() < self.hang_rate
        return base, hang

    def outcome(self, delivery: Deliver, rng: random.Random) -> bool | None:
        """True to FIN, False to REQ, None to never answer (``fn`` returned :data:`HANG`)."""
        if self.failure_rate and rng.random() < self.failure_rate:
            return False
        if self.fn is not None:
            try:
                if self.fn(delivery.body) is HANG:
                    return None
            except Exception:
                return False
        return True


#: What a handler function returns to simulate a worker stuck on the message forever.
HANG = object()

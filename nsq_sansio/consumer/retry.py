"""Retries, pure: how long a requeued message waits (by its attempts), when a lost nsqd is
tried again (direct mode), and the give-up rule.

* :func:`requeue_delay`: a REQ without a delay waits ``default_requeue_delay * attempts``,
  capped by ``max_requeue_delay`` and by the server's ``max_req_timeout``.
* :func:`over_attempts`: a message delivered more than ``max_attempts`` times (0: no limit) is
  given up (FIN'd and reported); the coordinator's read path inlines the same test.
* :class:`DirectRetry`: one configured nsqd's reconnect schedule, capped and jittered
  exponential backoff (:func:`~nsq_sansio.backoff.reconnect_delay`), reset by a subscription.
  Addresses found by lookupd are not retried here: a later poll that still lists them does it.
"""

from __future__ import annotations

import random

from ..backoff import reconnect_delay
from ..config import Config

__all__ = ["DirectRetry", "over_attempts", "requeue_delay"]


def requeue_delay(config: Config, attempts: int, max_req_timeout: float | None) -> float:
    """The automatic REQ delay: ``default_requeue_delay * attempts``, capped."""
    delay = min(config.default_requeue_delay * max(attempts, 1), config.max_requeue_delay)
    if max_req_timeout is not None:
        delay = min(delay, max_req_timeout)
    return delay


def over_attempts(attempts: int, max_attempts: int) -> bool:
    """True when a message delivered ``attempts`` times is to be given up."""
    return bool(max_attempts) and attempts > max_attempts


class DirectRetry:
    """The reconnect state of one nsqd address from the configuration."""

    __slots__ = ("failures", "retry_at")

    def __init__(self) -> None:
        self.failures = 0
        self.retry_at: float | None = None

    def schedule(self, now: float, config: Config, rng: random.Random) -> float:
        """The connection was lost (or never made): plan the next attempt; returns its time."""
        self.failures += 1
        self.retry_at = now + reconnect_delay(
            self.failures,
            config.reconnect_delay,
            config.max_reconnect_delay,
            config.reconnect_jitter,
            rng,
        )
        return self.retry_at

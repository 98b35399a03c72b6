"""Retries (:class:`Retries`): how long a requeued message waits (by its attempts), when a
lost nsqd is tried again (direct mode), the give-up rule, and the given-up messages handed
over as dead letters.

Rules:

* :func:`requeue_delay`: a REQ without a delay waits ``default_requeue_delay * attempts``,
  capped by ``max_requeue_delay`` and by the server's ``max_req_timeout``.
* :func:`over_attempts`: a message delivered more than ``max_attempts`` times (0: no limit) is
  given up (FIN'd and reported); the coordinator's read path inlines the same test.
* :class:`DirectRetry`: one configured nsqd's reconnect schedule, capped and jittered
  exponential backoff (:func:`~nsq_sansio.backoff.reconnect_delay`), reset by a subscription.
  Addresses found by lookupd are not retried here: a later poll that still lists them does it.
* With ``dead_letter=True`` a given-up message is handed over (``DeadLetter``) and reported
  on exactly once, by identity (:meth:`Retries.take_dead_letter`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from ..backoff import reconnect_delay
from ..config import Config
from ..discovery import NSQDAddress
from ..errors import LocalProtocolError
from .actions import Deliver
from .link import Link

__all__ = ["DirectRetry", "Retries", "over_attempts", "requeue_delay"]


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


class Retries:
    """The consumer's retries (see the module docstring): the direct addresses' reconnect
    schedules, the requeue delay, and the dead letters waiting for the transport's report."""

    __slots__ = ("_config", "_rng", "dead_letter", "dead_letters", "direct", "max_attempts")

    def __init__(
        self,
        config: Config,
        rng: random.Random,
        nsqd: Iterable[NSQDAddress],
        *,
        dead_letter: bool,
    ) -> None:
        self._config = config
        self._rng = rng
        self.direct: dict[NSQDAddress, DirectRetry] = {}
        for address in nsqd:
            self.direct.setdefault(address, DirectRetry())
        #: Messages delivered more than this many times are given up (0: no limit).
        self.max_attempts = config.max_attempts
        #: A given-up message is handed to the transport (DeadLetter) instead of FIN'd here.
        self.dead_letter = bool(dead_letter)
        #: Deliveries handed over as DeadLetter and not reported on yet, by identity (nsqd
        #: may send the same id again meanwhile: each handle is reported on once).
        self.dead_letters: dict[int, Deliver] = {}

    def requeue_delay(self, attempts: int, link: Link | None) -> float:
        """The automatic REQ delay, capped also by ``link``'s server (configured or
        announced ``max_req_timeout``)."""
        max_req_timeout = link.max_req_timeout if link is not None else None
        if link is not None and link.proto is not None:
            known = link.proto.max_req_timeout  # configured, or announced by nsqd
            if known is not None and (max_req_timeout is None or known < max_req_timeout):
                max_req_timeout = known
        return requeue_delay(self._config, attempts, max_req_timeout)

    # --- direct addresses ----------------------------------------------------------------------

    def lost(self, address: NSQDAddress, now: float) -> float | None:
        """A direct address's connection is gone: when it is tried again (None: not direct)."""
        retry = self.direct.get(address)
        if retry is None:
            return None
        return retry.schedule(now, self._config, self._rng)

    def subscribed(self, address: NSQDAddress) -> None:
        """A subscription resets the address's reconnect backoff."""
        retry = self.direct.get(address)
        if retry is not None:
            retry.failures = 0

    def stop(self) -> None:
        """No more reconnects (drain, failure)."""
        for retry in self.direct.values():
            retry.retry_at = None

    def due(self, now: float) -> list[NSQDAddress]:
        """The direct addresses whose reconnect time came."""
        due = []
        for address, retry in self.direct.items():
            if retry.retry_at is not None and now >= retry.retry_at:
                retry.retry_at = None
                due.append(address)
        return due

    def next_deadline(self) -> float | None:
        """The soonest reconnect."""
        times = [r.retry_at for r in self.direct.values() if r.retry_at is not None]
        return min(times) if times else None

    # --- dead letters --------------------------------------------------------------------------

    def hand_over(self, delivery: Deliver) -> None:
        """``delivery`` is handed to the transport as a DeadLetter."""
        self.dead_letters[id(delivery)] = delivery

    def take_dead_letter(self, delivery: Deliver) -> None:
        """Forget ``delivery`` as a pending dead letter; LocalProtocolError if it never was
        one (reporting on a message the coordinator did not hand over is a transport bug)."""
        if self.dead_letters.pop(id(delivery), None) is delivery:
            return
        raise LocalProtocolError(
            f"message {delivery.id!r} was not handed over as a DeadLetter, or was reported on"
        )

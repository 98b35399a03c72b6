"""What every part of one nsqd node shares: its timers, its output bookkeeping, its health.

nsqd's goroutines share the ``NSQD`` struct; here the topics, channels, clients and the protocol
share one :class:`NodeContext`: the heap of alarms (one entry per client or channel that has
something due, see :meth:`NodeContext.arm`) and the sequence numbers that order it, the
connections that got output since the transport last asked, the injected ``random.Random``, the
health that ``/ping`` reports after a backend failure, the latest ``now`` seen, the in-memory
queue size and the message ids and timestamps. It holds no topic, channel or client itself, so
every module can use it without importing the others.
"""

from __future__ import annotations

import math
import random
from heapq import heappop, heappush
from typing import Protocol

from .backend import Backend, BackendError
from .message import Message, MessageIds, to_record

__all__ = ["INF", "NodeContext", "Timed"]

INF = math.inf


class Timed(Protocol):
    """Something with an alarm on the node's heap (a client or a channel)."""

    alarm_at: float  # the deadline of its live heap entry; INF when it has none


class NodeContext:
    """The node-wide state the parts of one nsqd node share (see the module docstring)."""

    __slots__ = (
        "alarms",
        "dirty",
        "epoch_offset",
        "health",
        "ids",
        "mem_limit",
        "now",
        "rng",
        "seq",
    )

    def __init__(
        self, rng: random.Random, *, node_id: int, mem_limit: int, epoch_offset: float, now: float
    ) -> None:
        self.rng = rng
        self.alarms: list[tuple[float, int, Timed]] = []
        # Orders the alarm heap and the channels' in-flight and deferred heaps; an alarm armed
        # during NSQD.handle_timer has a larger number than any due when the call began, so it
        # waits for the next call (which pops the heap itself, on the hot path).
        self.seq = 0
        # Connections that got output since connections_with_output() was last called.
        self.dirty: dict[int, None] = {}
        self.health = "OK"
        # The latest ``now`` seen: the time of deliveries data_to_send resumes without one.
        self.now = now
        self.mem_limit = mem_limit
        self.epoch_offset = epoch_offset
        self.ids = MessageIds(node_id, rng)

    def arm(self, owner: Timed, deadline: float) -> None:
        """Have the node's timer come due for ``owner`` at ``deadline`` (if sooner than now)."""
        if deadline < owner.alarm_at:
            owner.alarm_at = deadline
            self.seq += 1
            heappush(self.alarms, (deadline, self.seq, owner))

    def next_alarm(self) -> float | None:
        """The earliest live alarm's deadline (stale heap entries are dropped on the way)."""
        alarms = self.alarms
        while alarms:
            deadline, _, owner = alarms[0]
            if owner.alarm_at != deadline:
                heappop(alarms)
                continue
            return deadline
        return None

    def timestamp(self, now: float) -> int:
        """A message's timestamp: wall-clock nanoseconds."""
        return int((now + self.epoch_offset) * 1_000_000_000)

    def backend_failed(self, exc: BackendError) -> None:
        """nsqd logs and marks itself unhealthy (``GET /ping`` answers 500 with this)."""
        self.health = f"NOK - {exc}"

    def backend_put(self, backend: Backend, msg: Message) -> None:
        """Write a message to a backend at shutdown; a failure marks the node unhealthy."""
        try:
            backend.put(to_record(msg))
        except BackendError as exc:
            self.backend_failed(exc)

"""A virtual clock and a deterministic event scheduler (no real time anywhere).

Events are ``(time, sequence, callback, argument)``: ties at the same virtual instant run in the
order they were scheduled, so a run is a pure function of its seed and its inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Scheduler", "TimerHandle"]


@dataclass(slots=True)
class TimerHandle:
    """A scheduled callback; :meth:`cancel` makes it a no-op (it stays in the heap, lazily)."""

    when: float
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """The simulation's clock: ``now`` only moves when :meth:`run_until` pops an event."""

    __slots__ = ("_heap", "_seq", "events_run", "now")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable[[Any], None], Any, TimerHandle | None]] = []
        self._seq = 0
        #: How many callbacks ran (a measure of work, for benchmarks).
        self.events_run = 0

    def call_at(
        self, when: float, callback: Callable[[Any], None], arg: Any = None, *, handle: bool = False
    ) -> TimerHandle | None:
        """Run ``callback(arg)`` at virtual time ``when`` (never in the past)."""
        when = max(when, self.now)
        token = TimerHandle(when) if handle else None
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, callback, arg, token))
        return token

    def call_later(self, delay: float, callback: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``callback(arg)`` ``delay`` seconds of virtual time from now."""
        self.call_at(self.now + delay, callback, arg)

    def next_time(self) -> float | None:
        """When the next pending event is due, or None when nothing is scheduled."""
        heap = self._heap
        while heap and heap[0][4] is not None and heap[0][4].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def step(self) -> bool:
        """Run the next event; False when none is left."""
        heap = self._heap
        while heap:
            when, _, callback, arg, token = heapq.heappop(heap)
            if token is not None and token.cancelled:
                continue
            self.now = when
            self.events_run += 1
            callback(arg)
            return True
        return False

    def run_until(self, deadline: float, stop: Callable[[], bool] | None = None) -> None:
        """Run every event due at or before ``deadline``; then the clock reads ``deadline``.

        ``stop`` is checked after each event; when it returns True the run ends early (the clock
        then reads the time of the last event run).
        """
        heap = self._heap
        while heap:
            head = heap[0]
            if head[0] > deadline:
                break
            heapq.heappop(heap)
            token = head[4]
            if token is not None and token.cancelled:
                continue
            self.now = head[0]
            self.events_run += 1
            head[2](head[3])
            if stop is not None and stop():
                return
        self.now = max(self.now, deadline)

    def __len__(self) -> int:
        return len(self._heap)

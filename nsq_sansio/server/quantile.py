"""End-to-end processing latency percentiles: nsqd's ``--e2e-processing-latency-percentile``.

With percentiles configured, each channel records how long every message it finishes took from
its publication to its FIN, and ``/stats`` reports the configured percentiles of the recent
ones, per channel and (merged over its channels) per topic, in nsqd's JSON shape::

    {"count": 5, "percentiles": [{"quantile": 0.99, "value": 1911820011}, ...]}

(``value`` in nanoseconds; ``{"count": 0, "percentiles": null}`` when nothing is tracked).

Memory is bounded whatever the traffic: :class:`QuantileStream` is a targeted-quantile summary
(Cormode, Korn, Muthukrishnan and Srivastava, "Effective computation of biased quantiles over
data streams", 2005), the kind nsqd keeps, whose size grows with the logarithm of the count;
:class:`LatencyWindow` keeps two of them, each for half of the window
(``--e2e-processing-latency-window-time``), so what is reported covers between half the window
and the whole of it, as in nsqd.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["BUFFER_SIZE", "EPSILON", "LatencyWindow", "QuantileStream", "go_number"]

#: The rank error allowed around each target, as a fraction of the count (nsqd's is 0.01).
EPSILON = 0.01
#: Values are buffered and merged into the summary this many at a time.
BUFFER_SIZE = 500

# One entry of a summary: [value, width (values it stands for), delta (rank uncertainty)].
_Entry = list[float]


class QuantileStream:
    """A summary of a stream of numbers that answers the ``targets`` quantiles within
    :data:`EPSILON` of their rank, in memory logarithmic in the count."""

    __slots__ = ("_buffer", "_summary", "count", "targets")

    def __init__(self, targets: Sequence[float]) -> None:
        self.targets = tuple(targets)
        self._buffer: list[float] = []
        self._summary: list[_Entry] = []
        self.count = 0.0  # values in the summary (the buffer's come on top)

    def __len__(self) -> int:
        """How many values the stream has seen."""
        return int(self.count) + len(self._buffer)

    def insert(self, value: float) -> None:
        buffer = self._buffer
        buffer.append(value)
        if len(buffer) >= BUFFER_SIZE:
            self._flush()

    def samples(self) -> list[tuple[float, float, float]]:
        """The summary's entries ``(value, width, delta)``, in order (for :meth:`merge`)."""
        self._flush()
        return [(value, width, delta) for value, width, delta in self._summary]

    def merge(self, samples: Iterable[tuple[float, float, float]]) -> None:
        """Add another stream's :meth:`samples` (nsqd merges channels into their topic)."""
        self._merge_sorted(sorted(samples), fresh=False)
        self._compress()

    def query(self, quantile: float) -> float:
        """The value at ``quantile`` (0 when the stream is empty)."""
        self._flush()
        summary = self._summary
        if not summary:
            return 0
        n = self.count
        rank = math.ceil(quantile * n)
        limit = rank + math.ceil(self._allowed(rank, n) / 2)
        previous = summary[0]
        seen = 0.0
        for entry in summary[1:]:
            seen += previous[1]
            if seen + entry[1] + entry[2] > limit:
                return previous[0]
            previous = entry
        return previous[0]

    def reset(self) -> None:
        self._buffer.clear()
        self._summary = []
        self.count = 0.0

    # ------------------------------------------------------------------ the summary

    def _allowed(self, rank: float, n: float) -> float:
        """How many values an entry at ``rank`` may stand for (the targeted invariant): small
        near a target quantile, larger away from every one."""
        allowed = math.inf
        for quantile in self.targets:
            if quantile * n <= rank:
                error = 2 * EPSILON * rank / quantile
            elif quantile < 1:
                error = 2 * EPSILON * (n - rank) / (1 - quantile)
            else:
                continue
            if error < allowed:
                allowed = error
        return allowed

    def _flush(self) -> None:
        buffer = self._buffer
        if buffer:
            buffer.sort()
            self._merge_sorted([(value, 1.0, 0.0) for value in buffer], fresh=True)
            buffer.clear()
            self._compress()

    def _merge_sorted(self, items: list[tuple[float, float, float]], *, fresh: bool) -> None:
        """Insert sorted ``items`` into the summary. A fresh value inserted between two
        entries may be off in rank by what the invariant allows there."""
        summary = self._summary
        n = self.count + sum(item[1] for item in items)
        merged: list[_Entry] = []
        rank = 0.0
        index = 0
        size = len(summary)
        for value, width, delta in items:
            while index < size and summary[index][0] <= value:
                entry = summary[index]
                merged.append(entry)
                rank += entry[1]
                index += 1
            if fresh and merged and index < size:
                delta = max(0.0, math.floor(self._allowed(rank, n)) - 1)
            merged.append([value, width, delta])
            rank += width
        merged.extend(summary[index:])
        self._summary = merged
        self.count = n

    def _compress(self) -> None:
        """Fold entries into their right neighbour while the invariant allows it."""
        summary = self._summary
        if len(summary) < 2:
            return
        n = self.count
        kept = [summary[-1]]
        rank = n - summary[-1][1]
        for index in range(len(summary) - 2, -1, -1):
            entry = summary[index]
            rank -= entry[1]
            right = kept[-1]
            if entry[1] + right[1] + right[2] <= self._allowed(rank, n):
                right[1] += entry[1]
            else:
                kept.append(entry)
        kept.reverse()
        self._summary = kept


class LatencyWindow:
    """Processing latencies (nanoseconds) over the last ``window`` seconds: two streams of
    half a window each, the older one dropped as time moves on (nsqd's ``quantile.Quantile``).
    Times are the node's monotonic seconds."""

    __slots__ = ("_current", "_half", "_moved", "_streams", "percentiles")

    def __init__(self, percentiles: Sequence[float], window: float, now: float) -> None:
        self.percentiles = tuple(percentiles)
        self._half = window / 2
        self._moved = now
        self._streams = (QuantileStream(self.percentiles), QuantileStream(self.percentiles))
        self._current = 0

    def insert(self, latency: float, now: float) -> None:
        if now > self._moved + self._half:
            self._advance(now)
        self._streams[self._current].insert(latency)

    def _advance(self, now: float) -> None:
        half = self._half
        if now > self._moved + 2 * half:  # both halves are stale: start over
            for stream in self._streams:
                stream.reset()
            self._moved += math.floor((now - self._moved) / half - 1) * half
        while now > self._moved + half:
            self._current ^= 1
            self._moved += half
            self._streams[self._current].reset()

    def samples(self, now: float) -> list[tuple[float, float, float]]:
        """Both halves' summaries, once the stale one is dropped."""
        self._advance(now)
        return self._streams[0].samples() + self._streams[1].samples()

    def result(self, now: float) -> dict[str, Any]:
        """This channel's ``e2e_processing_latency`` in ``/stats``."""
        return merged_result(self.percentiles, [self], now)


def merged_result(
    percentiles: Sequence[float], windows: Sequence[LatencyWindow], now: float
) -> dict[str, Any]:
    """``e2e_processing_latency`` over ``windows`` merged (a topic's, over its channels'),
    nsqd's shape: ``{"count": 0, "percentiles": null}`` when there are none."""
    if not windows:
        return {"count": 0, "percentiles": None}
    merged = QuantileStream(percentiles)
    merged.merge(sample for window in windows for sample in window.samples(now))
    return {
        "count": len(merged),
        "percentiles": [
            {"quantile": go_number(quantile), "value": go_number(merged.query(quantile))}
            for quantile in percentiles
        ],
    }


def go_number(value: float) -> float:
    """A float as Go's JSON writes it: ``1``, not ``1.0``, when it is whole."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value

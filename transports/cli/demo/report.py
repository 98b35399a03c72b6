"""What the demo shows: the live :class:`Progress` (publish, then each channel, drawn by
:class:`~transports.cli.progress.ProgressDisplay`), the :class:`DemoResult` with the problems
that make a run fail, and the closing table (:func:`format_report`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..progress import ProgressDisplay, Stage
from .accounting import ChannelTally, Tally
from .workload import CHANNELS, DemoOptions

__all__ = ["REPORT_WIDTH", "DemoResult", "Progress", "format_report"]


#: The closing report fits an 80-column terminal.
REPORT_WIDTH = 79


class Progress:
    """The demo's stages (publish, then each channel) drawn by
    :class:`~transports.cli.progress.ProgressDisplay`: bars fitted to the terminal, redrawn in
    place, or one compact line per stage every 2 s when stderr is not a terminal."""

    def __init__(
        self,
        tally: Tally,
        stream: TextIO | None = None,
        enabled: bool = True,
        columns: int | None = None,
    ) -> None:
        self.tally = tally
        self.display = ProgressDisplay(stream, enabled=enabled, columns=columns)

    @property
    def tty(self) -> bool:
        return self.display.tty

    def stages(self) -> list[Stage]:
        t = self.tally
        total = t.workload.count
        out = [Stage("publish", t.published, total, (("deferred", t.deferred),))]
        for name, ch in t.channels.items():
            extras = (("retries", ch.requeued), ("gave up", ch.given_up))
            out.append(Stage(name, ch.accounted, total, extras))
        return out

    def update(self, final: bool = False) -> None:
        self.display.update(self.stages(), final=final)


# --- result and report -----------------------------------------------------------------------


@dataclass(slots=True)
class DemoResult:
    options: DemoOptions
    tally: Tally
    elapsed: float = 0.0
    timed_out: bool = False
    error: str | None = None
    consumer_stats: dict[str, list[Any]] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why the run does not account for every message (empty: it does)."""
        out: list[str] = []
        if self.error:
            out.append(self.error)
        t = self.tally
        workload = t.workload
        if t.published != workload.count:
            out.append(f"published {t.published:,} of {workload.count:,} messages")
        expected_given_up = workload.expected_given_up()
        for name, ch in t.channels.items():
            if not ch.complete():
                missing = ch.missing()
                out.append(
                    f"{name}: {ch.count - ch.accounted:,} messages neither finished nor given up"
                    f" (first: {', '.join(map(str, missing))})"
                )
            if ch.duplicates:
                out.append(f"{name}: {ch.duplicates:,} duplicates beyond retries")
            if ch.double_end:
                out.append(f"{name}: {ch.double_end:,} messages both finished and given up")
            wrong = ch.wrongly_given_up(workload)
            if wrong:
                out.append(f"{name}: {wrong:,} healthy messages given up")
            if ch.complete() and ch.given_up != expected_given_up:
                out.append(f"{name}: given up {ch.given_up:,}, expected {expected_given_up:,}")
        if self.timed_out:
            out.append(f"timed out after {self.options.timeout:g}s")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.1f} ms"


def format_report(result: DemoResult) -> str:
    opts = result.options
    t = result.tally
    publish_time = max(t.publish_done - t.publish_started, 1e-9)
    rows: list[tuple[str, ...]] = [("", "push (2 consumers)", "pull (fetch)")]
    chans = [t.channels[name] for name in CHANNELS]

    def row(label: str, fn: Callable[[ChannelTally], str]) -> None:
        rows.append((label, *(fn(ch) for ch in chans)))

    row("published", lambda ch: f"{t.published:,}")
    row("finished", lambda ch: f"{ch.finished:,}")
    row("requeued", lambda ch: f"{ch.requeued:,}")
    row("given up", lambda ch: f"{ch.given_up:,}")
    row("redelivered (retries)", lambda ch: f"{ch.redelivered:,}")
    row("duplicates", lambda ch: f"{ch.duplicates:,}")
    row("unaccounted", lambda ch: f"{ch.count - ch.accounted:,}")

    def throughput(ch: ChannelTally) -> str:
        span = ch.last_at - ch.first_at
        return f"{ch.handled / span:,.0f} msg/s" if span > 0 else "-"

    row("throughput (handled)", throughput)

    def latency(q: float) -> Callable[[ChannelTally], str]:
        return lambda ch: _ms(_percentile(sorted(ch.latencies), q))

    row("p50 latency", latency(0.5))
    row("p99 latency", latency(0.99))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        f"nsq-sansio demo: {opts.messages:,} messages x {opts.body_size} B, runtime {opts.runtime}",
        f"compression {opts.compression}, TLS {'on' if opts.tls else 'off'};"
        f" total run {result.elapsed:.2f}s",
        f"published to 2 nsqd in {publish_time:.2f}s ({t.published / publish_time:,.0f} msg/s,"
        f" {t.deferred:,} deferred)",
        "",
    ]
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j])
                for j, cell in enumerate(r)
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("latency: publish to first delivery (attempt 1), deferral excluded")
    problems = result.problems()
    if problems:
        lines += textwrap.wrap("FAILED: " + "; ".join(problems), REPORT_WIDTH)
    else:
        lines.append("OK: every message accounted for (each finished or given up, no duplicates)")
    return "\n".join(lines)

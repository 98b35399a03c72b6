"""Progress lines for the command line (``demo``, ``to-file``, ``tail``): standard library only.

On a terminal the stages are redrawn in place and fitted to its width: a bar, percent, count,
rate and ETA on one line, and the stage's other figures (retries, give-ups...) on the same
line when there is room, else on a second line; no field is ever cut. Piped (CI logs,
``| tee``), one compact line per stage every ``period`` seconds (2 s), each under 100
characters, so a log stays readable and greppable.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["PIPE_WIDTH", "ProgressDisplay", "Stage", "compact", "duration"]

#: Piped lines stay under this many characters.
PIPE_WIDTH = 100
#: The rate (and so the ETA) is measured over this many seconds of recent samples.
RATE_WINDOW = 5.0
_NAME_WIDTH = 7
_MIN_BAR = 10
_MAX_BAR = 30


@dataclass(frozen=True, slots=True)
class Stage:
    """One line of progress: ``done`` of ``total`` (None: open-ended, no bar and no ETA),
    and extra figures shown after the rate (``("retries", 12)``)."""

    name: str
    done: int
    total: int | None = None
    extras: tuple[tuple[str, int], ...] = ()


def compact(n: int) -> str:
    """``1,234`` below a million, then three significant digits: ``12.3M``, ``4.29G``."""
    if n < 1_000_000:
        return f"{n:,}"
    for unit, size in (("G", 1e9), ("M", 1e6)):
        if n >= size * 0.9995 or unit == "M":
            value = n / size
            if value >= 999.5 and unit == "G":
                return f"{n / 1e12:.3g}T"
            return f"{value:.3g}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def duration(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``; ``--:--`` when unknown; ``>99h`` past that."""
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0:
        return "--:--"
    total = int(seconds + 0.5)
    if total >= 100 * 3600:
        return ">99h"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _bar(fraction: float, width: int) -> str:
    full = int(min(1.0, max(0.0, fraction)) * width)
    return "[" + "#" * full + "-" * (width - full) + "]"


@dataclass(slots=True)
class _Rate:
    """Recent (time, done) samples of one stage: the rate over the last few seconds, and the
    average from the first progress to the last (for a stage that has finished)."""

    samples: deque[tuple[float, int]] = field(default_factory=deque)
    first: tuple[float, int] | None = None
    last_change: tuple[float, int] | None = None

    def add(self, now: float, done: int) -> None:
        previous = self.samples[-1] if self.samples else (now, 0)
        if done != previous[1]:
            if self.first is None:
                self.first = previous  # the last moment nothing had happened yet
            self.last_change = (now, done)
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] >= RATE_WINDOW:
            self.samples.popleft()

    def per_second(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0

    def average(self) -> float:
        if self.first is None or self.last_change is None:
            return 0.0
        (t0, d0), (t1, d1) = self.first, self.last_change
        return (d1 - d0) / (t1 - t0) if t1 > t0 else 0.0


def _percent(fraction: float) -> str:
    """Rounded down: 99.99% done is not shown as 100.0%."""
    return f"{math.floor(min(1.0, max(0.0, fraction)) * 1000) / 10:5.1f}%"


class ProgressDisplay:
    """Draws :class:`Stage` lists on ``stream`` (stderr by default).

    ``update(stages)`` may be called as often as wanted: on a terminal it redraws at most
    every ``redraw`` seconds, piped it writes at most every ``period`` seconds;
    ``final=True`` always draws (the last state, average rates, ETA 0:00 when done).
    ``columns`` overrides the terminal width (tests); ``clock`` the time source; ``plain``
    writes lines even on a terminal (when other output shares it).
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        period: float = 2.0,
        redraw: float = 0.2,
        columns: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        plain: bool = False,
    ) -> None:
        import sys

        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.period = period
        self.redraw = redraw
        self.columns = columns
        self.clock = clock
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(enabled and not plain and isatty is not None and isatty())
        self.started = clock()
        self._rates: dict[str, _Rate] = {}
        self._drawn = 0
        # a terminal shows the stages at once; a log gets its first lines after one period
        self._last_draw = -math.inf if self.tty else self.started

    # --- layout ---------------------------------------------------------------------------------

    def width(self) -> int:
        """Terminal columns (of the stream's own terminal when it has one)."""
        if self.columns is not None:
            return self.columns
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return shutil.get_terminal_size().columns

    def _figures(self, stage: Stage, now: float, final: bool) -> tuple[str, str, str]:
        """(count, rate, ETA) texts."""
        rate_of = self._rates.setdefault(stage.name, _Rate())
        complete = stage.total is not None and stage.done >= stage.total
        rate = rate_of.average() if final or complete else rate_of.per_second()
        count = compact(stage.done)
        eta = ""
        if stage.total is not None:
            count += "/" + compact(stage.total)
            remaining = max(0, stage.total - stage.done)
            if remaining == 0:
                eta = "ETA 0:00"
            else:
                eta = "ETA " + duration(remaining / rate if rate > 0 else math.nan)
        return count, f"{compact(int(rate + 0.5))}/s", eta

    def _extras(self, stage: Stage) -> str:
        return "  ".join(f"{label} {compact(value)}" for label, value in stage.extras)

    def terminal_lines(self, stages: Sequence[Stage], now: float, final: bool = False) -> list[str]:
        """The lines drawn on a terminal ``self.width()`` columns wide (each fits in it).

        A stage's figures (percent, count, rate, ETA) and extras share one line when there is
        room for them and a bar of at least 10 columns; otherwise the extras (and, on very
        narrow terminals, the trailing figures) go to a second, indented line. Bars have one
        width for all stages, at most 30 columns."""
        width = max(20, self.width() - 1)  # never write into the last column (auto-wrap)
        indent = " " * (_NAME_WIDTH + 1)
        layouts: list[tuple[str, float | None, list[str], list[str]]] = []
        for stage in stages:
            count, rate, eta = self._figures(stage, now, final)
            fraction: float | None = None
            first = [count, rate]
            if stage.total is not None:
                fraction = stage.done / stage.total if stage.total else 1.0
                first = [_percent(fraction), count, rate, eta]
            second = [self._extras(stage)] if stage.extras else []
            layouts.append((stage.name.ljust(_NAME_WIDTH), fraction, first, second))

        def room(name: str, first: list[str], second: list[str], joined: bool) -> int:
            text = " ".join(first) + ("  " + "  ".join(second) if joined and second else "")
            return width - len(name) - 1 - len(text) - 1 - 2  # " [" + "]" around the bar

        # extras on the first lines only if every stage then still has a 10-column bar
        joined = all(not sec or room(n, f, sec, True) >= _MIN_BAR for n, _, f, sec in layouts)
        decided: list[tuple[str, float | None, list[str], list[str], bool]] = []
        for name, fraction, first, second in layouts:
            if not joined:
                while len(first) > 1 and len(name) + 1 + len(" ".join(first)) > width:
                    second.insert(0, first.pop())
            decided.append((name, fraction, first, second, joined))
        bars = [room(n, f, s, j) for n, fr, f, s, j in decided if fr is not None]
        bar_width = min(_MAX_BAR, *bars) if bars else 0
        out: list[str] = []
        for name, fraction, first, second, joined in decided:
            bar = f" {_bar(fraction, bar_width)}" if fraction is not None and bar_width >= 3 else ""
            line = f"{name}{bar} " + " ".join(first)
            if joined and second:
                line += "  " + "  ".join(second)
            out.append(line[:width])
            if second and not joined:
                out.append((indent + "  ".join(second))[:width])
        return out

    def plain_lines(self, stages: Sequence[Stage], now: float, final: bool = False) -> list[str]:
        """One compact line per stage (under :data:`PIPE_WIDTH` characters)."""
        stamp = f"[{duration(now - self.started):>7}]"
        out = []
        for stage in stages:
            count, rate, eta = self._figures(stage, now, final)
            parts = [stamp, stage.name]
            if stage.total is not None:
                fraction = stage.done / stage.total if stage.total else 1.0
                parts.append(_percent(fraction).strip())
            parts += [count, rate]
            if eta:
                parts.append(eta)
            extras = self._extras(stage).replace("  ", " ")
            if extras:
                parts.append(extras)
            out.append(" ".join(parts)[: PIPE_WIDTH - 1])
        return out

    # --- drawing --------------------------------------------------------------------------------

    def update(self, stages: Sequence[Stage], final: bool = False) -> None:
        if not self.enabled:
            return
        now = self.clock()
        for stage in stages:
            self._rates.setdefault(stage.name, _Rate()).add(now, stage.done)
        wait = self.redraw if self.tty else self.period
        if not final and now - self._last_draw < wait:
            return
        self._last_draw = now
        if self.tty:
            lines = self.terminal_lines(stages, now, final)
            up = f"\x1b[{self._drawn}F" if self._drawn else ""
            self.stream.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
            # a layout with fewer lines than the last one: clear what is left below
            if len(lines) < self._drawn:
                self.stream.write("\x1b[0J")
            self._drawn = len(lines)
        else:
            self.stream.write("".join(f"{line}\n" for line in self.plain_lines(stages, now, final)))
        self.stream.flush()

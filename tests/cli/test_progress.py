"""``transports.progress`` layouts: every field fits, whatever the counts (no sockets)."""

from __future__ import annotations

import io

from hypothesis import given
from hypothesis import strategies as st

from transports.progress import ProgressDisplay, Stage, compact, duration

counts = st.integers(min_value=0, max_value=2**32 - 1)


@given(
    total=st.integers(min_value=1, max_value=2**32 - 1),
    done=counts,
    retries=counts,
    gave_up=counts,
    elapsed=st.floats(min_value=0.1, max_value=1e6),
    columns=st.integers(min_value=80, max_value=200),
)
def test_every_field_fits_a_terminal_and_a_log_line(
    total: int, done: int, retries: int, gave_up: int, elapsed: float, columns: int
) -> None:
    done = min(done, total)
    now = [0.0]
    display = ProgressDisplay(io.StringIO(), columns=columns, clock=lambda: now[0])
    stages = [
        Stage("publish", done, total, (("deferred", retries // 100),)),
        Stage("push", done // 2, total, (("retries", retries), ("gave up", gave_up))),
        Stage("archive", done),
    ]
    display.update([Stage(s.name, 0, s.total, s.extras) for s in stages])
    now[0] = elapsed
    display.update(stages)
    lines = display.terminal_lines(stages, now[0])
    assert all(len(line) < columns for line in lines)
    text = "\n".join(lines)
    for label in ("retries", "gave up", "deferred"):
        assert label in text
    assert text.count("ETA ") == 2 and text.count("/s") == 3
    plain = display.plain_lines(stages, now[0])
    assert len(plain) == 3
    for line, stage in zip(plain, stages, strict=True):
        assert len(line) < 100
        assert f" {stage.name} " in line
        for label, _ in stage.extras:
            assert label in line
    assert "ETA " in plain[0] and "ETA " in plain[1] and "ETA" not in plain[2]


def test_compact_numbers_and_durations() -> None:
    assert compact(999_999) == "999,999"
    assert compact(12_345_678) == "12.3M"
    assert compact(2**32 - 1) == "4.29G"
    assert duration(59.6) == "1:00"
    assert duration(3725) == "1:02:05"
    assert duration(float("nan")) == "--:--"
    assert duration(1e9) == ">99h"


def test_eta_from_the_recent_rate_and_zero_when_done() -> None:
    now = [0.0]
    display = ProgressDisplay(io.StringIO(), columns=100, clock=lambda: now[0])
    for second in range(4):
        now[0] = float(second)
        display.update([Stage("push", second * 100, 1000)])
    [line] = display.terminal_lines([Stage("push", 300, 1000)], now[0])
    assert "100/s" in line and "ETA 0:07" in line  # 700 left at 100/s
    now[0] = 5.0
    display.update([Stage("push", 1000, 1000)], final=True)
    [line] = display.terminal_lines([Stage("push", 1000, 1000)], now[0], final=True)
    assert "100.0%" in line and "ETA 0:00" in line and "200/s" in line  # 1000 in 5 s


def test_piped_output_waits_one_period_and_has_no_escapes() -> None:
    now = [0.0]
    out = io.StringIO()
    display = ProgressDisplay(out, clock=lambda: now[0])
    display.update([Stage("tail", 5)])
    assert out.getvalue() == ""
    now[0] = 2.0
    display.update([Stage("tail", 10)])
    assert out.getvalue().count("\n") == 1 and "\x1b" not in out.getvalue()
    now[0] = 3.0
    display.update([Stage("tail", 12)])
    assert out.getvalue().count("\n") == 1
    display.update([Stage("tail", 12)], final=True)
    assert out.getvalue().count("\n") == 2

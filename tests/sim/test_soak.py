"""The long search (``python -m tests.sim.soak``) as a ``slow`` test, and its plumbing."""

from __future__ import annotations

import os

import pytest

from nsq_sansio.consumer.ledger import RdyLedger
from nsq_sansio.testing.__main__ import main
from nsq_sansio.testing.soak import soak

from ._profile import LONG
from .soak import timed_soak


@pytest.mark.slow
@pytest.mark.skipif(
    not LONG,
    reason="the long search: NSQ_SIM_PROFILE=long NSQ_SIM_SOAK_MINUTES=N "
    "python -m pytest tests/sim -m slow -s",
)
def test_long_search_finds_no_violation() -> None:
    minutes = float(os.environ.get("NSQ_SIM_SOAK_MINUTES", "30"))
    seed = os.environ.get("NSQ_SIM_SOAK_SEED")
    report, _ = timed_soak(minutes, seed=None if seed is None else int(seed))
    assert report.total > 0
    assert not report.findings, "\n".join(f"{f.detail}\n{f.replay}" for f in report.findings)


def test_a_soak_counts_what_it_ran_and_goes_on_after_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    report = soak(seed=5, schedules=4, batch=2, properties=("no-faults",), out=lines.append)
    assert report.total == 4 and report.seeds == [5, 6] and not report.findings
    assert lines[-1] == "soak done: 4 schedules, 2 rounds (seeds 5..6), 0 violations"

    original = RdyLedger.send

    def greedy(self: RdyLedger, link: object, count: int, now: float) -> None:
        original(self, link, count * 2 + 1, now)  # type: ignore[arg-type]

    monkeypatch.setattr(RdyLedger, "send", greedy)
    lines.clear()
    report = soak(seed=5, schedules=4, batch=2, properties=("no-faults",), out=lines.append)
    assert report.total == 4, "a violation does not stop the search"
    assert report.findings and all(f.prop == "no-faults" for f in report.findings)
    assert all(f.replay.startswith("python -m nsq_sansio.testing replay ") for f in report.findings)
    assert any("rdy" in f.detail for f in report.findings)
    assert any(line.startswith("VIOLATION no-faults (round seed 5)") for line in lines)


def test_the_soak_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["soak", "--schedules", "1", "--seed", "9", "--property", "no-faults"]) == 0
    out = capsys.readouterr().out
    assert "soak done: 1 schedules, 1 rounds (seeds 9..9), 0 violations" in out

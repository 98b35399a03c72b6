"""Backoff state machine, reconnect delays and the RDY arithmetic helpers."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.backoff import Backoff, BackoffPhase, Outcome, reconnect_delay
from nsq_sansio.rdy import even_shares, is_starved, needs_refresh

S, F, N = Outcome.SUCCESS, Outcome.FAILURE, Outcome.NEUTRAL


def test_failure_opens_exponential_window_then_tests_with_budget_one() -> None:
    b = Backoff(1.0, 120.0)
    assert b.rdy_budget(50) == 50
    assert b.record(F, now=10.0)
    assert b.phase is BackoffPhase.WAITING and b.level == 1
    assert b.deadline == 12.0  # 1 s * 2**1
    assert b.rdy_budget(50) == 0
    assert not b.handle_timer(11.9)
    assert b.handle_timer(12.0)
    assert b.phase is BackoffPhase.TESTING
    assert b.rdy_budget(50) == 1
    assert b.rdy_budget(0) == 0


def test_only_one_result_counts_per_window() -> None:
    b = Backoff(1.0, 120.0)
    b.record(F, 0.0)
    for _ in range(10):  # failures already in flight during the window are ignored
        assert not b.record(F, 0.5)
    assert b.level == 1
    b.handle_timer(2.0)
    b.record(F, 2.0)
    assert b.level == 2 and b.deadline == 6.0


def test_success_lowers_level_and_level_zero_returns_to_normal() -> None:
    b = Backoff(1.0, 120.0)
    b.record(F, 0.0)
    b.handle_timer(2.0)
    b.record(F, 2.0)
    b.handle_timer(6.0)
    assert b.record(S, 6.0)
    assert b.level == 1 and b.phase is BackoffPhase.WAITING and b.deadline == 8.0
    b.handle_timer(8.0)
    assert b.record(S, 8.0)
    assert b.phase is BackoffPhase.NORMAL and b.level == 0 and b.deadline is None
    assert not b.record(S, 9.0)


def test_neutral_result_while_testing_reopens_window_at_same_level() -> None:
    b = Backoff(2.0, 120.0)
    b.record(F, 0.0)
    b.handle_timer(4.0)
    assert b.record(N, 4.0)
    assert b.level == 1 and b.deadline == 8.0
    assert not Backoff(1.0, 10.0).record(N, 0.0)


def test_window_is_capped_and_level_bounded() -> None:
    b = Backoff(1.0, 120.0)
    now = 0.0
    for _ in range(20):
        b.record(F, now)
        assert b.deadline is not None and b.deadline - now <= 120.0
        now = b.deadline
        b.handle_timer(now)
    assert b.level == b.max_level == 7
    assert b.duration(b.level) == 120.0


def test_disabled_backoff_never_leaves_normal() -> None:
    for b in (Backoff(1.0, 120.0, enabled=False), Backoff(0.0, 120.0), Backoff(1.0, 0.0)):
        assert not b.record(F, 0.0)
        assert b.phase is BackoffPhase.NORMAL
        assert b.rdy_budget(7) == 7


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([S, F, N, None]), st.floats(0, 10)), max_size=60))
def test_backoff_invariants(steps: list[tuple[Outcome | None, float]]) -> None:
    b = Backoff(0.5, 30.0)
    now = 0.0
    for outcome, dt in steps:
        now += dt
        if outcome is None:
            b.handle_timer(now)
        else:
            b.record(outcome, now)
        assert 0 <= b.level <= b.max_level
        assert (b.phase is BackoffPhase.NORMAL) == (b.level == 0)
        assert (b.deadline is not None) == (b.phase is BackoffPhase.WAITING)
        assert b.rdy_budget(100) in ((0,) if b.phase is BackoffPhase.WAITING else (1, 100))


def test_reconnect_delay_doubles_with_cap_and_jitter() -> None:
    rng = random.Random(1)
    assert [reconnect_delay(k, 8.0, 60.0, 0.0, rng) for k in (1, 2, 3, 4)] == [8, 16, 32, 60]
    for k in range(1, 100):
        d = reconnect_delay(k, 1.0, 60.0, 0.3, rng)
        assert 0.7 * min(2.0 ** (k - 1), 60.0) <= d <= min(2.0 ** (k - 1), 60.0)


def test_even_shares_spreads_remainder_without_going_over() -> None:
    assert even_shares(10, [2500] * 3) == [4, 3, 3]
    assert even_shares(2, [2500] * 3) == [1, 1, 0]
    assert even_shares(0, [5, 5]) == [0, 0]
    assert even_shares(10, [1, 2500]) == [1, 9]
    assert even_shares(100, [10, 10]) == [10, 10]
    assert even_shares(5, []) == []


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 3000), max_size=20))
def test_even_shares_properties(budget: int, caps: list[int]) -> None:
    shares = even_shares(budget, caps)
    assert len(shares) == len(caps)
    assert sum(shares) <= budget
    assert all(0 <= s <= c for s, c in zip(shares, caps, strict=True))
    # Nothing is left unassigned while some connection could still take more.
    assert sum(shares) == min(budget, sum(caps))
    # Even: uncapped connections differ by at most one.
    free = [s for s, c in zip(shares, caps, strict=True) if s < c]
    if free:
        assert max(free) - min(free) <= 1


def test_refresh_rule_and_starvation() -> None:
    assert needs_refresh(0, 1)
    assert not needs_refresh(30, 100)
    assert needs_refresh(24, 100)
    assert not needs_refresh(25, 100)
    assert not needs_refresh(0, 0)
    assert is_starved(85, 100) and not is_starved(84, 100)
    assert not is_starved(0, 0) and is_starved(1, 1)

"""Backoff state machine, reconnect delays and the RDY arithmetic helpers."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.backoff import Backoff, BackoffPhase, Outcome, reconnect_delay
from nsq_sansio.consumer.rdy import even_shares, is_starved, needs_refresh

S, F, R, N = Outcome.SUCCESS, Outcome.FAILURE, Outcome.REPEATED_FAILURE, Outcome.NEUTRAL


def test_failure_opens_exponential_window_then_tests_with_one_message_more() -> None:
    b = Backoff(1.0, 120.0)
    assert b.rdy_budget(50) == 50
    assert b.record(F, now=10.0)
    assert b.phase is BackoffPhase.WAITING and b.level == 1
    assert b.deadline == 12.0 and b.window == 2.0  # 1 s * 2**1
    assert b.rdy_budget(50) == 0
    assert not b.handle_timer(11.9)
    assert b.handle_timer(12.0, held=3)  # three handlers still run: the test is a fourth
    assert b.phase is BackoffPhase.TESTING and b.window == 0.0
    assert b.rdy_budget(50) == 4 and b.allowance == 4
    assert b.rdy_budget(2) == 2
    assert b.rdy_budget(0) == 0


def test_failures_in_a_window_never_raise_the_level() -> None:
    b = Backoff(1.0, 120.0)
    b.record(F, 0.0)
    for outcome in (F, R, S, N) * 3:  # in flight when the window opened: failures dominate
        assert not b.record(outcome, 0.5)
    assert b.level == 1 and b.failures == 1 and b.windows == 1
    b.handle_timer(2.0)
    b.record(F, 2.0)
    assert b.level == 2 and b.deadline == 6.0 and b.failures == 2 and b.windows == 2


def test_successes_in_a_window_lower_the_level_once_they_outnumber_its_failures() -> None:
    b = Backoff(1.0, 120.0)
    b.record(F, 0.0)
    b.handle_timer(2.0)
    b.record(F, 2.0)  # level 2, a 4 s window
    assert not b.record(S, 2.1)  # one failure (the window's), one success: even
    assert b.record(S, 2.2)  # outnumbered: level 1, the window goes on
    assert b.level == 1 and b.phase is BackoffPhase.WAITING and b.deadline == 6.0
    assert not b.record(F, 2.3) and not b.record(S, 2.4)  # even again
    assert b.record(S, 2.5)
    assert b.phase is BackoffPhase.NORMAL and b.level == 0 and b.deadline is None
    assert b.windows == 2


def test_a_success_while_testing_lowers_the_level_and_lets_two_more_in() -> None:
    b = Backoff(1.0, 120.0)
    b.record(F, 0.0)
    b.handle_timer(2.0)
    b.record(F, 2.0)
    b.handle_timer(6.0)
    assert b.level == 2 and b.allowance == 1
    assert b.record(S, 6.0)  # no new window: the test goes on, with room for two more
    assert b.level == 1 and b.phase is BackoffPhase.TESTING and b.deadline is None
    assert b.allowance == 2 and b.windows == 2
    assert b.record(S, 6.5)
    assert b.phase is BackoffPhase.NORMAL and b.level == 0 and b.failures == 0
    assert b.rdy_budget(9) == 9
    assert not b.record(S, 9.0)


def test_a_repeated_failure_backs_off_without_raising_the_level() -> None:
    # A message that failed before fails again (a poison message on its way to
    # max_attempts): a window, but at the level the consumer is at (1 at least).
    b = Backoff(1.0, 120.0)
    assert b.record(R, 0.0)
    assert b.level == 1 and b.deadline == 2.0
    now = 2.0
    for _ in range(10):
        assert b.handle_timer(now)
        assert b.record(R, now)
        assert b.level == 1 and b.window == 2.0
        now += 2.0
    assert b.failures == 11 and b.windows == 11
    assert b.handle_timer(now)
    b.record(F, now)  # a first failure still raises it
    assert b.level == 2
    assert b.handle_timer(now + 4.0)
    b.record(R, now + 4.0)
    assert b.level == 2 and b.window == 4.0


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
        assert not b.record(R, 0.0)
        assert b.phase is BackoffPhase.NORMAL
        assert b.rdy_budget(7) == 7


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([S, F, R, N, None]), st.floats(0, 10), st.integers(0, 20)),
        max_size=60,
    )
)
def test_backoff_invariants(steps: list[tuple[Outcome | None, float, int]]) -> None:
    b = Backoff(0.5, 30.0)
    now = 0.0
    for outcome, dt, held in steps:
        now += dt
        level, windows = b.level, b.windows
        if outcome is None:
            b.handle_timer(now, held)
        else:
            b.record(outcome, now)
        assert 0 <= b.level <= b.max_level
        assert (b.phase is BackoffPhase.NORMAL) == (b.level == 0)
        assert (b.deadline is not None) == (b.phase is BackoffPhase.WAITING)
        if b.phase is BackoffPhase.WAITING:
            assert b.rdy_budget(100) == 0 and 0 < b.window <= 30.0
        elif b.phase is BackoffPhase.TESTING:
            assert 1 <= b.rdy_budget(100) <= 100
        else:
            assert b.rdy_budget(100) == 100 and b.failures == 0
        if outcome is R or outcome is N:  # never raise the level above 1
            assert b.level <= max(level, 1)
        if outcome is S:  # never raise it, never open a window
            assert b.level <= level and b.windows == windows
        assert b.windows >= windows


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

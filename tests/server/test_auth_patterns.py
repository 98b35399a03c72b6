"""The auth server's topic and channel patterns: searched as nsqd's RE2 does, never a hang.

nsqd matches grant patterns with Go's RE2 (linear time). The embedded broker uses RE2's own
binding when ``google-re2`` is installed; without it, Python's backtracking ``re`` only gets
patterns that cannot backtrack exponentially. Both engines are checked here (the RE2 one
skips when the package is absent).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from nsq_sansio.server import options
from nsq_sansio.server.options import Authorization, AuthState, grant_pattern


@pytest.fixture(params=["re2", "python re"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "re2":
        if options._re2 is None:
            pytest.skip("the google-re2 package is not installed")
    else:
        monkeypatch.setattr(options, "_re2", None)
    grant_pattern.cache_clear()
    yield request.param
    grant_pattern.cache_clear()


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        (".*", "anything", True),
        ("^events$", "events", True),
        ("^events$", "events2", False),
        ("events", "my_events_2", True),  # searched, as Go's MatchString
        ("^(orders|payments)$", "payments", True),
        ("^(orders|payments)$", "refunds", False),
        (r"^logs\..*$", "logs.web", True),
        ("^[a-z]+_[0-9]{2,4}$", "topic_123", True),
        ("^[a-z]+_[0-9]{2,4}$", "topic_12345", False),
    ],
)
def test_ordinary_patterns_match_as_nsqd_matches_them(
    engine: str, pattern: str, name: str, matches: bool
) -> None:
    search = grant_pattern(pattern)
    assert search is not None
    assert search(name) is matches


@pytest.mark.parametrize("pattern", ["^(a+)+$", "(a|aa)+$", "^(a*)*b", "^(.*a){12}$"])
def test_a_pattern_that_backtracks_without_end_never_holds_a_check(
    engine: str, pattern: str
) -> None:
    grant = Authorization(pattern, permissions=("publish",))
    started = time.perf_counter()
    assert not grant.allows("a" * 63 + "!", "")
    assert time.perf_counter() - started < 0.5
    if engine == "python re":
        assert grant_pattern(pattern) is None  # refused, not run


@pytest.mark.parametrize("pattern", ["(", "x" * 600, r"(a)\1", "(?=a)a", "(?<!x)a"])
def test_unusable_patterns_match_nothing(engine: str, pattern: str) -> None:
    """Invalid, too long, or not RE2 syntax (backreferences, lookarounds): never a match."""
    assert grant_pattern(pattern) is None
    state = AuthState(authorizations=(Authorization(pattern), Authorization("^ok$")))
    assert not state.allows("a", "")
    assert state.allows("ok", "")

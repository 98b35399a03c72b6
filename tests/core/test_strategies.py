"""The public Hypothesis strategies of ``nsq_sansio.testing.strategies`` draw without any
Hypothesis warning, also after their source file changed on disk (a long soak or nightly run
goes on while the checkout is edited)."""

from __future__ import annotations

import linecache
import warnings
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisDeprecationWarning

from nsq_sansio.testing import strategies


def _public_strategies() -> Iterator[tuple[str, st.SearchStrategy[object]]]:
    """Every name in ``__all__``, as a strategy (``fault_schedules`` over drawn clusters)."""
    for name in strategies.__all__:
        if name == "fault_schedules":
            yield name, strategies.cluster_specs().flatmap(strategies.fault_schedules)
        else:
            yield name, getattr(strategies, name)()


def _draw_all(examples: int) -> int:
    """Draw ``examples`` values from each public strategy, every warning an error."""
    drawn = 0
    for _name, strategy in _public_strategies():

        @settings(max_examples=examples, derandomize=True, database=None, deadline=None)
        @given(strategy)
        def draw(_value: object) -> None:
            nonlocal drawn
            drawn += 1

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            draw()
    return drawn


def test_every_public_strategy_draws_without_a_warning() -> None:
    assert _draw_all(20) >= 20 * len(strategies.__all__) // 2


def test_no_deprecation_warning_after_the_source_file_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hypothesis checks a ``@st.composite`` function's source, read from the file, when it is
    decorated: done on every draw, it warned on every example once the file no longer matched
    the running code (here: two lines added at the top, as an edit would)."""
    path = strategies.__file__
    lines = linecache.getlines(path)
    assert lines, "the strategies' source is readable"
    # mtime None: linecache serves these lines as they are (it never re-reads the file)
    monkeypatch.setitem(linecache.cache, path, (0, None, ["\n", "\n", *lines], path))
    try:
        _draw_all(10)
    except HypothesisDeprecationWarning as warning:  # pragma: no cover - the failure
        pytest.fail(f"drawing read the changed source: {warning}")

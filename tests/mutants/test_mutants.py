"""The mutation run as pytest tests, only when asked (it takes minutes):

    NSQ_MUTANTS=1 python -m pytest tests/mutants/test_mutants.py

One test per planted bug of ``planted.py``: it passes when the bug's tests catch it. In the
default suite this module is a single skipped test. ``tests/mutants/run.py`` does the same
with a table, by name or area, and in parallel.
"""

from __future__ import annotations

import os

import pytest

from mutants import run
from mutants.planted import MUTANTS, Mutant

ASKED = os.environ.get("NSQ_MUTANTS") == "1"

if ASKED:

    @pytest.fixture(scope="module")
    def files() -> list[str]:
        """The checkout's files, after the targeted tests passed on an unmodified copy."""
        listed = run.tracked_files(run.ROOT)
        ok, summary = run.baseline(MUTANTS, listed, 300.0)
        assert ok, summary
        return listed

    # one group: a parallel run runs the baseline once, on one worker (tests/mutants/run.py
    # --jobs N is the parallel mutation run)
    @pytest.mark.slow
    @pytest.mark.xdist_group("mutants")
    @pytest.mark.timeout(900)
    @pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
    def test_the_planted_bug_is_caught(mutant: Mutant, files: list[str]) -> None:
        outcome = run.run_mutant(mutant, files, timeout=600.0)
        assert outcome.verdict == run.KILLED, (
            f"{outcome.verdict}: {outcome.detail} ({mutant.decision})\n{outcome.output[-3000:]}"
        )

else:

    @pytest.mark.slow
    def test_the_planted_bugs_run_only_when_asked() -> None:
        pytest.skip("the mutation run is asked for with NSQ_MUTANTS=1 (see docs/testing.md)")

"""The mutation runner itself (cheap, in the default suite): the list is well formed, a
snippet that moved is STALE, and a mutant is only ever planted in a copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from mutants import run
from mutants.planted import MUTANTS, Mutant


def test_the_list_is_well_formed() -> None:
    names = [mutant.name for mutant in MUTANTS]
    assert len(names) == len(set(names)), "mutant names must be unique"
    for mutant in MUTANTS:
        assert mutant.tests, mutant.name
        assert mutant.decision and mutant.area, mutant.name
        for file, original, replacement in mutant.edits:
            assert original != replacement, mutant.name
            assert original.endswith("\n") and (not replacement or replacement.endswith("\n"))
            assert not Path(file).is_absolute(), mutant.name
        for test in mutant.tests:
            assert test.startswith("tests/") and ".py" in test, (mutant.name, test)


def _mutant(original: str, file: str = "pkg/mod.py") -> Mutant:
    return Mutant("m", "area", "a decision", file, original, "    return 2\n", ("tests/t.py",))


def test_a_snippet_that_moved_or_repeats_is_stale(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    assert run.staleness(_mutant("    return 1\n"), tmp_path) is None
    moved = run.staleness(_mutant("    return 0\n"), tmp_path)
    assert moved is not None and "no longer in pkg/mod.py" in moved
    (tmp_path / "pkg" / "mod.py").write_text("    return 1\n    return 1\n", encoding="utf-8")
    repeated = run.staleness(_mutant("    return 1\n"), tmp_path)
    assert repeated is not None and "occurs 2 times" in repeated
    gone = run.staleness(_mutant("    return 1\n", "pkg/other.py"), tmp_path)
    assert gone is not None and "does not exist" in gone


def test_a_mutant_is_planted_in_a_copy_never_in_the_checkout(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("def f():\n    return 1\n", encoding="utf-8")
    run.apply(_mutant("    return 1\n"), tmp_path)
    assert (tmp_path / "pkg" / "mod.py").read_text(encoding="utf-8") == "def f():\n    return 2\n"
    with pytest.raises(AssertionError, match="never in the working tree"):
        run.apply(MUTANTS[0], run.ROOT)

"""Run the planted bugs of ``planted.py`` and say which ones the tests miss.

    python tests/mutants/run.py                 # every mutant, one at a time
    python tests/mutants/run.py --jobs 2        # two at a time
    python tests/mutants/run.py backoff-window-uncapped drain-keeps-rdy   # some, by name
    python tests/mutants/run.py --area backoff  # one area
    python tests/mutants/run.py --check         # only check that every snippet still matches
    python tests/mutants/run.py --list          # the list, with the tests of each

Each mutant is applied to a temporary copy of the checkout (the working tree is never
touched), and its tests run there (``python -m pytest -x``, that copy first on ``PYTHONPATH``).
A mutant is KILLED when its tests fail, SURVIVED when they pass (a missing test: write it),
STALE when its snippet is no longer in the file exactly once (the code moved: update the entry
to today's code), and ERROR when its tests could not run (a test path that no longer exists, a
collection error). Before the mutants, their tests run once on the unmodified copy (the
baseline): a failure there would make every KILLED meaningless, so the run stops.
Exit status 0 only when every mutant selected was KILLED.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: make ``tests`` importable like pytest does
    sys.path.insert(0, str(ROOT / "tests"))

from mutants.planted import MUTANTS, Mutant  # noqa: E402

KILLED, SURVIVED, STALE, ERROR = "KILLED", "SURVIVED", "STALE", "ERROR"
_FAILED_LINE = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


@dataclass
class Outcome:
    """What running one mutant gave."""

    mutant: Mutant
    verdict: str
    seconds: float = 0.0
    detail: str = ""
    output: str = ""


def tracked_files(root: Path) -> list[str]:
    """The checkout's files (tracked, and new ones not ignored); every file without git."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
        return [
            str(path.relative_to(root))
            for path in root.rglob("*")
            if path.is_file() and not skip.intersection(path.relative_to(root).parts)
        ]
    return [name for name in listed.decode().split("\0") if name]


def copy_tree(root: Path, files: Iterable[str], target: Path) -> None:
    """Copy ``files`` (relative to ``root``) under ``target``."""
    for name in files:
        source = root / name
        if not source.is_file():  # deleted in the working tree, not yet in the index
            continue
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


def _stale_edit(root: Path, file: str, original: str) -> str | None:
    path = root / file
    if not path.is_file():
        return f"{file} does not exist any more"
    count = path.read_text(encoding="utf-8").count(original)
    if count == 1:
        return None
    if count == 0:
        first = original.strip().splitlines()[0].strip() if original.strip() else original
        return f"the snippet is no longer in {file} (it began {first!r})"
    return f"the snippet occurs {count} times in {file}: make it unique"


def staleness(mutant: Mutant, root: Path) -> str | None:
    """Why ``mutant`` cannot be applied to the tree at ``root`` (None: it can)."""
    for file, original, _ in mutant.edits:
        why = _stale_edit(root, file, original)
        if why is not None:
            return why
    return None


def apply(mutant: Mutant, tree: Path) -> None:
    """Plant ``mutant`` in the copy at ``tree`` (which must not be the checkout)."""
    assert tree.resolve() != ROOT, "mutants are planted in a copy, never in the working tree"
    for file, original, replacement in mutant.edits:
        path = tree / file
        text = path.read_text(encoding="utf-8")
        assert text.count(original) == 1, _stale_edit(tree, file, original)
        path.write_text(text.replace(original, replacement), encoding="utf-8")


def run_tests(tree: Path, tests: Sequence[str], timeout: float) -> tuple[int | None, str, float]:
    """``python -m pytest -x tests`` in ``tree``; (exit status or None on timeout, output,
    seconds)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rfE"]
    started = time.monotonic()
    try:
        done = subprocess.run(
            [*command, *tests],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout
        return None, output or "", time.monotonic() - started
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def run_mutant(mutant: Mutant, files: list[str], timeout: float) -> Outcome:
    """Plant ``mutant`` in a fresh copy, run its tests there, and say what happened."""
    why = staleness(mutant, ROOT)
    if why is not None:
        return Outcome(mutant, STALE, detail=why)
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as scratch:
        tree = Path(scratch)
        copy_tree(ROOT, files, tree)
        apply(mutant, tree)
        status, output, seconds = run_tests(tree, mutant.tests, timeout)
    if status is None:
        return Outcome(mutant, KILLED, seconds, f"its tests hung past {timeout:g}s", output)
    if status == 0:
        return Outcome(mutant, SURVIVED, seconds, "every test passed", output)
    if status == 1:
        failed = _FAILED_LINE.findall(output)
        return Outcome(mutant, KILLED, seconds, failed[0] if failed else "a test failed", output)
    return Outcome(mutant, ERROR, seconds, f"pytest exit status {status}", output)


def baseline(mutants: Sequence[Mutant], files: list[str], timeout: float) -> tuple[bool, str]:
    """Every test the mutants name, on the unmodified copy: they must pass."""
    tests = sorted({test for mutant in mutants for test in mutant.tests})
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as scratch:
        tree = Path(scratch)
        copy_tree(ROOT, files, tree)
        status, output, seconds = run_tests(tree, tests, timeout * 4)
    summary = f"baseline: {len(tests)} test paths, {seconds:.0f}s, pytest exit status {status}"
    return status == 0, summary + ("" if status == 0 else "\n" + output[-6000:])


def table(outcomes: Sequence[Outcome]) -> str:
    """The results, one line per mutant."""
    rows = [("mutant", "area", "result", "time", "caught by / why")]
    for o in outcomes:
        rows.append((o.mutant.name, o.mutant.area, o.verdict, f"{o.seconds:.0f}s", o.detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for index, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, row[4]]).rstrip())
        if index == 0:
            lines.append("  ".join("-" * width for width in [*widths, 15]))
    return "\n".join(lines)


def select(names: Sequence[str], area: str | None) -> list[Mutant]:
    by_name = {mutant.name: mutant for mutant in MUTANTS}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown mutant(s): {', '.join(unknown)} (see --list)")
    chosen = [by_name[name] for name in names] if names else list(MUTANTS)
    if area is not None:
        chosen = [mutant for mutant in chosen if mutant.area == area]
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--area", help="only the mutants of this area (e.g. backoff)")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    parser.add_argument("--no-baseline", action="store_true", help="skip the baseline run")
    parser.add_argument("--check", action="store_true", help="only check the snippets match")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests")
    parser.add_argument("-v", "--verbose", action="store_true", help="print each run's output")
    args = parser.parse_args(argv)
    chosen = select(args.names, args.area)

    if args.list:
        for mutant in chosen:
            files = ", ".join(sorted({file for file, _, _ in mutant.edits}))
            print(f"{mutant.name} [{mutant.area}] {files}: {mutant.decision}")
            for test in mutant.tests:
                print(f"    {test}")
        return 0

    stale = [(mutant, why) for mutant in chosen if (why := staleness(mutant, ROOT)) is not None]
    if args.check:
        for mutant, why in stale:
            print(f"STALE {mutant.name} ({mutant.decision}): {why}")
        print(f"{len(chosen) - len(stale)} of {len(chosen)} snippets match exactly once")
        return 1 if stale else 0

    files = tracked_files(ROOT)
    if not args.no_baseline:
        runnable = [mutant for mutant in chosen if all(m is not mutant for m, _ in stale)]
        ok, summary = baseline(runnable, files, args.timeout)
        print(summary, flush=True)
        if not ok:
            print("the targeted tests fail without any mutant: fix that first")
            return 2

    outcomes: list[Outcome] = []

    def one(mutant: Mutant) -> Outcome:
        outcome = run_mutant(mutant, files, args.timeout)
        print(f"{outcome.verdict:8} {mutant.name} ({outcome.seconds:.0f}s) {outcome.detail}")
        if args.verbose or outcome.verdict == ERROR:
            print(outcome.output[-4000:])
        sys.stdout.flush()
        return outcome

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(one, chosen))

    print()
    print(table(outcomes))
    counts = {verdict: 0 for verdict in (KILLED, SURVIVED, STALE, ERROR)}
    for outcome in outcomes:
        counts[outcome.verdict] += 1
    print()
    print(", ".join(f"{count} {verdict.lower()}" for verdict, count in counts.items()))
    for outcome in outcomes:
        if outcome.verdict == STALE:
            print(
                f"STALE {outcome.mutant.name}: {outcome.detail}. The decision it stands for: "
                f"{outcome.mutant.decision}. Find where the code makes it now and "
                "update the entry's original/replacement in tests/mutants/planted.py."
            )
        elif outcome.verdict == SURVIVED:
            print(
                f"SURVIVED {outcome.mutant.name}: no test among {', '.join(outcome.mutant.tests)} "
                f"notices that {outcome.mutant.decision!r} is broken: write that test."
            )
    return 0 if counts[KILLED] == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())

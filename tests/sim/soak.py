"""The simulator's long search, bounded in wall time: ``python -m tests.sim.soak --minutes N``.

Runs :func:`nsq_sansio.testing.soak.soak` (the properties of ``tests/sim`` over fresh generated
clusters and fault schedules, round after round) until the time is up, and prints what the
record of a run needs: schedules per property, the round seeds, the violations with their
replay lines, and the wall time. Run it niced, in the background, with its output in a file::

    nice -n 19 python -m tests.sim.soak --minutes 240 > soak.log 2>&1 &

Exits 1 if anything was violated. Without ``--seed`` the first round's seed is random (and
printed). ``tests/sim/test_soak.py`` is the same search as a ``slow`` test.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from nsq_sansio.testing.soak import PROPERTIES, SoakReport, soak


def timed_soak(
    minutes: float,
    *,
    seed: int | None = None,
    batch: int = 20,
    schedules: int | None = None,
    properties: tuple[str, ...] = PROPERTIES,
) -> tuple[SoakReport, float]:
    """:func:`soak` for ``minutes`` (or ``schedules``); returns the report and the wall time."""
    first = random.SystemRandom().randrange(2**31) if seed is None else seed
    start = time.monotonic()
    deadline = start + minutes * 60

    def out(line: str) -> None:
        print(f"[{(time.monotonic() - start) / 60:7.1f} min] {line}", flush=True)

    report = soak(
        seed=first,
        schedules=schedules,
        batch=batch,
        properties=properties,
        stop=lambda: time.monotonic() >= deadline,
        out=out,
    )
    wall = time.monotonic() - start
    out(f"wall time {wall / 60:.1f} min ({report.total / max(wall, 1e-9):.2f} schedules/s)")
    return report, wall


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim.soak")
    parser.add_argument("--minutes", type=float, required=True, help="wall time to search")
    parser.add_argument("--seed", type=int, default=None, help="first round's seed")
    parser.add_argument("--batch", type=int, default=20, help="scenarios per property per round")
    parser.add_argument("--schedules", type=int, default=None, help="stop after this many")
    parser.add_argument(
        "--property", action="append", choices=PROPERTIES, help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    report, _ = timed_soak(
        args.minutes,
        seed=args.seed,
        batch=args.batch,
        schedules=args.schedules,
        properties=tuple(args.property) if args.property else PROPERTIES,
    )
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

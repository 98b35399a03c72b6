"""The simulator's command line.

* ``python -m nsq_sansio.testing replay <blob> [--rdy-per-step]``: run a printed scenario
  again, exactly (``--rdy-per-step`` checks the RDY sum after each consumer step only, not
  after every RDY written). ``--help`` prints the usage; a line that is not a blob exits 2.
* ``python -m nsq_sansio.testing soak --schedules N [--seed S] [--batch B]
  [--property NAME ...]``: the long search (:mod:`nsq_sansio.testing.soak`); exits 1 on any
  violation, each printed with its replay line. (``tests/sim/soak.py`` bounds it in minutes.)
"""

from __future__ import annotations

import argparse
import sys

from .invariants import InvariantViolation
from .simulator import run_scenario, scenario_from_blob

USAGE = (
    "usage: python -m nsq_sansio.testing replay <blob> [--rdy-per-step]\n"
    "       python -m nsq_sansio.testing soak --schedules N [--seed S] [--batch B] "
    "[--property NAME ...]"
)


def main(argv: list[str]) -> int:
    if argv[:1] == ["soak"]:
        return _soak(argv[1:])
    if "-h" in argv or "--help" in argv:
        print(USAGE)
        return 0
    per_write = "--rdy-per-step" not in argv
    args = [a for a in argv if a not in ("--rdy-per-step", "--rdy-per-write")]
    if len(args) != 2 or args[0] != "replay":
        print(USAGE, file=sys.stderr)
        return 2
    try:
        scenario = scenario_from_blob(args[1])
    except Exception as exc:  # bad base64, zlib, JSON or fields: all mean "not a blob"
        print(f"not a replay blob ({type(exc).__name__}: {exc})\n{USAGE}", file=sys.stderr)
        return 2
    print(scenario)
    try:
        result = run_scenario(scenario, rdy_per_write=per_write)
    except InvariantViolation as exc:
        print(exc)
        return 1
    print(
        f"ok: {result.messages_finished}/{result.messages_expected} messages finished, "
        f"{result.deliveries} deliveries, {result.events} events, t={result.end_time:.1f}s"
    )
    return 0


def _soak(argv: list[str]) -> int:
    from .soak import PROPERTIES, soak

    parser = argparse.ArgumentParser(prog="python -m nsq_sansio.testing soak")
    parser.add_argument("--schedules", type=int, required=True, help="how many to run")
    parser.add_argument("--seed", type=int, default=1, help="first round's seed (default 1)")
    parser.add_argument("--batch", type=int, default=20, help="scenarios per property per round")
    parser.add_argument(
        "--property", action="append", choices=PROPERTIES, help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    report = soak(
        seed=args.seed,
        schedules=args.schedules,
        batch=args.batch,
        properties=tuple(args.property) if args.property else PROPERTIES,
    )
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``python -m nsq_sansio.testing replay <blob> [--rdy-per-step]``: run a printed scenario
again, exactly (``--rdy-per-step`` checks the RDY sum after each consumer step only, not after
every RDY written)."""

from __future__ import annotations

import sys

from .invariants import InvariantViolation
from .simulator import run_scenario, scenario_from_blob


def main(argv: list[str]) -> int:
    per_write = "--rdy-per-step" not in argv
    args = [a for a in argv if a not in ("--rdy-per-step", "--rdy-per-write")]
    if len(args) != 2 or args[0] != "replay":
        print("usage: python -m nsq_sansio.testing replay <blob> [--rdy-per-step]", file=sys.stderr)
        return 2
    scenario = scenario_from_blob(args[1])
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

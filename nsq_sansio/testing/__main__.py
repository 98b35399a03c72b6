"""``python -m nsq_sansio.testing replay <blob>``: run a printed scenario again, exactly."""

from __future__ import annotations

import sys

from .invariants import InvariantViolation
from .simulator import run_scenario, scenario_from_blob


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "replay":
        print("usage: python -m nsq_sansio.testing replay <blob>", file=sys.stderr)
        return 2
    scenario = scenario_from_blob(argv[1])
    print(scenario)
    try:
        result = run_scenario(scenario)
    except InvariantViolation as exc:
        print(exc)
        return 1
    print(f"ok: {result.messages_finished}/{result.messages_expected} messages finished, "
          f"{result.deliveries} deliveries, {result.events} events, t={result.end_time:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A/B of two source trees on a CPU benchmark: the same script, versions alternating.

The figure a change is judged by on a shared machine: each round runs every version once, in
an order reversed every other round, and the median of each row is reported with its ratio to
the first version. A row is any output line ending in ``<number> msgs/s`` (bench_core.py,
bench_coordinator.py, bench_core_publish.py print those)::

    git worktree add /tmp/before main
    python bench/bench_ab.py --version before=/tmp/before --version after=. \\
        --rounds 5 bench_coordinator.py -- --messages 300000

The script runs from each version's own ``bench/`` folder, so it measures that tree's code
(the scripts put their tree first on ``sys.path``). For the consume rows against a real nsqd
use bench_consume_ab.py.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\s*(?P<name>.*?)\s+(?P<rate>[\d,]+(?:\.\d+)?)\s+msgs/s\s*$")


def run_once(tree: str, script: str, args: list[str]) -> dict[str, float]:
    """One run of ``tree/bench/script``: its rows, by name."""
    path = os.path.join(tree, "bench", script)
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run(
        [sys.executable, path, *args], env=env, capture_output=True, text=True, check=True
    ).stdout
    rows: dict[str, float] = {}
    for line in out.splitlines():
        match = ROW.match(line)
        if match:
            rows[match["name"]] = float(match["rate"].replace(",", ""))
    if not rows:
        raise SystemExit(f"{path} printed no '... msgs/s' rows:\n{out}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="append", required=True, metavar="NAME=TREE")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("script", help="a script in bench/, e.g. bench_core.py")
    parser.add_argument("args", nargs="*", help="the script's own arguments (after --)")
    ns = parser.parse_args()
    versions = [tuple(v.split("=", 1)) for v in ns.version]
    if any(len(v) != 2 for v in versions) or len(versions) < 2:
        parser.error("give at least two --version NAME=TREE")
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in versions}
    for round_no in range(ns.rounds):
        order = versions if round_no % 2 == 0 else versions[::-1]
        for name, tree in order:
            for row, rate in run_once(tree, ns.script, ns.args).items():
                results[name].setdefault(row, []).append(rate)
        print(f"round {round_no + 1}/{ns.rounds} done", file=sys.stderr, flush=True)
    base_name = versions[0][0]
    base = results[base_name]
    width = max(len(row) for row in base)
    print(f"{ns.script} {' '.join(ns.args)}: median of {ns.rounds} rounds, msgs/s")
    for row in base:
        cells = []
        for name, _ in versions:
            rate = statistics.median(results[name].get(row, [0.0]))
            ratio = rate / statistics.median(base[row])
            shown = "" if name == base_name else f" ({ratio:.3f})"
            cells.append(f"{name} {rate:>12,.0f}{shown}")
        print(f"  {row:<{width}}  " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

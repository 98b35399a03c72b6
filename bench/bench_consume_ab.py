"""A/B of consumer code versions against the real nsqd: rate, ratio to Go, CPU per message.

``bench_real.py`` compares clients; this compares versions of nsq-sansio's own consumers, the
way a change is judged on a shared machine: versions alternate within each round (their order
reversed every other round), Go's ``bench_reader`` runs in the same round, and each version's
CPU time per message (``time.process_time()`` of the client process, every thread, over the
same middle 80% as its rate) is reported beside its rate, since it moves far less with load::

    git worktree add /tmp/before main        # or: git archive main | tar -x -C /tmp/before
    python bench/bench_consume_ab.py --version before=/tmp/before --version after=. \\
        --mode blocking-iter --rounds 6 --go

A version is a source tree (put first on the child's ``PYTHONPATH``); ``NAME=PATH+nogc`` runs
the same tree with the child's garbage collector off (what GC costs). Modes:
``blocking-iter`` (``for msg in c``), ``blocking-run`` (``run(handler, concurrency=8)``),
``anyio-iter`` / ``anyio-run`` (asyncio; ``anyio-iter:trio`` for trio). Same nsqd setup,
prefill and "every message FIN'd" check as ``bench_real.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

import bench_real  # noqa: E402

MODES = ("blocking-iter", "blocking-run", "anyio-iter", "anyio-run")

#: What the child runs (with the version's tree first on its path); prints one JSON line.
CHILD = r"""
import json, os, sys, time
mode, address, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.environ.get("BENCH_AB_NOGC"):
    import gc
    gc.disable()
edge = count // 10
state = {"left": count, "t0": 0.0, "t1": 0.0, "c0": 0.0, "c1": 0.0}

def hit():
    left = state["left"] = state["left"] - 1
    if left == count - edge:
        state["t0"], state["c0"] = time.perf_counter(), time.process_time()
    if left == edge:
        state["t1"], state["c1"] = time.perf_counter(), time.process_time()
    return left == 0

kind, _, backend = mode.partition(":")
if kind == "blocking-iter":
    from transports.sync import Consumer
    with Consumer("bench", "bench", nsqd=[address], max_in_flight=2500) as c:
        for msg in c:
            msg.finish()
            if hit():
                break
elif kind == "blocking-run":
    import threading
    from transports.sync import Consumer
    lock = threading.Lock()
    with Consumer("bench", "bench", nsqd=[address], max_in_flight=2500) as c:
        def handler(msg):
            with lock:
                if hit():
                    c.start_drain(10.0)
        try:
            c.run(handler, concurrency=8)
        except TypeError:  # a version from before run()'s argument was named concurrency
            c.run(handler, threads=8)
else:
    import anyio
    from transports.anyio import Consumer

    async def main():
        async with Consumer("bench", "bench", nsqd=[address], max_in_flight=2500) as c:
            if kind == "anyio-iter":
                async for msg in c:
                    msg.finish_nowait()
                    if hit():
                        break
            else:
                async with anyio.create_task_group() as tg:
                    async def handler(msg):
                        if hit():
                            tg.start_soon(c.drain, 10.0)
                    await c.run(handler)

    anyio.run(main, backend=backend or "asyncio")
measured = count - 2 * edge
print(json.dumps({"rate": measured / (state["t1"] - state["t0"]),
                  "cpu_us": (state["c1"] - state["c0"]) / measured * 1e6}))
"""


def run_version(path: str, mode: str, address: str, count: int) -> dict[str, float] | str:
    env = dict(os.environ)
    if path.endswith("+nogc"):
        path = path[: -len("+nogc")]
        env["BENCH_AB_NOGC"] = "1"
    path = os.path.abspath(path)
    env["PYTHONPATH"] = path
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, address, str(count)],
        capture_output=True,
        text=True,
        env=env,
        cwd=path,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    result: dict[str, float] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--mode", default="blocking-iter")
    parser.add_argument("-n", "--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--go", action="store_true", help="Go's bench_reader in every round")
    parser.add_argument("--nsqd-bin", help="folder with nsqd and bench_reader")
    args = parser.parse_args()
    if args.mode.partition(":")[0] not in MODES:
        parser.error(f"--mode must be one of {', '.join(MODES)} (anyio modes may end :trio)")
    from transports.testing.real_nsq import RealNSQD, find_binaries, tool

    folder = find_binaries(args.nsqd_bin)
    if folder is None:
        print("no nsqd binary found (--nsqd-bin DIR or $NSQ_BIN_DIR): nothing to measure")
        return
    bin_dir = str(folder)
    versions = [tuple(v.split("=", 1)) for v in args.version]
    if any(len(v) != 2 for v in versions):
        parser.error("--version takes NAME=PATH")
    rates: dict[str, list[float]] = {name: [] for name, _ in versions}
    cpus: dict[str, list[float]] = {name: [] for name, _ in versions}
    go: list[float] = []
    for round_no in range(args.rounds):
        order = versions if round_no % 2 == 0 else versions[::-1]
        for name, path in [*order, *([("go", "")] if args.go else [])]:
            with RealNSQD(bench_real._nsqd_args(args.count, []), bin_dir=bin_dir) as nsqd:
                bench_real._prefill(nsqd, args.count, b"x" * 100)
                if name == "go":
                    exe = tool("bench_reader", bin_dir)
                    options = argparse.Namespace(body_size=100, timeout=120.0)
                    row = bench_real.Row("consume", "go", "go", None)
                    res = bench_real._run_bench_reader(row, str(exe), nsqd, args.count, options)
                    go.append(res.rate)
                    print(f"  [{round_no + 1}] go {res.rate:,.0f} msgs/s", flush=True)
                    continue
                got = run_version(path, args.mode, nsqd.tcp_address, args.count)
                poller = bench_real.StatsPoller(nsqd.http_port)
                try:
                    problem = bench_real._check_consumed(poller, args.count)
                finally:
                    poller.close()
                if isinstance(got, str) or problem:
                    print(f"  [{round_no + 1}] {name} FAILED: {problem or got}", flush=True)
                    continue
                rates[name].append(got["rate"])
                cpus[name].append(got["cpu_us"])
                print(
                    f"  [{round_no + 1}] {name} {got['rate']:,.0f} msgs/s, "
                    f"{got['cpu_us']:.2f} us CPU/msg",
                    flush=True,
                )
    width = max(len(name) for name, _ in versions)
    print(f"\n{args.mode}, {args.count} messages, {args.rounds} rounds (medians):")
    for name, _ in versions:
        if not rates[name]:
            continue
        line = (
            f"  {name:<{width}}  {statistics.median(rates[name]):>10,.0f} msgs/s  "
            f"{statistics.median(cpus[name]):.2f} us CPU/msg"
        )
        if go and len(go) == len(rates[name]):
            ratios = [r / g for r, g in zip(rates[name], go, strict=True)]
            line += f"  {statistics.median(ratios):.2f}x Go (rounds: "
            line += " ".join(f"{x:.2f}" for x in ratios) + ")"
        print(line)
    if go:
        print(f"  {'go':<{width}}  {statistics.median(go):>10,.0f} msgs/s")


if __name__ == "__main__":
    main()

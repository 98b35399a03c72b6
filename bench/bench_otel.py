"""What OpenTelemetry costs a client: consume and publish with and without it, in the same run.

    python bench/bench_otel.py                      # asyncio, trio and blocking, every mode
    python bench/bench_otel.py -n 20000 --rounds 5 --only asyncio blocking
    python bench/bench_otel.py --output table.md    # also write the table (markdown)
    git archive COMMIT | tar -x -C /tmp/before && python bench/bench_otel.py --baseline /tmp/before

Against the embedded nsqd in a process of its own (``python -m transports.cli nsqd``, one for
the whole run, a fresh topic per measurement), each measurement in a fresh child process, in
one of four modes:

* ``not installed``: ``import opentelemetry`` fails in the child (a sitecustomize blocks it),
  as without the ``otel`` extra;
* ``not instrumented``: the SDK is installed and set as the global tracer and meter
  providers, the client is not instrumented;
* ``instrumented``: ``otel.instrument(client)``, spans to the SDK (a simple span processor
  whose exporter drops them: what the library costs, not an exporter), metrics to a reader;
* ``propagate``: the same with ``propagate=True`` (the producer puts the trace context in
  front of each body; the consumer's messages carry one, which it takes off).

With ``--baseline DIR`` (a checkout of the library from before it had the telemetry hooks),
a fifth mode, ``before``, runs that library the same way as ``not installed``: the hooks'
own cost (one ``is None`` test per message and per answer) is the difference between the two.

Rows: ``consume`` (iteration, every message FIN'd; the topic is filled by MPUB before the
consumer starts) and ``publish`` (PUB one at a time, each answer waited for). The figure is the
CPU time of the child process per message (every thread; over the middle 80% of the messages),
the median of ``--rounds`` rounds, with the rate beside it; the modes alternate within a round,
their order reversed every other round, so background load falls on all of them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODES = ("not installed", "not instrumented", "instrumented", "propagate")
RUNTIMES = ("asyncio", "trio", "blocking")
ROWS = ("consume", "publish")
BODY = b"x" * 100
#: The trace context the prefilled messages of ``propagate`` carry.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

BLOCKER = """
import importlib.abc
import sys


class _NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoOpenTelemetry())
"""

CHILD = r"""
import json, sys, time

runtime, row, mode, address, topic, count = sys.argv[1:7]
count = int(count)
edge = count // 10
state = {"left": count, "t0": 0.0, "t1": 0.0, "c0": 0.0, "c1": 0.0}


def hit():
    left = state["left"] = state["left"] - 1
    if left == count - edge:
        state["t0"], state["c0"] = time.perf_counter(), time.process_time()
    if left == edge:
        state["t1"], state["c1"] = time.perf_counter(), time.process_time()
    return left == 0


if mode in ("not installed", "before"):
    try:
        import opentelemetry  # noqa: F401
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("opentelemetry was not blocked")
else:
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

if mode in ("instrumented", "propagate"):
    from transports import otel

    def instrument(client):
        otel.instrument(client, propagate=mode == "propagate")
else:

    def instrument(client):
        pass


body = b"x" * 100
if runtime == "blocking":
    from transports.sync import Consumer, Producer

    if row == "consume":
        with Consumer(topic, "bench", nsqd=[address], max_in_flight=2500) as c:
            instrument(c)
            for msg in c:
                msg.finish()
                if hit():
                    break
    else:
        with Producer(address) as p:
            instrument(p)
            for _ in range(count):
                p.publish(topic, body)
                hit()
else:
    import anyio
    from transports.anyio import Consumer, Producer

    async def main():
        if row == "consume":
            async with Consumer(topic, "bench", nsqd=[address], max_in_flight=2500) as c:
                instrument(c)
                async for msg in c:
                    await msg.finish()
                    if hit():
                        break
        else:
            async with Producer(address) as p:
                instrument(p)
                for _ in range(count):
                    await p.publish(topic, body)
                    hit()

    anyio.run(main, backend=runtime)

if mode in ("instrumented", "propagate"):
    assert reader.get_metrics_data() is not None  # a collection works (not timed)
measured = count - 2 * edge
print(json.dumps({
    "rate": measured / (state["t1"] - state["t0"]),
    "cpu_us": (state["c1"] - state["c0"]) / measured * 1e6,
}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def embedded_nsqd() -> Iterator[str]:
    """The embedded nsqd in its own process; its TCP address."""
    tcp, http = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "transports.cli", "nsqd", f"--tcp-address={tcp}"]
    command.append(f"--http-address={http}")
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
    )
    try:
        assert process.stderr is not None
        process.stderr.readline()  # "nsqd: TCP ... HTTP ..." once it listens
        yield tcp
    finally:
        process.terminate()
        process.wait(30)


def prefill(address: str, topic: str, count: int, enveloped: bool) -> None:
    """``count`` messages in ``topic`` (MPUB of 500), with a trace context envelope if asked."""
    from transports.otel.envelope import wrap
    from transports.sync import Producer

    body = wrap(BODY, {"traceparent": TRACEPARENT}) if enveloped else BODY
    with Producer(address) as producer:
        for start in range(0, count, 500):
            producer.multi_publish(topic, [body] * min(500, count - start))


def measure(
    blocker: Path,
    baseline: Path | None,
    address: str,
    runtime: str,
    row: str,
    mode: str,
    count: int,
    serial: int,
) -> dict[str, float] | str:
    topic = f"otel_{row}_{serial}"
    if row == "consume":
        prefill(address, topic, count, enveloped=mode == "propagate")
    env = dict(os.environ)
    if mode == "before":
        assert baseline is not None
        paths = [str(blocker), str(baseline)]
    elif mode == "not installed":
        paths = [str(blocker), str(ROOT)]
    else:
        paths = [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, runtime, row, mode, address, topic, str(count)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(baseline if mode == "before" else ROOT),
        timeout=600,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    result: dict[str, float] = json.loads(lines[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=20_000, help="messages per row")
    parser.add_argument(
        "--publish-count", type=int, default=5_000, help="PUBs per publish row (one at a time)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=[*RUNTIMES, *ROWS], default=[])
    parser.add_argument("--output", help="also write the table (markdown) to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of the library without the telemetry hooks: adds the 'before' mode",
    )
    args = parser.parse_args()
    modes = (("before",) if args.baseline else ()) + MODES
    runtimes = [r for r in RUNTIMES if r in args.only] or list(RUNTIMES)
    rows = [r for r in ROWS if r in args.only] or list(ROWS)
    cpu: dict[tuple[str, str, str], list[float]] = {}
    rate: dict[tuple[str, str, str], list[float]] = {}
    serial = 0
    with tempfile.TemporaryDirectory() as scratch, embedded_nsqd() as address:
        blocker = Path(scratch)
        (blocker / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
        for round_no in range(args.rounds):
            for runtime in runtimes:
                for row in rows:
                    count = args.count if row == "consume" else args.publish_count
                    order = modes if round_no % 2 == 0 else modes[::-1]
                    for mode in order:
                        serial += 1
                        got = measure(
                            blocker, args.baseline, address, runtime, row, mode, count, serial
                        )
                        key = (runtime, row, mode)
                        if isinstance(got, str):
                            print(f"  [{round_no + 1}] {runtime} {row} {mode}: FAILED {got}")
                            continue
                        cpu.setdefault(key, []).append(got["cpu_us"])
                        rate.setdefault(key, []).append(got["rate"])
                        print(
                            f"  [{round_no + 1}] {runtime:<8} {row:<7} {mode:<16} "
                            f"{got['cpu_us']:6.2f} us CPU/msg  {got['rate']:>9,.0f} msgs/s",
                            flush=True,
                        )
    table = _table(modes, runtimes, rows, cpu, rate, args)
    print()
    print(table)
    if args.output:
        Path(args.output).write_text(table + "\n", encoding="utf-8")


def _table(
    modes: tuple[str, ...],
    runtimes: list[str],
    rows: list[str],
    cpu: dict[tuple[str, str, str], list[float]],
    rate: dict[tuple[str, str, str], list[float]],
    args: argparse.Namespace,
) -> str:
    lines = [
        f"CPU per message (median of {args.rounds} rounds; consume {args.count:,} messages, "
        f"publish {args.publish_count:,} PUBs one at a time), and the ratio to 'not installed'; "
        f"Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}",
        "",
        "| runtime | row | " + " | ".join(modes) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in modes) + " |",
    ]
    for runtime in runtimes:
        for row in rows:
            base = cpu.get((runtime, row, "not installed"))
            cells = []
            for mode in modes:
                found = cpu.get((runtime, row, mode))
                if not found:
                    cells.append("failed")
                    continue
                value = statistics.median(found)
                speed = statistics.median(rate[(runtime, row, mode)])
                ratio = f" ({value / statistics.median(base):.2f}x)" if base else ""
                cells.append(f"{value:.1f} µs{ratio}, {speed:,.0f}/s")
            lines.append(f"| {runtime} | {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

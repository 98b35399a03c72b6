"""Poison messages against a real nsqd: how long each client takes to drain a channel where a
few messages always fail, with its backoff at its default settings.

The scenario: 100 messages, 5 of which always fail (every 20th); every other one succeeds at
once. Each client runs with its default settings: ``max_in_flight`` 1, ``max_attempts`` 5
(pynsq's ``max_tries`` 5: the same), backoff as shipped (nsq-sansio: 1 s x 2^level windows up
to 120 s; pynsq: 3.6 s more per failure up to 128 s), and a handler written the default way:
nsq-sansio's ``run()`` with a handler that returns False for a poison message (REQ with
backoff) and None otherwise; pynsq's ``Reader`` with a handler that returns False / True. A
failed message is requeued with the client's automatic delay (90 s x attempts for both);
nsqd runs with ``--max-req-timeout=1s``, so it clamps every REQ to 1 s and the run measures
the clients' backoff, not 22 minutes of nsqd's clock. Each client gets a fresh nsqd, in its
own process, all in the same run::

    python bench/bench_backoff.py                    # pynsq, asyncio, trio, blocking
    python bench/bench_backoff.py --only asyncio trio
    python bench/bench_backoff.py --max-in-flight 4  # another setting, the same for all

It prints, per client, the time from start to the moment every message was finished or
given up, the ratio to pynsq, and the result counts: 95 finished, 5 given up, none lost (read
from the client, and checked against nsqd's ``/stats``: the channel holds nothing, in flight,
deferred or queued). Target: no runtime slower than 1.5x pynsq. pynsq installs with
``pip install -e '.[bench]'`` (pynsq, tornado); without the nsqd binaries (``--nsqd-bin``,
``$NSQ_BIN_DIR`` or ``../shared/reference/nsq-1.3.0``) the script says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TOPIC = "poison"
CHANNEL = "bench"
CLIENTS = ("pynsq", "asyncio", "trio", "blocking")


@dataclass
class Outcome:
    """What one client did: seconds to drain, and its own counts."""

    client: str
    seconds: float | None = None
    finished: int = 0
    given_up: int = 0
    windows: int | None = None
    error: str | None = None
    lost: int | None = None  # what nsqd still holds for the channel afterwards


def bodies(count: int, poison: int) -> list[bytes]:
    """``count`` bodies, ``poison`` of them (evenly spread, the first included) poison."""
    step = max(count // max(poison, 1), 1)
    return [
        (b"poison-%d" if i % step == 0 and i // step < poison else b"ok-%d") % i
        for i in range(count)
    ]


def is_poison(body: bytes) -> bool:
    return body.startswith(b"poison")


# --- the clients, each in its own process ------------------------------------------------------


def run_pynsq(address: str, total: int, max_in_flight: int) -> dict[str, Any]:
    import logging

    import nsq
    import tornado.ioloop

    logging.getLogger("nsq").setLevel(logging.ERROR)
    loop = tornado.ioloop.IOLoop.current()
    counts = {"finished": 0, "given_up": 0}
    done: dict[str, float] = {}
    t0 = time.monotonic()

    def check() -> None:
        if counts["finished"] + counts["given_up"] == total and "t" not in done:
            done["t"] = time.monotonic() - t0
            loop.call_later(0.3, loop.stop)  # this answer's FIN is written first

    def handler(message: Any) -> bool:
        if is_poison(message.body):
            return False
        counts["finished"] += 1
        check()
        return True

    class Reader(nsq.Reader):  # type: ignore[misc]
        def giving_up(self, message: Any) -> None:
            counts["given_up"] += 1
            check()

    reader = Reader(
        topic=TOPIC,
        channel=CHANNEL,
        nsqd_tcp_addresses=[address],
        message_handler=handler,
        max_in_flight=max_in_flight,
    )
    loop.start()
    reader.close()
    return {"seconds": done.get("t"), **counts, "windows": None}


def run_anyio(address: str, total: int, max_in_flight: int, backend: str) -> dict[str, Any]:
    import anyio

    from nsq_sansio.consumer import GiveUp
    from transports.anyio import Consumer

    result: dict[str, Any] = {}

    async def main() -> None:
        counts = {"finished": 0, "given_up": 0}
        t0 = time.monotonic()
        consumer: Consumer | None = None

        def check() -> None:
            if counts["finished"] + counts["given_up"] == total and "seconds" not in result:
                result["seconds"] = time.monotonic() - t0
                assert consumer is not None
                consumer.start_drain()

        def on_event(event: object) -> None:
            if isinstance(event, GiveUp):
                counts["given_up"] += 1
                check()

        async def handler(msg: Any) -> bool | None:
            if is_poison(msg.body):
                return False
            counts["finished"] += 1
            check()
            return None

        async with Consumer(
            TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight, on_event=on_event
        ) as c:
            consumer = c
            await c.run(handler)
            stats = c.stats()
        result.update(
            finished=stats.finished,
            given_up=stats.given_up,
            windows=getattr(stats, "backoff_windows", None),
        )

    anyio.run(main, backend=backend)
    return result


def run_blocking(address: str, total: int, max_in_flight: int) -> dict[str, Any]:
    import threading

    from nsq_sansio.consumer import GiveUp
    from transports.sync import Consumer

    result: dict[str, Any] = {}
    lock = threading.Lock()
    counts = {"finished": 0, "given_up": 0}
    holder: list[Consumer] = []
    t0 = time.monotonic()

    def check() -> None:
        if counts["finished"] + counts["given_up"] == total and "seconds" not in result:
            result["seconds"] = time.monotonic() - t0
            holder[0].start_drain()

    def on_event(event: object) -> None:
        if isinstance(event, GiveUp):
            with lock:
                counts["given_up"] += 1
                check()

    def handler(msg: Any) -> bool | None:
        if is_poison(msg.body):
            return False
        with lock:
            counts["finished"] += 1
            check()
        return None

    with Consumer(
        TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight, on_event=on_event
    ) as c:
        holder.append(c)
        c.run(handler)
        stats = c.stats()
    result.update(
        finished=stats.finished,
        given_up=stats.given_up,
        windows=getattr(stats, "backoff_windows", None),
    )
    return result


def child(client: str, address: str, total: int, max_in_flight: int) -> None:
    if client == "pynsq":
        result = run_pynsq(address, total, max_in_flight)
    elif client == "blocking":
        result = run_blocking(address, total, max_in_flight)
    else:
        result = run_anyio(address, total, max_in_flight, client)
    print(json.dumps(result), flush=True)


# --- the parent: a fresh nsqd per client --------------------------------------------------------


def _publish(nsqd: Any, messages: list[bytes]) -> None:
    nsqd.post(f"/topic/create?topic={TOPIC}")
    nsqd.post(f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
    # one MPUB of newline-separated bodies (none holds a newline), in this order
    request = urllib.request.Request(
        f"{nsqd.http_url}/mpub?topic={TOPIC}", data=b"\n".join(messages), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def _left_in_channel(nsqd: Any) -> int:
    """Messages nsqd still has for the channel: queued, in flight or deferred."""
    chan = nsqd.channel_stats(TOPIC, CHANNEL) or {}
    return int(
        chan.get("depth", 0) + chan.get("in_flight_count", 0) + chan.get("deferred_count", 0)
    )


def measure(client: str, args: argparse.Namespace, bin_dir: str | None) -> Outcome:
    from transports.testing.real_nsq import RealNSQD

    messages = bodies(args.messages, args.poison)
    with RealNSQD([f"--max-req-timeout={args.max_req_timeout}"], bin_dir=bin_dir) as nsqd:
        _publish(nsqd, messages)
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--child",
            client,
            nsqd.tcp_address,
            "--messages",
            str(args.messages),
            "--max-in-flight",
            str(args.max_in_flight),
        ]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout, env=env
            )
        except subprocess.TimeoutExpired:
            return Outcome(client, error=f"not drained within {args.timeout:.0f} s")
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode or not lines:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return Outcome(client, error=f"exit {proc.returncode}: {' | '.join(tail)}")
        data = json.loads(lines[-1])
        deadline = time.monotonic() + 5  # the last FIN may still be on its way
        while (left := _left_in_channel(nsqd)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return Outcome(
            client,
            seconds=data.get("seconds"),
            finished=data.get("finished", 0),
            given_up=data.get("given_up", 0),
            windows=data.get("windows"),
            lost=left,
        )


def _label(client: str) -> str:
    if client == "pynsq":
        try:
            from importlib.metadata import version

            return f"pynsq {version('pynsq')} `Reader`"
        except Exception:
            return "pynsq `Reader`"
    return {
        "asyncio": "`transports.anyio` on asyncio, `run()`",
        "trio": "`transports.trio`, `run()`",
        "blocking": "`transports.sync`, `run()`",
    }[client]


def report(outcomes: list[Outcome], args: argparse.Namespace) -> str:
    base = next((o.seconds for o in outcomes if o.client == "pynsq" and o.seconds), None)
    good = args.messages - args.poison
    lines = [
        f"{args.messages} messages, {args.poison} always failing; max_in_flight "
        f"{args.max_in_flight}, max_attempts 5; nsqd --max-req-timeout={args.max_req_timeout}",
        "",
        "| client | time to drain | vs pynsq | finished | given up | lost | backoff windows |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for o in outcomes:
        if o.error is not None:
            lines.append(f"| {_label(o.client)} | {o.error} | | | | | |")
            continue
        seconds = f"{o.seconds:.1f} s" if o.seconds is not None else "?"
        ratio = f"{o.seconds / base:.2f}x" if base and o.seconds is not None else "-"
        windows = "-" if o.windows is None else str(o.windows)
        lines.append(
            f"| {_label(o.client)} | {seconds} | {ratio} | {o.finished} | {o.given_up} | "
            f"{o.lost} | {windows} |"
        )
    verdicts = []
    for o in outcomes:
        if o.error is None and (o.finished, o.given_up, o.lost) != (good, args.poison, 0):
            verdicts.append(f"{o.client}: counts are off")
        if o.client != "pynsq" and base and o.seconds is not None and o.seconds > 1.5 * base:
            verdicts.append(f"{o.client}: slower than 1.5x pynsq")
    lines += ["", "target met" if not verdicts else "target missed: " + "; ".join(verdicts)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--poison", type=int, default=5)
    parser.add_argument("--max-in-flight", type=int, default=1, help="for every client")
    parser.add_argument("--max-req-timeout", default="1s", help="nsqd's flag (REQ is clamped)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per client, seconds")
    parser.add_argument("--nsqd-bin", default=None)
    parser.add_argument("--child", nargs=2, metavar=("CLIENT", "ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.messages, args.max_in_flight)
        return 0
    from transports.testing.real_nsq import MISSING_BINARIES, find_binaries

    if find_binaries(args.nsqd_bin) is None:
        print(MISSING_BINARIES)
        return 0
    outcomes = []
    for client in args.only:
        print(f"... {client}", file=sys.stderr, flush=True)
        outcomes.append(measure(client, args, args.nsqd_bin))
    print(report(outcomes, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

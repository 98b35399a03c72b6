"""End-to-end client throughput against the blast server (``bench/blast_server.py``).

Consume: messages/s for 100-byte bodies, every message FIN'd, one client process (the server
runs in another process, so each gets a core). Publish: messages/s published with MPUB (and
PUB where the client pipelines). Every client runs in a fresh child process against a fresh
server; the totals the server counted are checked against what the client reported.

    python bench/bench_clients.py                  # everything, prints a table and ratios
    python bench/bench_clients.py -n 300000 --only anyio-asyncio pynsq

Adding a client is one function::

    @consumer("name")
    def _(address: str, meter: Meter, max_in_flight: int) -> None:
        ...   # consume from address, FIN each message, call meter.hit() per message,
              # return once it returns True

(``@publisher("name")`` likewise: publish ``meter.count`` messages of ``meter.body``.)
A runner whose imports fail is reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from blast_server import BODY_SIZE, query_stats, start_blast_server  # noqa: E402

TOPIC = "bench"
CHANNEL = "bench"


class Meter:
    """Counts messages in a runner; samples memory once warm and at the end."""

    __slots__ = ("_warm_at", "body", "count", "left", "rss_end_kb", "rss_warm_kb", "t0", "t_warm")

    def __init__(self, count: int) -> None:
        self.count = count
        self.left = count
        self._warm_at = count - max(count // 10, 1)
        self.body = b"x" * BODY_SIZE
        self.rss_warm_kb = 0
        self.rss_end_kb = 0
        self.t0 = time.perf_counter()
        self.t_warm = 0.0

    def hit(self, n: int = 1) -> bool:
        """Count ``n`` messages; True once ``count`` were seen."""
        left = self.left - n
        self.left = left
        if left <= self._warm_at and not self.rss_warm_kb:
            self.rss_warm_kb = _rss_kb()
            self.t_warm = time.perf_counter()
            self._warm_at = -(1 << 62)
        if left <= 0:
            if not self.rss_end_kb:
                self.rss_end_kb = _rss_kb()
            return True
        return False


def _rss_kb() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:  # pragma: no cover - not Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


Runner = Callable[[str, Meter, int], None]
CONSUMERS: dict[str, Runner] = {}
PUBLISHERS: dict[str, Runner] = {}


def consumer(name: str) -> Callable[[Runner], Runner]:
    def register(func: Runner) -> Runner:
        CONSUMERS[name] = func
        return func

    return register


def publisher(name: str) -> Callable[[Runner], Runner]:
    def register(func: Runner) -> Runner:
        PUBLISHERS[name] = func
        return func

    return register


# --- nsq-sansio ------------------------------------------------------------------------------


def _sansio_consume(backend: str) -> Runner:
    def run(address: str, meter: Meter, max_in_flight: int) -> None:
        import anyio

        from transports.anyio import Consumer

        async def main() -> None:
            async with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight) as c:
                async for msg in c:
                    msg.finish_nowait()
                    if meter.hit():
                        break

        anyio.run(main, backend=backend)

    return run


consumer("nsq-sansio anyio/asyncio")(_sansio_consume("asyncio"))
consumer("nsq-sansio anyio/trio")(_sansio_consume("trio"))


@consumer("nsq-sansio anyio/asyncio run()")
def _sansio_run(address: str, meter: Meter, max_in_flight: int) -> None:
    import anyio

    from transports.anyio import Consumer

    async def main() -> None:
        async with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight) as c:
            done = anyio.Event()

            async def handler(msg: object) -> None:
                if meter.hit():
                    done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(c.run, handler)
                await done.wait()
                tg.cancel_scope.cancel()

    anyio.run(main, backend="asyncio")


# The blocking transport's runners live in bench/bench_sync.py (its engineer's file).
def _sync_runner(name: str) -> Runner:
    def run(address: str, meter: Meter, max_in_flight: int) -> None:
        import bench_sync

        getattr(bench_sync, name)(address, meter, max_in_flight)

    return run


consumer("nsq-sansio sync")(_sync_runner("consume"))
consumer("nsq-sansio sync run()")(_sync_runner("consume_run"))
publisher("nsq-sansio sync MPUB")(_sync_runner("publish_mpub"))
publisher("nsq-sansio sync PUB pipelined")(_sync_runner("publish_pipelined"))


def _sansio_publish(backend: str, batch: int) -> Runner:
    def run(address: str, meter: Meter, max_in_flight: int) -> None:
        import anyio

        from transports.anyio import Producer

        async def main() -> None:
            async with Producer(address) as p:
                body = meter.body
                if batch == 1:
                    async with anyio.create_task_group() as tg:
                        for _ in range(100):  # pipelining: 100 PUBs in flight on one connection

                            async def pub() -> None:
                                while meter.left > 0:
                                    meter.hit()
                                    await p.publish(TOPIC, body)

                            tg.start_soon(pub)
                else:
                    bodies = [body] * batch
                    async with anyio.create_task_group() as tg:
                        for _ in range(4):

                            async def mpub() -> None:
                                while meter.left > 0:
                                    meter.hit(batch)
                                    await p.multi_publish(TOPIC, bodies)

                            tg.start_soon(mpub)

        anyio.run(main, backend=backend)

    return run


publisher("nsq-sansio anyio/asyncio MPUB x100")(_sansio_publish("asyncio", 100))
publisher("nsq-sansio anyio/trio MPUB x100")(_sansio_publish("trio", 100))
publisher("nsq-sansio anyio/asyncio PUB")(_sansio_publish("asyncio", 1))


# --- pynsq (tornado) -------------------------------------------------------------------------


@consumer("pynsq")
def _pynsq(address: str, meter: Meter, max_in_flight: int) -> None:
    import logging

    import nsq
    import tornado.ioloop

    logging.getLogger("nsq").setLevel(logging.ERROR)
    loop = tornado.ioloop.IOLoop.current()
    reader: list[nsq.Reader] = []

    def handler(message: nsq.Message) -> bool:
        if meter.hit():
            loop.add_callback(loop.stop)
        return True

    reader.append(
        nsq.Reader(
            topic=TOPIC,
            channel=CHANNEL,
            nsqd_tcp_addresses=[address],
            message_handler=handler,
            max_in_flight=max_in_flight,
        )
    )
    loop.start()
    reader[0].close()


@publisher("pynsq MPUB x100")
def _pynsq_mpub(address: str, meter: Meter, max_in_flight: int) -> None:
    import logging

    import nsq
    import tornado.ioloop

    logging.getLogger("nsq").setLevel(logging.ERROR)
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([address])
    bodies = [meter.body] * 100
    window = 4
    state = {"pending": 0}

    def send() -> None:
        while state["pending"] < window and meter.left > 0:
            state["pending"] += 1
            meter.hit(100)
            writer.mpub(TOPIC, bodies, callback=done)

    def done(conn: object, data: object) -> None:
        state["pending"] -= 1
        if meter.left <= 0 and state["pending"] == 0:
            loop.stop()
        else:
            send()

    def start() -> None:
        if writer.conns:
            send()
        else:
            loop.call_later(0.05, start)

    loop.call_later(0.05, start)
    loop.start()


# --- ansq (asyncio) --------------------------------------------------------------------------


@consumer("ansq")
def _ansq(address: str, meter: Meter, max_in_flight: int) -> None:
    import asyncio

    import ansq

    async def main() -> None:
        host, _, port = address.rpartition(":")
        conn = await ansq.open_connection(host, int(port))
        await conn.subscribe(TOPIC, CHANNEL, messages_count=max_in_flight)
        async for message in conn.messages():
            await message.fin()
            if meter.hit():
                break
        await conn.close()

    asyncio.run(main())


@publisher("ansq MPUB x100")
def _ansq_mpub(address: str, meter: Meter, max_in_flight: int) -> None:
    import asyncio

    import ansq

    async def main() -> None:
        writer = await ansq.create_writer(nsqd_tcp_addresses=[address])
        bodies = [meter.body] * 100
        while meter.left > 0:
            meter.hit(100)
            await writer.mpub(TOPIC, *bodies)
        await writer.close()

    asyncio.run(main())


# --- driver ----------------------------------------------------------------------------------


@dataclass
class Result:
    kind: str
    name: str
    rate: float = 0.0
    seconds: float = 0.0
    rss_growth_kb: int = 0
    rss_kb: int = 0
    server: dict[str, int] | None = None
    error: str | None = None


def _child(kind: str, name: str, address: str, count: int, max_in_flight: int) -> None:
    runners = CONSUMERS if kind == "consume" else PUBLISHERS
    meter = Meter(count)
    try:
        runners[name](address, meter, max_in_flight)
    except ImportError as exc:
        print(json.dumps({"skipped": f"import failed: {exc}"}))
        return
    end = time.perf_counter()
    counted = meter.count - min(meter.left, 0) - max(meter.left, 0)
    warm = meter.t_warm or meter.t0
    # Rate over the steady part (after the first 10%: connection set-up and warm-up excluded).
    steady = max(end - warm, 1e-9)
    steady_count = counted - max(meter.count // 10, 1)
    print(
        json.dumps(
            {
                "seconds": end - meter.t0,
                "rate": max(steady_count, 1) / steady if meter.t_warm else counted / steady,
                "rss_warm_kb": meter.rss_warm_kb,
                "rss_end_kb": meter.rss_end_kb,
                "counted": counted,
            }
        )
    )


def run_one(kind: str, name: str, count: int, max_in_flight: int, timeout: float) -> Result:
    with start_blast_server() as address:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", kind, name, address]
        cmd += [str(count), str(max_in_flight)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Result(kind, name, error=f"timed out after {timeout:.0f}s")
        stats = query_stats(address)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return Result(kind, name, error=" | ".join(tail) or f"exit {proc.returncode}")
    data = json.loads(lines[-1])
    if "skipped" in data:
        return Result(kind, name, error="skipped: " + data["skipped"])
    return Result(
        kind,
        name,
        rate=data["rate"],
        seconds=data["seconds"],
        rss_growth_kb=data["rss_end_kb"] - data["rss_warm_kb"],
        rss_kb=data["rss_end_kb"],
        server=stats,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="nsq-sansio client benchmarks")
    parser.add_argument("--child", nargs=5, metavar=("KIND", "NAME", "ADDR", "N", "MIF"))
    parser.add_argument("-n", "--count", type=int, default=200_000, help="messages per run")
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--memory-in-flight", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--only", nargs="*", help="substrings of runner names to run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is kept")
    args = parser.parse_args()
    if args.child:
        kind, name, address, count, mif = args.child
        _child(kind, name, address, int(count), int(mif))
        return

    def chosen(name: str) -> bool:
        return not args.only or any(part in name for part in args.only)

    # Every round runs each client once, interleaved, so load on the machine hits all of
    # them alike; the best round of each client is kept.
    best: dict[tuple[str, str], Result] = {}
    plan = [("consume", n) for n in CONSUMERS if chosen(n)]
    plan += [("publish", n) for n in PUBLISHERS if chosen(n)]
    for round_no in range(1, args.repeat + 1):
        print(f"round {round_no}/{args.repeat}", flush=True)
        for kind, name in plan:
            count = args.count if kind == "consume" else args.count * 5
            mif = args.max_in_flight if kind == "consume" else 0
            result = run_one(kind, name, count, mif, args.timeout)
            _print(result)
            key = (kind, name)
            if key not in best or (not result.error and result.rate > best[key].rate):
                best[key] = result
    results = list(best.values())
    print("\nbest of each:")
    for result in results:
        _print(result)
    memory: Result | None = None
    if chosen("nsq-sansio anyio/asyncio") and "nsq-sansio anyio/asyncio" in CONSUMERS:
        memory = run_one(
            "consume", "nsq-sansio anyio/asyncio", args.count, args.memory_in_flight, args.timeout
        )
    _summary(results, memory, args.memory_in_flight)


def _print(r: Result) -> None:
    if r.error:
        print(f"  {r.kind:8} {r.name:34} {r.error}", flush=True)
        return
    extra = ""
    if r.server:
        done = r.server["finished"] if r.kind == "consume" else r.server["published"]
        extra = f" (server counted {done})"
    print(
        f"  {r.kind:8} {r.name:34} {r.rate:>11,.0f} msg/s  rss {r.rss_kb / 1024:6.1f} MiB"
        f"  +{r.rss_growth_kb / 1024:.1f} MiB{extra}",
        flush=True,
    )


def _summary(results: list[Result], memory: Result | None, mif: int) -> None:
    by_name = {(r.kind, r.name): r for r in results if not r.error}
    base = by_name.get(("consume", "pynsq"))
    print("\nratios (consume, vs pynsq on the same server, same run):")
    targets = {"anyio/asyncio": 8.0, "anyio/trio": 8.0, "sync": 5.0, "sync run()": 5.0}
    for (kind, name), r in by_name.items():
        if kind != "consume" or base is None or name == "pynsq":
            continue
        target = next((t for key, t in targets.items() if name.endswith(key)), None)
        verdict = "" if target is None else (" ok" if r.rate / base.rate >= target else " BELOW")
        goal = f" (target {target:g}x{verdict})" if target else ""
        print(f"  {name:34} {r.rate / base.rate:5.1f}x pynsq{goal}")
    print("publish:")
    for (kind, name), r in by_name.items():
        if kind == "publish":
            note = ""
            if "nsq-sansio" in name and "MPUB" in name and "trio" not in name:
                note = "  (target 150,000: " + ("ok)" if r.rate >= 150_000 else "BELOW)")
            print(f"  {name:34} {r.rate:>11,.0f} msg/s{note}")
    if memory is not None and not memory.error:
        print(
            f"memory with {mif} in flight (nsq-sansio anyio/asyncio): "
            f"rss {memory.rss_kb / 1024:.1f} MiB, growth over the last 90% of the run "
            f"{memory.rss_growth_kb / 1024:+.1f} MiB"
        )


if __name__ == "__main__":
    main()

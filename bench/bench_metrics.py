"""What the Prometheus export costs a consumer (``transports.metrics``).

Consumes ``-n`` messages from the blast server (``bench/blast_server.py``, its own process)
with the anyio (asyncio) and blocking consumers, three ways, interleaved, best of
``--repeat`` rounds:

* ``plain``: no metrics (what every user without the ``metrics`` extra runs);
* ``instrumented``: ``metrics.instrument(consumer)``, never scraped;
* ``scraped``: instrumented and scraped over HTTP every ``--scrape-every`` seconds (0.25 s by
  default, 60 to 240 times more often than Prometheus' usual 15-60 s).

The collectors read ``stats()`` at scrape time only, so the first two should be equal within
noise and the third cost what its scrapes cost. Reported: CPU time of this process per
message (``time.process_time``, steadier than wall time on a shared machine; the server runs
in its own process) and messages per second of wall time.

    python bench/bench_metrics.py -n 300000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from blast_server import start_blast_server  # noqa: E402

TOPIC = "bench"
CHANNEL = "bench"
MODES = ("plain", "instrumented", "scraped")


def _scraper(url: str, every: float, stop: threading.Event) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(every):
            with urllib.request.urlopen(url, timeout=5) as response:
                response.read()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _export(consumer: object, mode: str, every: float) -> Callable[[], None]:
    """Instrument ``consumer`` for ``mode``; returns what stops the scraping."""
    if mode == "plain":
        return lambda: None
    from prometheus_client import CollectorRegistry

    from transports import metrics

    registry = CollectorRegistry()
    metrics.instrument(consumer, registry=registry)
    if mode == "instrumented":
        return lambda: None
    server, _ = metrics.start_http_server("127.0.0.1:0", registry)
    stop = threading.Event()
    thread = _scraper(f"http://127.0.0.1:{server.server_address[1]}/metrics", every, stop)

    def done() -> None:
        stop.set()
        thread.join()
        server.shutdown()
        server.server_close()

    return done


def consume_anyio(
    address: str, count: int, mif: int, mode: str, every: float
) -> tuple[float, float]:
    import anyio

    from transports.anyio import Consumer

    async def main() -> tuple[float, float]:
        async with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=mif) as c:
            stop = _export(c, mode, every)
            left = count
            started, cpu = time.perf_counter(), time.process_time()
            async for msg in c:
                msg.finish_nowait()
                left -= 1
                if not left:
                    break
            result = (time.perf_counter() - started, time.process_time() - cpu)
            stop()
            return result

    return anyio.run(main, backend="asyncio")


def consume_sync(
    address: str, count: int, mif: int, mode: str, every: float
) -> tuple[float, float]:
    from transports.sync import Consumer

    with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=mif) as c:
        stop = _export(c, mode, every)
        left = count
        started, cpu = time.perf_counter(), time.process_time()
        for msg in c:
            msg.finish()
            left -= 1
            if not left:
                break
        result = (time.perf_counter() - started, time.process_time() - cpu)
        stop()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", "--count", type=int, default=300_000)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=0.25)
    args = parser.parse_args()
    runners = {"anyio/asyncio": consume_anyio, "sync": consume_sync}
    best: dict[tuple[str, str], tuple[float, float]] = {}  # (CPU us per message, msg/s)
    for round_no in range(1, args.repeat + 1):
        print(f"round {round_no}/{args.repeat}", flush=True)
        for name, run in runners.items():
            for mode in MODES:
                with start_blast_server() as address:
                    wall, cpu = run(
                        address, args.count, args.max_in_flight, mode, args.scrape_every
                    )
                us, rate = cpu / args.count * 1e6, args.count / wall
                print(
                    f"  {name:14} {mode:13} {us:6.2f} us CPU/msg {rate:>10,.0f} msg/s", flush=True
                )
                old = best.get((name, mode))
                best[(name, mode)] = (min(us, old[0]), max(rate, old[1])) if old else (us, rate)
    print("\nbest of each (lowest CPU per message, highest rate), ratio to plain:")
    for name in runners:
        plain_us, plain_rate = best[(name, "plain")]
        for mode in MODES:
            us, rate = best[(name, mode)]
            print(
                f"  {name:14} {mode:13} {us:6.2f} us CPU/msg ({us / plain_us:5.3f}x)"
                f" {rate:>10,.0f} msg/s ({rate / plain_rate:5.3f}x)"
            )


if __name__ == "__main__":
    main()

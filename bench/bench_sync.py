"""Throughput of the blocking transport against the blast server (``bench/blast_server.py``).

Exports runner functions for ``bench/bench_clients.py`` (same signature as its runners)::

    from bench_sync import consume, consume_run, publish_pipelined, publish_mpub

and prints its own numbers, with pynsq's Reader for comparison when it is installed::

    python bench/bench_sync.py                 # 200k messages per runner
    python bench/bench_sync.py -n 500000 --max-in-flight 2500

``--pipeline`` measures the blocking consumer's Python work per message on one thread, with no
socket and no thread hand-off: 64 KiB chunks of message frames fed to its IO side's
``on_data`` (decode, coordinator, the ``Message`` wrappers), ``for msg in c: msg.finish()``, then
``write_pending`` (the answers taken back, FIN bytes made). It prints microseconds per message
(best of ``--repeat``, process time); ``--once`` runs it ``--passes`` times without timing,
for a profiler. Instructions per message, repeatable on a shared machine: run ``--pipeline
--once -n 20000`` under ``valgrind --tool=callgrind`` with ``--passes 1`` and ``--passes 3``
and divide the difference of the totals by 40000 (start-up and building the frames cancel
out)::

    python bench/bench_sync.py --pipeline      # us/msg
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import deque
from typing import Any, Protocol

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for path in (ROOT, HERE):
    if path not in sys.path:
        sys.path.insert(0, path)

from blast_server import query_stats, start_blast_server  # noqa: E402

__all__ = ["consume", "consume_run", "publish_mpub", "publish_pipelined"]

TOPIC = "bench"
CHANNEL = "bench"


class MeterLike(Protocol):
    count: int
    body: bytes

    def hit(self, n: int = 1) -> bool: ...


def consume(address: str, meter: MeterLike, max_in_flight: int) -> None:
    """``for msg in consumer: msg.finish()`` until ``meter`` is full."""
    from transports.sync import Consumer

    with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight) as c:
        hit = meter.hit
        for msg in c:
            msg.finish()
            if hit():
                break


def consume_run(address: str, meter: MeterLike, max_in_flight: int) -> None:
    """``consumer.run(handler, concurrency=4)``: the handler returns, the message is FIN'd."""
    import threading

    from transports.sync import Consumer

    lock = threading.Lock()
    with Consumer(TOPIC, CHANNEL, nsqd=[address], max_in_flight=max_in_flight) as c:

        def handler(msg: Any) -> None:
            with lock:
                if meter.hit():
                    c.start_drain(5.0)

        c.run(handler, concurrency=4)


def publish_pipelined(address: str, meter: MeterLike, max_in_flight: int) -> None:
    """``publish_async`` from one thread, 1000 in flight on one connection."""
    from transports.sync import Producer

    with Producer(address, max_pending=max(max_in_flight, 1000)) as p:
        body = meter.body
        window: deque[Any] = deque()
        publish = p.publish_async
        for _ in range(meter.count):
            window.append(publish(TOPIC, body))
            if len(window) >= 1000:
                window.popleft().result()
                meter.hit()
        while window:
            window.popleft().result()
            meter.hit()


def publish_mpub(address: str, meter: MeterLike, max_in_flight: int) -> None:
    """``multi_publish`` of 100 bodies at a time, waiting for each answer."""
    from transports.sync import Producer

    with Producer(address) as p:
        batch = [meter.body] * 100
        left = meter.count
        while left > 0:
            n = min(100, left)
            p.multi_publish(TOPIC, batch[:n])
            left -= n
            meter.hit(n)


def _pynsq_consume(address: str, meter: MeterLike, max_in_flight: int) -> None:
    import nsq
    import tornado.ioloop

    reader: Any = None

    def handler(message: Any) -> bool:
        if meter.hit():
            tornado.ioloop.IOLoop.current().stop()
        return True

    reader = nsq.Reader(
        topic=TOPIC,
        channel=CHANNEL,
        nsqd_tcp_addresses=[address],
        message_handler=handler,
        max_in_flight=max_in_flight,
    )
    nsq.run()
    del reader


class _Meter:
    """Like bench_clients.Meter: the rate is taken after the first 10% (warm-up excluded)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.left = count
        self.body = b"x" * 100
        self.t0 = time.perf_counter()
        self.t_warm = 0.0
        self._warm_at = count - max(count // 10, 1)

    def hit(self, n: int = 1) -> bool:
        self.left -= n
        if not self.t_warm and self.left <= self._warm_at:
            self.t_warm = time.perf_counter()
        return self.left <= 0


RUNNERS = {
    "sync consume (for msg in c)": consume,
    "sync consume (run, 4 threads)": consume_run,
    "sync publish (PUB pipelined)": publish_pipelined,
    "sync publish (MPUB x100)": publish_mpub,
    "pynsq Reader": _pynsq_consume,
}


def _child(name: str, address: str, count: int, max_in_flight: int) -> None:
    meter = _Meter(count)
    RUNNERS[name](address, meter, max_in_flight)
    end = time.perf_counter()  # after the runner closed its client
    steady = count - max(count // 10, 1)
    print(f"RESULT {steady / (end - (meter.t_warm or meter.t0))}", flush=True)


def measure(name: str, count: int, max_in_flight: int) -> tuple[float, dict[str, int]]:
    """Run one runner in a fresh child process against a fresh blast server."""
    with start_blast_server() as address:
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, address, str(count), str(max_in_flight)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
        return float(lines[-1].split()[1]), query_stats(address)


def pipeline(chunks: list[bytes]) -> int:
    """The blocking consumer's per-message work on this thread (see the module docstring):
    a subscribed connection set up by hand, the IO loop's writes collected, no wake-ups."""
    from nsq_sansio.frames import encode_frame
    from transports.sync import Consumer
    from transports.sync._loop import LoopSocket

    c = Consumer(TOPIC, CHANNEL, nsqd=["127.0.0.1:4150"], max_in_flight=2500)
    io = c._io  # the IO side the IO thread drives: driven here on this thread
    coordinator = io.coordinator
    coordinator.start(0.0)
    conn_id = coordinator.take_actions()[0].conn_id  # type: ignore[attr-defined]
    coordinator.connection_made(conn_id, 0.0)
    coordinator.receive_data(conn_id, encode_frame(0, b'{"max_rdy_count": 2500}'), 0.0)
    coordinator.receive_data(conn_id, encode_frame(0, b"OK"), 0.0)
    # Warmed up as the periodic check does: RDY 2500 before the reads below. A new connection
    # gets RDY 1, and the core drops a connection whose nsqd sends more than RDY allows (each
    # chunk holds about 490 messages), so without this nothing would be delivered.
    coordinator._links[conn_id].warm = True
    coordinator._rdy.rebalance(0.0)
    assert coordinator.total_rdy == 2500, coordinator.total_rdy
    coordinator.pending_data()
    coordinator.take_actions()
    link = LoopSocket(conn_id, "127.0.0.1", 4150)
    io.links[conn_id] = link
    written: list[bytes] = []
    io.loop.write = lambda _link, data: written.append(data)  # type: ignore[method-assign]
    io.loop._wake_pending = True  # wake() does nothing while this is set
    c._started = True
    messages = iter(c)
    ready = io.ready
    count = 0
    for chunk in chunks:
        io.on_data(link, chunk, 1.0)
        for _ in range(len(ready)):
            next(messages).finish()
            count += 1
        io.write_pending()
    fins = sum(data.count(b"FIN ") for data in written)
    assert fins == count, f"{fins} FINs for {count} messages"
    assert conn_id in coordinator.connection_ids(), "the connection was dropped"
    return count


def _pipeline_main(count: int, repeat: int, once: bool, passes: int) -> None:
    import gc
    import platform

    from bench_coordinator import build_chunks

    chunks = build_chunks(count, 100)
    if once:
        for _ in range(passes):
            pipeline(chunks)
        return
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.process_time()
        done = pipeline(chunks)
        assert done == count, f"{done} of {count} messages delivered"
        best = min(best, (time.process_time() - start) / done)
    print(
        f"blocking consumer pipeline, {count} messages of 100 bytes, one thread, best of "
        f"{repeat}; Python {platform.python_version()}: {best * 1e6:.3f} us/msg"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--count", type=int, default=200_000)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--pipeline", action="store_true", help="the one-thread pipeline")
    parser.add_argument("--once", action="store_true", help="--pipeline: one run, no timing")
    parser.add_argument("--repeat", type=int, default=7, help="--pipeline: best of")
    parser.add_argument("--passes", type=int, default=1, help="--pipeline --once: runs")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pipeline:
        _pipeline_main(args.count, args.repeat, args.once, args.passes)
        return
    if args.child:
        name, address, count, mif = args.child
        _child(name, address, int(count), int(mif))
        return
    results: dict[str, float] = {}
    for name in RUNNERS:
        if args.only and not any(o in name for o in args.only):
            continue
        try:
            rate, totals = measure(name, args.count, args.max_in_flight)
        except Exception as exc:  # pynsq missing, etc.
            print(f"{name:34s} skipped: {str(exc).strip().splitlines()[-1]}")
            continue
        results[name] = rate
        print(f"{name:34s} {rate:>12,.0f} msgs/s   server saw {totals}")
    base = results.get("pynsq Reader")
    if base:
        for name, rate in results.items():
            if "consume" in name:
                print(f"{name:34s} {rate / base:5.1f}x pynsq")


if __name__ == "__main__":
    main()

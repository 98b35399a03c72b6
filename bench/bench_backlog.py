"""How a broker moves a big backlog into a topic's first channel, and serves others meanwhile.

Two measurements, each for the embedded nsqd (in its own process, ``python -m transports.cli
nsqd``, so the GIL of this script does not interfere) and for the real nsqd when its binaries
are found (``--nsqd-bin`` or the workplace's copy), in the same run:

``ping``   publishes ``--messages`` 1-byte messages to a topic without channels, then
           SUBscribes (which creates the first channel) while a thread GETs ``/ping`` every
           5 ms, and waits until the topic's depth is 0. Prints the SUB latency, the time until
           the first message, the time the move took and the /ping latencies seen meanwhile.
``drain``  Go's ``bench_writer`` publishes for ``--write-seconds`` (200-byte messages, no
           channel yet), then Go's ``bench_reader`` consumes for ``--read-seconds`` (a new
           channel, RDY 2500) while the channel's ``message_count`` is sampled every 50 ms:
           prints how much of the backlog was in the channel when the reader left, how long
           the whole backlog took to get there and that throughput, next to the reader's rate
           (the channel must fill faster than the reader drains it).

::

    python bench/bench_backlog.py                     # both, 1M messages, 3 s + 3 s
    python bench/bench_backlog.py --only drain --repeat 3
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from transports.testing.real_nsq import RealNSQD, find_binaries, free_port, tool

BATCH = 200_000


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _read_frame(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buf) >= 4:
            (size,) = struct.unpack_from(">i", buf)
            if len(buf) >= 4 + size:
                kind = struct.unpack_from(">i", buf, 4)[0]
                data = bytes(buf[8 : 4 + size])
                del buf[: 4 + size]
                if kind == 0 and data == b"_heartbeat_":
                    sock.sendall(b"NOP\n")
                    continue
                return kind, data
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk


def _get(http_address: str, path: str) -> bytes:
    conn = _connection(http_address)
    conn.request("GET", path)
    body = conn.getresponse().read()
    conn.close()
    return body


def _connection(address: str) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(*_split(address), timeout=60)


def measure(tcp: str, http_address: str, messages: int) -> dict[str, float]:
    topic = f"backlog{time.time_ns()}"
    buf = bytearray()
    with socket.create_connection(_split(tcp)) as producer:
        producer.sendall(b"  V2")
        left = messages
        while left:
            count = min(BATCH, left)
            body = struct.pack(">i", count) + (struct.pack(">i", 1) + b"x") * count
            producer.sendall(f"MPUB {topic}\n".encode() + struct.pack(">i", len(body)) + body)
            assert _read_frame(producer, buf) == (0, b"OK")
            left -= count
    pings: list[tuple[float, float]] = []
    stop = threading.Event()

    def pinger() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            _get(http_address, "/ping")
            pings.append((sent, time.monotonic() - sent))
            stop.wait(0.005)

    thread = threading.Thread(target=pinger, daemon=True)
    thread.start()
    time.sleep(0.05)
    buf = bytearray()
    with socket.create_connection(_split(tcp)) as consumer:
        consumer.sendall(b"  V2")
        started = time.monotonic()
        consumer.sendall(f"SUB {topic} c\n".encode())
        assert _read_frame(consumer, buf) == (0, b"OK")
        sub = time.monotonic() - started
        consumer.sendall(b"RDY 1\n")
        kind, _ = _read_frame(consumer, buf)
        assert kind == 2
        first = time.monotonic() - started
        while True:
            stats = json.loads(
                _get(http_address, f"/stats?format=json&topic={topic}&include_mem=false")
            )
            if stats["topics"][0]["depth"] == 0:
                break
            time.sleep(0.01)
        moved = time.monotonic() - started
    stop.set()
    thread.join()
    during = [latency for sent, latency in pings if started <= sent <= started + moved]
    conn = _connection(http_address)
    conn.request("POST", f"/topic/delete?topic={topic}")
    conn.getresponse().read()
    conn.close()
    return {
        "sub_ms": sub * 1000,
        "first_ms": first * 1000,
        "moved_s": moved,
        "pings": len(during),
        "ping_max_ms": max(during, default=0.0) * 1000,
        "ping_median_ms": statistics.median(during) * 1000 if during else 0.0,
    }


def measure_drain(
    tcp: str, http_address: str, write_seconds: float, read_seconds: float, bin_dir: str | None
) -> dict[str, float]:
    """bench_writer, then bench_reader on a new channel: how fast the backlog reaches it."""
    writer, reader = tool("bench_writer", bin_dir), tool("bench_reader", bin_dir)
    assert writer is not None and reader is not None
    topic = f"drain{time.time_ns()}"
    common = [f"-nsqd-tcp-address={tcp}", f"-topic={topic}", "-size=200"]
    subprocess.run(
        [str(writer), *common, f"-runfor={write_seconds}s"], check=True, capture_output=True
    )

    def channel_count() -> tuple[int, int]:
        path = f"/stats?format=json&topic={topic}&include_mem=false"
        (found,) = json.loads(_get(http_address, path))["topics"]
        channels = found["channels"]
        return found["message_count"], channels[0]["message_count"] if channels else 0

    published, _ = channel_count()
    process = subprocess.Popen(
        [str(reader), *common, f"-runfor={read_seconds}s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    started = time.monotonic()
    filled = 0.0
    while process.poll() is None:
        if not filled and channel_count()[1] >= published:
            filled = time.monotonic() - started
        time.sleep(0.05)
    output = process.communicate()[0].decode()
    moved = channel_count()[1]
    reader_rate = 0.0
    for word in output.split(" - "):
        if word.endswith("ops/s"):
            reader_rate = float(word.split("ops/s")[0])
    _get(http_address, "/ping")
    conn = _connection(http_address)
    conn.request("POST", f"/topic/delete?topic={topic}")
    conn.getresponse().read()
    conn.close()
    return {
        "published": published,
        "moved": moved,
        "filled_s": filled,
        "move_rate": published / filled if filled else moved / read_seconds,
        "reader_rate": reader_rate,
    }


@contextmanager
def embedded() -> Iterator[tuple[str, str]]:
    tcp, http_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "transports.cli", "nsqd"]
    process = subprocess.Popen(
        [*command, f"--tcp-address={tcp}", f"--http-address={http_address}"],
        stderr=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parent.parent),
    )
    try:
        assert process.stderr is not None
        process.stderr.readline()  # "nsqd: TCP ... HTTP ..." once it listens
        yield tcp, http_address
    finally:
        process.terminate()
        process.wait(30)


@contextmanager
def real(bin_dir: str | None) -> Iterator[tuple[str, str]]:
    with RealNSQD(bin_dir=bin_dir) as nsqd:
        yield nsqd.tcp_address, nsqd.http_address


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["ping", "drain"], default=None)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--write-seconds", type=float, default=3.0)
    parser.add_argument("--read-seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--nsqd-bin", default=None, help="folder (or path) of the real nsqd")
    args = parser.parse_args()
    brokers: list[tuple[str, Callable[[], AbstractContextManager[tuple[str, str]]]]] = [
        ("embedded", embedded)
    ]
    if find_binaries(args.nsqd_bin) is not None:
        brokers.append(("real nsqd", lambda: real(args.nsqd_bin)))
    else:
        print("real nsqd not found (--nsqd-bin): measuring the embedded broker only")
    if args.only in (None, "ping"):
        print(f"{args.messages} waiting messages; SUB creates the first channel; /ping every 5 ms")
        for name, start in brokers:
            for _ in range(args.repeat):
                with start() as (tcp, http_address):
                    result = measure(tcp, http_address, args.messages)
                print(
                    f"  {name:<9} SUB {result['sub_ms']:8.1f} ms  first message "
                    f"{result['first_ms']:8.1f} ms  moved in {result['moved_s']:5.2f} s  "
                    f"/ping during the move: {result['pings']:4d} answered, median "
                    f"{result['ping_median_ms']:6.1f} ms, max {result['ping_max_ms']:7.1f} ms"
                )
    if args.only in (None, "drain"):
        if tool("bench_reader", args.nsqd_bin) is None:
            print("Go's bench_writer/bench_reader not found (--nsqd-bin): no drain measurement")
            return 0
        print(
            f"bench_writer {args.write_seconds:g} s (no channel yet), then bench_reader "
            f"{args.read_seconds:g} s on a new channel: the backlog into that channel"
        )
        for name, start in brokers:
            for _ in range(args.repeat):
                with start() as (tcp, http_address):
                    drained = measure_drain(
                        tcp, http_address, args.write_seconds, args.read_seconds, args.nsqd_bin
                    )
                filled = (
                    f"all in the channel after {drained['filled_s']:5.2f} s"
                    if drained["filled_s"]
                    else "not all in the channel when the reader left"
                )
                print(
                    f"  {name:<9} {drained['moved']:>9,.0f} of {drained['published']:>9,.0f} "
                    f"moved; {filled}: {drained['move_rate']:>9,.0f} msg/s into the channel, "
                    f"reader {drained['reader_rate']:>9,.0f} msg/s"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())

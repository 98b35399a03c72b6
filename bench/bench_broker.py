"""Embedded nsqd throughput: publish-to-consume over loopback, 100-byte bodies.

One producer process, one consumer (this process), the broker in its own process, so the
number measures the broker and not the GIL shared with the clients. The clients speak raw
protocol V2 with minimal parsing to stay out of the way. Prints messages/s for PUB (pipelined)
and MPUB (batches of 100).

    python bench/bench_broker.py [--messages 200000] [--backend asyncio|trio] [--nsqd host:port]

``--nsqd`` points it at another broker (a real nsqd, for a ratio); then no broker is started.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BODY = b"x" * 100


def _broker(conn: "mp.connection.Connection", backend: str) -> None:  # noqa: UP037
    import anyio

    from transports.embedded.nsqd import EmbeddedNSQD

    async def main() -> None:
        async with EmbeddedNSQD() as nsqd:
            conn.send(nsqd.tcp_address)
            await anyio.to_thread.run_sync(conn.recv)  # wait for "stop"

    anyio.run(main, backend=backend)


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(b"  V2")
    return sock


def _drain_oks(sock: socket.socket, count: int, buf: bytearray) -> None:
    """Read ``count`` OK response frames (10 bytes each) off the socket."""
    need = 10 * count
    while len(buf) < need:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("broker closed the producer connection")
        buf += chunk
    frames = bytes(buf[:need])
    del buf[:need]
    if frames.count(b"\x00\x00\x00\x06\x00\x00\x00\x00OK") != count:
        raise RuntimeError(f"unexpected answer to publish: {frames[:60]!r}")


def _producer(address: str, topic: str, total: int, mode: str) -> None:
    sock = _connect(address)
    buf = bytearray()
    if mode == "pub":
        one = f"PUB {topic}\n".encode() + struct.pack(">i", len(BODY)) + BODY
        window = 200
        sent = 0
        while sent < total:
            n = min(window, total - sent)
            sock.sendall(one * n)
            _drain_oks(sock, n, buf)
            sent += n
    else:
        batch = 100
        item = struct.pack(">i", len(BODY)) + BODY
        sent = 0
        while sent < total:
            n = min(batch, total - sent)
            payload = struct.pack(">i", n) + item * n
            sock.sendall(f"MPUB {topic}\n".encode() + struct.pack(">i", len(payload)) + payload)
            _drain_oks(sock, 1, buf)
            sent += n
    sock.close()


def _consume(address: str, topic: str, total: int, rdy: int) -> float:
    """Subscribe, FIN everything, return seconds from first message to last."""
    sock = _connect(address)
    sock.sendall(f"SUB {topic} bench\nRDY {rdy}\n".encode())
    buf = b""
    got = 0
    first = 0.0
    subscribed = False
    while got < total:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("broker closed the consumer connection")
        buf += chunk
        pos = 0
        fins = []
        while len(buf) - pos >= 8:
            size, kind = struct.unpack_from(">ii", buf, pos)
            if len(buf) - pos < 4 + size:
                break
            if kind == 2:
                if got == 0:
                    first = time.perf_counter()
                got += 1
                fins.append(b"FIN " + buf[pos + 18 : pos + 34] + b"\n")
            elif kind == 0:
                data = buf[pos + 8 : pos + 4 + size]
                if data == b"_heartbeat_":
                    fins.append(b"NOP\n")
                elif data == b"OK" and not subscribed:
                    subscribed = True
            else:
                raise RuntimeError(f"error frame: {buf[pos + 8 : pos + 4 + size]!r}")
            pos += 4 + size
        buf = buf[pos:]
        if fins:
            sock.sendall(b"".join(fins))
    elapsed = time.perf_counter() - first
    sock.close()
    return elapsed


def run(address: str, total: int, mode: str, rdy: int) -> float:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    # create the channel first so nothing published is missed by the consumer
    sock = _connect(address)
    sock.sendall(f"SUB {topic} bench\n".encode())
    sock.recv(100)
    sock.close()
    producer = mp.Process(target=_producer, args=(address, topic, total, mode))
    producer.start()
    try:
        elapsed = _consume(address, topic, total, rdy)
    finally:
        producer.join(timeout=60)
    return total / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--nsqd", default=None, help="benchmark this broker instead")
    args = parser.parse_args()
    broker = None
    parent = None
    if args.nsqd:
        address = args.nsqd
        label = f"nsqd at {address}"
    else:
        parent, child = mp.Pipe()
        broker = mp.Process(target=_broker, args=(child, args.backend), daemon=True)
        broker.start()
        address = parent.recv()
        label = f"embedded nsqd ({args.backend})"
    try:
        for mode in ("pub", "mpub"):
            rate = run(address, args.messages, mode, args.rdy)
            print(
                f"{label}: {mode.upper():4s} {args.messages} x 100 B, 1 producer, 1 consumer "
                f"(RDY {args.rdy}): {rate:,.0f} msg/s"
            )
    finally:
        if parent is not None:
            parent.send("stop")
        if broker is not None:
            broker.join(timeout=10)
            if broker.is_alive():
                broker.terminate()


if __name__ == "__main__":
    main()

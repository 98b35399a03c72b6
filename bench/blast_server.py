"""A fast fake nsqd for benchmarks: it only speaks enough protocol V2 to measure clients.

* Consumers: after ``SUB``, it sends pre-encoded 100-byte messages as fast as the client's RDY
  allows (``RDY - in_flight``), as slices of one pre-built buffer (no per-message work), and
  counts ``FIN``/``REQ``. Like nsqd, it writes in batches of up to 16 KiB (its output buffer)
  unless the client holds no message, flushing the rest after 5 ms (nsqd: 250 ms).
* Producers: ``PUB``/``MPUB``/``DPUB`` are answered ``OK`` and counted (bodies are skipped).
* A control line ``STATS\\n`` (instead of the ``"  V2"`` magic) answers one JSON line of totals.

So the broker is not what the benchmark measures. Run standalone::

    python bench/blast_server.py --port 4150        # prints "LISTENING <port>"

or start it in a child process with :func:`start_blast_server`. This is a benchmark tool: it
trusts its clients (no validation beyond what is needed to stay in sync).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

__all__ = ["BlastServer", "start_blast_server"]

BODY_SIZE = 100
RING = 1 << 16  # distinct message ids; far above any max_in_flight benchmarked

_FRAME_RESPONSE = 0
_FRAME_ERROR = 1
_FRAME_MESSAGE = 2
_MAGIC = b"  V2"
OUTPUT_BUFFER = 16 * 1024
FLUSH_AFTER = 0.005


def _frame(frame_type: int, data: bytes) -> bytes:
    return struct.pack(">ii", len(data) + 4, frame_type) + data


def build_ring(count: int = RING, body_size: int = BODY_SIZE) -> tuple[bytes, int]:
    """``count`` message frames back to back (ids ``%016x``) and the size of one frame."""
    body = (b"0123456789" * (body_size // 10 + 1))[:body_size]
    now = time.time_ns()
    parts = []
    for i in range(count):
        payload = struct.pack(">qH", now, 1) + b"%016x" % i + body
        parts.append(_frame(_FRAME_MESSAGE, payload))
    return b"".join(parts), len(parts[0])


OK = _frame(_FRAME_RESPONSE, b"OK")
CLOSE_WAIT = _frame(_FRAME_RESPONSE, b"CLOSE_WAIT")
IDENTIFY_ANSWER = _frame(
    _FRAME_RESPONSE,
    json.dumps(
        {
            "max_rdy_count": 100_000,
            "version": "1.3.0-blast",
            "max_msg_timeout": 900_000,
            "msg_timeout": 60_000,
            "tls_v1": False,
            "deflate": False,
            "deflate_level": 0,
            "max_deflate_level": 6,
            "snappy": False,
            "sample_rate": 0,
            "auth_required": False,
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
        }
    ).encode(),
)


class _Totals:
    def __init__(self) -> None:
        self.sent = 0
        self.finished = 0
        self.requeued = 0
        self.published = 0
        self.publish_commands = 0
        self.connections = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class _Client(asyncio.Protocol):
    def __init__(self, server: BlastServer) -> None:
        self.server = server
        self.totals = server.totals
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.started = False
        self.subscribed = False
        self.rdy = 0
        self.in_flight = 0
        self.position = 0  # next ring index to send
        self.timer: asyncio.TimerHandle | None = None
        self.quickack: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.totals.connections += 1
        sock = transport.get_extra_info("socket")
        quickack = getattr(socket, "TCP_QUICKACK", None)
        if sock is not None and quickack is not None:
            setsockopt = sock.setsockopt

            def ack_now() -> None:
                setsockopt(socket.IPPROTO_TCP, quickack, 1)

            self.quickack = ack_now

    def data_received(self, data: bytes) -> None:
        if self.quickack is not None:
            # ACK at once: clients that leave Nagle on (one small write per FIN) would
            # otherwise wait for delayed ACKs, and the benchmark would measure the kernel.
            self.quickack()
        buf = self.buffer
        buf += data
        pos = 0
        end = len(buf)
        out: list[bytes] = []
        totals = self.totals
        if not self.started:
            if end < 4:
                return
            if buf[:4] == b"STAT":
                if b"\n" in buf:
                    assert self.transport is not None
                    self.transport.write(json.dumps(totals.as_dict()).encode() + b"\n")
                    self.transport.close()
                return
            pos = 4
            self.started = True
        finished = 0
        while pos < end:
            nl = buf.find(b"\n", pos, pos + 300)
            if nl < 0:
                break
            # Fast path: "FIN <16 hex>\n"
            if nl - pos == 20 and buf[pos] == 70:  # 'F'
                finished += 1
                pos = nl + 1
                continue
            line = bytes(buf[pos:nl])
            command, _, args = line.partition(b" ")
            if command in (b"PUB", b"MPUB", b"DPUB", b"IDENTIFY", b"AUTH"):
                if end - (nl + 1) < 4:
                    break
                (size,) = struct.unpack_from(">i", buf, nl + 1)
                stop = nl + 5 + size
                if stop > end:
                    break
                if command == b"MPUB":
                    totals.published += struct.unpack_from(">i", buf, nl + 5)[0]
                    totals.publish_commands += 1
                    out.append(OK)
                elif command == b"IDENTIFY":
                    out.append(IDENTIFY_ANSWER)
                elif command == b"AUTH":
                    out.append(_frame(_FRAME_RESPONSE, b'{"permission_count":1}'))
                else:
                    totals.published += 1
                    totals.publish_commands += 1
                    out.append(OK)
                pos = stop
                continue
            pos = nl + 1
            if command == b"RDY":
                self.rdy = int(args)
            elif command == b"REQ":
                self.in_flight -= 1
                totals.requeued += 1
            elif command == b"SUB":
                self.subscribed = True
                out.append(OK)
            elif command == b"CLS":
                self.subscribed = False
                out.append(CLOSE_WAIT)
            elif command in (b"NOP", b"TOUCH"):
                pass
            else:
                out.append(_frame(_FRAME_ERROR, b"E_INVALID unknown command"))
        del buf[:pos]
        if finished:
            self.in_flight -= finished
            totals.finished += finished
        transport = self.transport
        assert transport is not None
        if out:
            transport.write(b"".join(out))
        if self.subscribed:
            self._blast(transport)

    def _blast(self, transport: asyncio.Transport) -> None:
        credit = self.rdy - self.in_flight
        if credit <= 0:
            return
        # Like nsqd's 16 KiB output buffer: write in batches, not one message per FIN, unless
        # the client holds nothing; a short timer (5 ms, nsqd's is 250 ms) flushes the rest.
        if self.in_flight and credit * self.server.frame_size < OUTPUT_BUFFER:
            if self.timer is None:
                self.timer = asyncio.get_running_loop().call_later(FLUSH_AFTER, self._flush)
            return
        self._send(transport, credit)

    def _flush(self) -> None:
        self.timer = None
        credit = self.rdy - self.in_flight
        if self.transport is not None and self.subscribed and credit > 0:
            self._send(self.transport, credit)

    def _send(self, transport: asyncio.Transport, credit: int) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        size, view = self.server.frame_size, self.server.view
        start = self.position
        stop = start + credit
        if stop <= RING:
            transport.write(view[start * size : stop * size])
        else:
            transport.write(view[start * size :])
            transport.write(view[: (stop - RING) * size])
        self.position = stop % RING
        self.in_flight += credit
        self.totals.sent += credit

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class BlastServer:
    """The server; ``await serve(host, port)`` runs until cancelled."""

    def __init__(self) -> None:
        self.totals = _Totals()
        self.ring, self.frame_size = build_ring()
        self.view = memoryview(self.ring)

    async def serve(self, host: str, port: int, ready: asyncio.Future[int] | None = None) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Client(self), host, port, backlog=128)
        bound = server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set_result(bound)
        print(f"LISTENING {bound}", flush=True)
        async with server:
            await server.serve_forever()


@contextlib.contextmanager
def start_blast_server(host: str = "127.0.0.1") -> Iterator[str]:
    """Run the server in a child process (its own core); yields ``"host:port"``."""
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--host", host, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("LISTENING "):
            raise RuntimeError(f"blast server did not start: {line!r}")
        yield f"{host}:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()


def query_stats(address: str) -> dict[str, int]:
    """Totals of a running blast server (a ``STATS`` control connection)."""
    import socket

    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"STATS\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    result: dict[str, int] = json.loads(data)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4150)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(BlastServer().serve(args.host, args.port))


if __name__ == "__main__":
    main()

"""A hostile nsqd for client tests: it answers the handshake, then ignores RDY and floods.

:class:`FloodingNSQD` listens on loopback and serves each connection on a thread of its own:
it reads the magic and IDENTIFY, answers IDENTIFY with the ``msg_timeout`` it is told to
announce (deflate on when the client asks for it), answers SUB with OK, waits for the first
RDY, and from then on writes messages whatever the client says: ``burst`` messages at a time,
every ``interval`` seconds, ``bursts`` times (None: until the client goes away). What the
client sends is read and ignored, except that its ``NOP`` (the answer to
:meth:`send_heartbeat`) is noticed (``nop_received``). With deflate, every message is
compressed from a fresh dictionary, so a 1 MiB body of zeros costs about a kilobyte on the
wire and nothing to produce.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_MAGIC = b"  V2"
_FRAME_RESPONSE = 0
_FRAME_MESSAGE = 2


def _frame(frame_type: int, data: bytes) -> bytes:
    return struct.pack(">ii", len(data) + 4, frame_type) + data


def _deflated(data: bytes) -> bytes:
    """``data`` as raw deflate, from an empty dictionary and ending on a byte boundary: any
    sequence of these is a valid stream for the client's decompressor."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush(zlib.Z_FULL_FLUSH)


class FloodingNSQD:
    """Loopback nsqd that ignores RDY (see the module docstring); ``with`` starts and stops it.

    ``connections`` counts the clients served, ``messages`` the messages written."""

    def __init__(
        self,
        *,
        msg_timeout_ms: int = 60_000,
        body_size: int = 1 << 20,
        burst: int = 64,
        interval: float = 0.0,
        bursts: int | None = None,
    ) -> None:
        self.msg_timeout_ms = msg_timeout_ms
        self.body_size = body_size
        self.burst = burst
        self.interval = interval
        self.bursts = bursts
        self.nop_received = threading.Event()
        self._plain_socks: list[socket.socket] = []
        self.connections = 0
        self.messages = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        body = b"\0" * body_size
        self._body_plain = body
        self._body_deflated = _deflated(body)

    def __enter__(self) -> FloodingNSQD:
        self._start(self._accept_loop)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        for thread in list(self._threads):
            thread.join(5)
        self._listener.close()

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            self._start(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(5)
            decompressor, pending = self._handshake(sock)
            rdy_seen = threading.Event()
            threading.Thread(
                target=self._read_commands,
                args=(sock, decompressor, pending, rdy_seen),
                daemon=True,
            ).start()
            if decompressor is None:
                with self._lock:
                    self._plain_socks.append(sock)
            rdy_seen.wait(5)  # a careful liar: its first message comes after RDY
            self._flood(sock, deflate=decompressor is not None)
            self._stop.wait()
        except OSError:
            pass  # the client closed the connection: what it should do
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # ends _read_commands's recv too
            sock.close()

    def _read_exactly(self, sock: socket.socket, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = sock.recv(count - len(data))
            if not chunk:
                raise ConnectionResetError("client went away")
            data += chunk
        return data

    def _read_line(self, sock: socket.socket) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            line += self._read_exactly(sock, 1)
        return line

    def _handshake(self, sock: socket.socket) -> tuple[Any, bytes]:
        """IDENTIFY and SUB answered; returns the decompressor of the client's commands (None
        without deflate) and what it decompressed past SUB."""
        assert self._read_exactly(sock, 4) == _MAGIC
        assert self._read_line(sock) == b"IDENTIFY\n"
        (size,) = struct.unpack(">i", self._read_exactly(sock, 4))
        identify = json.loads(self._read_exactly(sock, size))
        deflate = bool(identify.get("deflate"))
        answer = {
            "max_rdy_count": 2500,
            "version": "1.3.0",
            "max_msg_timeout": 900_000,
            "msg_timeout": self.msg_timeout_ms,
            "tls_v1": False,
            "deflate": deflate,
            "deflate_level": 6,
            "max_deflate_level": 6,
            "snappy": False,
            "sample_rate": 0,
            "auth_required": False,
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
        }
        sock.sendall(_frame(_FRAME_RESPONSE, json.dumps(answer).encode()))
        if not deflate:
            assert self._read_line(sock).startswith(b"SUB ")
            sock.sendall(_frame(_FRAME_RESPONSE, b"OK"))
            return None, b""
        # The upgrade's OK comes compressed, as nsqd sends it; then SUB, compressed too, and
        # its OK.
        sock.sendall(_deflated(_frame(_FRAME_RESPONSE, b"OK")))
        decompressor = zlib.decompressobj(-15)
        got = b""
        while b"\n" not in got:
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionResetError("client went away")
            got += decompressor.decompress(chunk)
        line, rest = got.split(b"\n", 1)
        assert line.startswith(b"SUB "), line
        sock.sendall(_deflated(_frame(_FRAME_RESPONSE, b"OK")))
        return decompressor, rest

    def send_heartbeat(self) -> None:
        """A heartbeat on every connection without compression (after its flood)."""
        with self._lock:
            socks = list(self._plain_socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(_frame(_FRAME_RESPONSE, b"_heartbeat_"))

    def _read_commands(
        self, sock: socket.socket, decompressor: Any, buffer: bytes, rdy_seen: threading.Event
    ) -> None:
        """The client's commands: ignored, but its first ``RDY`` and a ``NOP`` noticed."""
        try:
            while True:
                *lines, buffer = buffer.split(b"\n")
                if any(line.startswith(b"RDY ") for line in lines):
                    rdy_seen.set()
                if b"NOP" in lines:
                    self.nop_received.set()
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    continue
                if not chunk:
                    return
                buffer += decompressor.decompress(chunk) if decompressor is not None else chunk
        except (OSError, zlib.error):
            pass

    def _flood(self, sock: socket.socket, deflate: bool) -> None:
        """The bursts; bodies are never copied (this process's memory is what is measured)."""
        sequence = 0
        written = 0
        body = self._body_deflated if deflate else self._body_plain
        while not self._stop.is_set() and (self.bursts is None or written < self.bursts):
            written += 1
            for _ in range(self.burst):
                message_header = struct.pack(">qh", time.time_ns(), 1) + b"%016x" % sequence
                sequence += 1
                size = 4 + len(message_header) + self.body_size
                header = struct.pack(">ii", size, _FRAME_MESSAGE) + message_header
                sock.sendall(_deflated(header) if deflate else header)
                sock.sendall(body)
            with self._lock:
                self.messages += self.burst
            if self.interval:
                self._stop.wait(self.interval)


@contextmanager
def flooding_nsqd(**options: object) -> Iterator[FloodingNSQD]:
    with FloodingNSQD(**options) as server:  # type: ignore[arg-type]
        yield server

"""A misbehaving HTTP server on loopback for the transport edge cases: one thread, one
handler per connection, and a count of the connections accepted."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

Handler = Callable[[socket.socket], None]


class FakeServer:
    """Runs ``handler(conn)`` for each accepted connection on its own thread."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.handler(conn)
        with contextlib.suppress(OSError):
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()
        for thread in self._threads:
            thread.join(5)


@contextlib.contextmanager
def fake_server(handler: Handler) -> Iterator[FakeServer]:
    server = FakeServer(handler)
    try:
        yield server
    finally:
        server.close()


def read_request(conn: socket.socket) -> bytes:
    """Read one request head (the admin client sends no body), b"" at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b""
        data += chunk
    return data


def answer(body: bytes = b"OK", status: str = "200 OK", extra: bytes = b"") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode() + extra + b"\r\n" + body

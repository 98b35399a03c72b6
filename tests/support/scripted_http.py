"""A scripted HTTP server for the HTTP producers' fault tests: it counts the requests it read
and answers each as a script says, including the faults only a server can choose."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import h11

__all__ = ["ScriptedHTTP", "scripted"]


class ScriptedHTTP:
    """An HTTP server that counts the requests it read and answers each as ``script`` says:
    ``"ok"`` (200 OK, kept alive), ``"ok-then-close"`` (200 OK, then closes the connection),
    ``"ok-then-reset"`` (200 OK, then resets the connection), ``"hang"`` (never answers),
    ``"drop"`` (closes the connection without answering: a crash after storing it),
    ``"endless"`` (200 with a chunked body that does not end: 64 MiB, then the connection
    closes)."""

    def __init__(self, script: Callable[[int], str], *, silent: bool = False) -> None:
        self.script = script
        #: Accept connections and never read or answer (a hung server).
        self.silent = silent
        self.requests = 0
        self.sent_bytes = 0
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(10)
        http = h11.Connection(h11.SERVER)
        try:
            if self.silent:
                self._stop.wait(30)  # reads nothing, answers nothing
                return
            while not self._stop.is_set():
                event = http.next_event()
                if event is h11.NEED_DATA:
                    http.receive_data(sock.recv(65536))
                    continue
                if isinstance(event, h11.ConnectionClosed):
                    return
                if not isinstance(event, h11.EndOfMessage):
                    continue
                with self._lock:
                    self.requests += 1
                    action = self.script(self.requests)
                if action == "drop":
                    return
                if action == "hang":
                    self._stop.wait(30)
                    return
                if action == "endless":
                    self._endless(sock)
                    return
                answer = http.send(h11.Response(status_code=200, headers=[("Content-Length", "2")]))
                answer = (answer or b"") + (http.send(h11.Data(data=b"OK")) or b"")
                sock.sendall(answer + (http.send(h11.EndOfMessage()) or b""))
                if action == "ok-then-close":
                    return
                if action == "ok-then-reset":  # close with SO_LINGER 0: a reset, not a FIN
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                http.start_next_cycle()
        except (OSError, h11.RemoteProtocolError):
            pass
        finally:
            sock.close()
            self.closed.set()

    def _endless(self, sock: socket.socket) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
        while not self._stop.is_set() and self.sent_bytes < 64 * 1024 * 1024:
            sock.sendall(chunk)
            self.sent_bytes += len(chunk)

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join(5)  # the accepting thread, before its socket closes
        self.listener.close()
        for thread in self._threads[1:]:
            thread.join(5)


@contextmanager
def scripted(script: Callable[[int], str], *, silent: bool = False) -> Iterator[ScriptedHTTP]:
    server = ScriptedHTTP(script, silent=silent)
    try:
        yield server
    finally:
        server.close()

"""A TCP forwarder that counts the connections made through it: how a test tells one
connection attempt from a reconnect loop, whatever the client and the server are; it can also
hold back what the server writes (answers late, the server still reading and storing)."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["CountingProxy"]


class CountingProxy:
    """Listens on a free loopback port and forwards each connection to ``target``
    (``host:port``); ``accepted`` counts the connections clients made. While :meth:`hold`
    is on, what the server writes is kept from the client until :meth:`release`. Use as a
    context manager (``address`` is what clients dial)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.accepted = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._held = False
        self._gate = threading.Condition()
        self._thread = threading.Thread(target=self._serve, name="counting-proxy", daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closed = True
        self.release()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def hold(self) -> None:
        """Keep what the server writes from now on from the client, until :meth:`release`."""
        with self._gate:
            self._held = True

    def release(self) -> None:
        """Let what the server wrote through."""
        with self._gate:
            self._held = False
            self._gate.notify_all()

    def cut(self) -> None:
        """End every connection made so far (their clients see them lost)."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _serve(self) -> None:
        self._listener.settimeout(0.05)  # checks _closed between accepts
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self.accepted += 1
                self._sockets += [client, server]
            for source, sink, answers in ((client, server, False), (server, client, True)):
                threading.Thread(
                    target=self._pipe, args=(source, sink, answers), daemon=True
                ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if answers:
                    with self._gate:
                        while self._held:
                            self._gate.wait()
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

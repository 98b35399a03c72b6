"""A simulated nsqlookupd: the core's :class:`~nsq_sansio.server.lookupd.Lookupd` for nsqd's
TCP protocol V1, and its HTTP API (over h11) for consumers' lookups.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11

from ...server.lookupd import Lookupd, LookupdAPIError, LookupdOptions
from ..network import SimConn
from .base import SimNode, World

__all__ = ["LookupdNode"]


class LookupdNode(SimNode):
    """An nsqlookupd: TCP V1 for nsqd (the core's :class:`Lookupd`) and HTTP for consumers."""

    def __init__(self, sim: World, name: str, options: LookupdOptions) -> None:
        super().__init__(sim, name)
        self.options = options
        self.ports = {options.tcp_port, options.http_port}
        self.lookupd = Lookupd(options)
        self.tcp: dict[int, int] = {}  # SimConn.id -> handle
        self.http: dict[int, h11.Connection] = {}
        self.targets: dict[int, str] = {}  # SimConn.id -> target of the request being read
        self.http_requests = 0

    @property
    def http_address(self) -> str:
        """The HTTP address consumers query (``http://name:port``)."""
        return f"http://{self.name}:{self.options.http_port}"

    @property
    def tcp_address(self) -> str:
        """The TCP address nsqd register at (``name:port``)."""
        return f"{self.name}:{self.options.tcp_port}"

    def on_accept(self, conn: SimConn, now: float) -> None:
        """An nsqd (TCP port) or a consumer's HTTP request (HTTP port) connected."""
        if conn.port == self.options.tcp_port:
            self.tcp[conn.id] = self.lookupd.connect(f"{conn.client.name}:{conn.id}", now)
        else:
            self.http[conn.id] = h11.Connection(h11.SERVER)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        """Bytes from an nsqd's registration connection or from an HTTP client: answered
        by the sans-IO lookupd."""
        handle = self.tcp.get(conn.id)
        if handle is not None:
            events = self.lookupd.receive_data(handle, data, now)
            self.sim.net.send(conn, self, self.lookupd.data_to_send(handle))
            if any(type(e).__name__ == "ClientClosed" for e in events):
                self.sim.net.close(conn, self)
                self.lookupd.release(handle)
                del self.tcp[conn.id]
            return
        server = self.http.get(conn.id)
        if server is None:
            return
        server.receive_data(data)
        self._serve_http(conn, server, now)

    def _serve_http(self, conn: SimConn, server: h11.Connection, now: float) -> None:
        while True:
            try:
                event = server.next_event()
            except h11.RemoteProtocolError:
                self._close_http(conn)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.ConnectionClosed):
                self._close_http(conn)
                return
            if isinstance(event, h11.Request):
                self.targets[conn.id] = event.target.decode()
            elif isinstance(event, h11.EndOfMessage):
                self.http_requests += 1
                self.sim.monitor.on_lookup_request(self.name, conn.client.name, now)
                status, body = self.answer(self.targets.pop(conn.id, "/"), now)
                out = (
                    server.send(
                        h11.Response(
                            status_code=status,
                            headers=[
                                ("Content-Type", "application/json"),
                                ("Content-Length", str(len(body))),
                            ],
                        )
                    )
                    or b""
                )
                out += server.send(h11.Data(data=body)) or b""
                out += server.send(h11.EndOfMessage()) or b""
                self.sim.net.send(conn, self, out)
                if server.our_state is h11.MUST_CLOSE:
                    self._close_http(conn)
                    return
                server.start_next_cycle()
        return

    def answer(self, target: str, now: float) -> tuple[int, bytes]:
        """The HTTP API answers the simulator needs (``/lookup``, ``/nodes``, ``/ping``)."""
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        topic = query.get("topic", [None])[0]
        try:
            if parts.path.endswith("/lookup"):
                result: Any = self.lookupd.lookup(topic, now)
            elif parts.path.endswith("/nodes"):
                result = self.lookupd.nodes(now)
            elif parts.path.endswith("/ping"):
                return 200, b"OK"
            else:
                return 404, b'{"message":"NOT_FOUND"}'
        except LookupdAPIError as err:
            return err.status, json.dumps({"message": err.message}).encode()
        return 200, json.dumps(result).encode()

    def _close_http(self, conn: SimConn) -> None:
        self.http.pop(conn.id, None)
        self.targets.pop(conn.id, None)
        self.sim.net.close(conn, self)

    def on_eof(self, conn: SimConn, now: float) -> None:
        """A peer closed: an nsqd's registrations go with its connection."""
        handle = self.tcp.pop(conn.id, None)
        if handle is not None:
            self.lookupd.connection_lost(handle, now)
        self.http.pop(conn.id, None)
        self.sim.net.close(conn, self)

    def crash(self, now: float) -> None:
        """Kill lookupd: every connection breaks and its registrations are forgotten."""
        if self.alive:
            self.sim.net.crash_node(self)
            self.alive = False
            self.tcp.clear()
            self.http.clear()

    def restart(self, now: float) -> None:
        """Bring a crashed lookupd back, empty: nsqd re-register as they reconnect."""
        if not self.alive:
            self.alive = True
            self.lookupd = Lookupd(self.options)

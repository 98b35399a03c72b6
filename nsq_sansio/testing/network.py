"""A simulated network: connections that carry bytes between simulated nodes.

Every connection is two FIFO byte pipes. A pipe never reorders (TCP), but different
connections have different latencies (drawn per connection, plus per-send jitter clamped so the
pipe stays FIFO), so bytes on different connections do arrive out of order. Bandwidth is per
pipe. Faults:

* :meth:`Network.drop` resets a connection: bytes in transit are lost and both ends see EOF.
* :meth:`Network.partition` splits nodes into groups: bytes between groups are held (TCP keeps
  retransmitting) and delivered when :meth:`Network.heal` is called, if the connection still
  exists; new connections across a partition time out.
* :meth:`Network.crash_node` resets every connection of a node; its peers see EOF.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from .clock import Scheduler

__all__ = ["ConnState", "Endpoint", "LinkSpec", "Network", "PipeObserver", "SimConn"]

#: Direction of a pipe: from the side that connected (client) or from the side that accepted.
CLIENT_TO_SERVER = 0
SERVER_TO_CLIENT = 1


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """How every connection behaves: one-way ``latency`` in seconds plus a random ``jitter``
    (drawn per connection and per send, never reordering a pipe), ``bandwidth`` in bytes per
    second (``None``: unlimited), how long a connect across a partition takes to fail, and
    ``segment``: when set, a write arrives in pieces of at most that many bytes (each read
    separately, as TCP may split it), so every parser sees frames cut anywhere."""

    latency: float = 0.0005
    jitter: float = 0.0005
    bandwidth: float | None = None
    connect_timeout: float = 2.0
    segment: int | None = None


class ConnState(enum.Enum):
    CONNECTING = "connecting"
    OPEN = "open"
    CLOSED = "closed"


class Endpoint(Protocol):
    """A node as the network and the simulator's clock see it
    (:class:`~nsq_sansio.testing.nodes.SimNode` is one)."""

    name: str
    ports: set[int]
    alive: bool
    timer_token: int  # the simulator's timer for this node: only the latest one fires
    timer_at: float | None

    def next_deadline(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...

    def on_accept(self, conn: SimConn, now: float) -> None: ...

    def on_connected(self, conn: SimConn, now: float) -> None: ...

    def on_connect_failed(self, conn: SimConn, now: float) -> None: ...

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None: ...

    def on_eof(self, conn: SimConn, now: float) -> None: ...


class PipeObserver(Protocol):
    """Sees bytes as a node writes them (``sent``) and as the peer reads them (``delivered``)."""

    def sent(self, direction: int, data: bytes, now: float) -> None: ...

    def delivered(self, direction: int, data: bytes, now: float) -> None: ...

    def closed(self, now: float) -> None: ...


class SimConn:
    """One simulated TCP connection between ``client`` (it connected) and ``server``."""

    __slots__ = (
        "address",
        "client",
        "held",
        "id",
        "last_arrival",
        "latency",
        "observers",
        "open_ends",
        "port",
        "server",
        "state",
        "tx_free",
    )

    def __init__(
        self,
        conn_id: int,
        client: Endpoint,
        server: Endpoint | None,
        address: str,
        port: int,
        latency: float,
    ) -> None:
        self.id = conn_id
        self.client = client
        self.server = server
        self.address = address
        self.port = port
        self.state = ConnState.CONNECTING
        self.latency = latency
        self.last_arrival = [0.0, 0.0]
        self.tx_free = [0.0, 0.0]
        self.open_ends = [True, True]
        #: Bytes (or EOF as ``None``) waiting for a partition to heal, in order.
        self.held: list[tuple[int, bytes | None]] = []
        self.observers: list[PipeObserver] = []

    def side_of(self, node: Endpoint) -> int:
        """The direction ``node`` writes in."""
        return CLIENT_TO_SERVER if node is self.client else SERVER_TO_CLIENT

    def peer_of(self, node: Endpoint) -> Endpoint | None:
        """The other end of this connection from ``node`` (None if ``node`` is neither)."""
        return self.server if node is self.client else self.client

    def __repr__(self) -> str:
        server = self.server.name if self.server is not None else "?"
        return f"<SimConn {self.id} {self.client.name}->{server}:{self.port} {self.state.name}>"


class Network:
    """Connections, latency, partitions and resets; everything runs on the :class:`Scheduler`."""

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, link: LinkSpec | None = None
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.link = link or LinkSpec()
        self.nodes: dict[str, Endpoint] = {}
        self.conns: dict[int, SimConn] = {}
        self._next_id = 1
        #: Active partitions: id -> node name -> group index.
        self._cuts: dict[int, dict[str, int]] = {}
        self._next_cut = 1
        #: Bytes carried (written by nodes), for benchmarks.
        self.bytes_sent = 0
        #: Called after every callback into a node (the simulator re-arms its timer there).
        self.after: Callable[[Endpoint], None] = _nothing
        self.observer_factories: list[Callable[[SimConn], PipeObserver | None]] = []
        #: Resets a partition keeps from a peer until it heals: (dead node, conn, peer).
        self._pending_resets: list[tuple[str, SimConn, Endpoint]] = []

    # -- topology -------------------------------------------------------------------------------

    def add_node(self, node: Endpoint) -> None:
        """Attach an endpoint under its unique name (a duplicate is a ValueError)."""
        if node.name in self.nodes:
            raise ValueError(f"duplicate node name {node.name!r}")
        self.nodes[node.name] = node

    def reachable(self, a: str, b: str) -> bool:
        """No active partition separates nodes ``a`` and ``b``."""
        for mapping in self._cuts.values():
            ga = mapping.get(a)
            gb = mapping.get(b)
            if ga is not None and gb is not None and ga != gb:
                return False
        return True

    @property
    def partitioned(self) -> bool:
        """Whether any partition is in force right now."""
        return bool(self._cuts)

    def partition(self, groups: Iterable[Iterable[str]]) -> int:
        """Split the listed node groups from each other (unlisted nodes reach everyone);
        returns the partition's id for :meth:`heal`. Partitions add up: two nodes talk only
        when no active partition separates them."""
        mapping: dict[str, int] = {}
        for index, names in enumerate(groups):
            for name in names:
                if name not in self.nodes:
                    raise ValueError(f"unknown node {name!r} in partition")
                mapping[name] = index
        cut = self._next_cut
        self._next_cut += 1
        self._cuts[cut] = mapping
        return cut

    def heal(self, cut: int | None = None) -> None:
        """End partition ``cut`` (every partition when None); bytes it held are sent on, in
        order, on connections no other partition still cuts."""
        if cut is None:
            self._cuts.clear()
        else:
            self._cuts.pop(cut, None)
        now = self.scheduler.now
        resets, self._pending_resets = self._pending_resets, []
        for dead, conn, peer in resets:
            if self.reachable(dead, peer.name):
                self.scheduler.call_at(now + conn.latency, self._reset_notice, (conn, peer))
            else:
                self._pending_resets.append((dead, conn, peer))
        for conn in list(self.conns.values()):
            if (
                conn.held
                and conn.server is not None
                and self.reachable(conn.client.name, conn.server.name)
            ):
                held, conn.held = conn.held, []
                for direction, data in held:
                    self._transmit(conn, direction, data)

    # -- connections ----------------------------------------------------------------------------

    def connect(self, client: Endpoint, address: str) -> SimConn:
        """Start connecting to ``host:port``; the client hears ``on_connected`` or
        ``on_connect_failed`` later."""
        host, _, port_text = address.rpartition(":")
        port = int(port_text) if port_text.isdigit() else -1
        server = self.nodes.get(host)
        link = self.link
        latency = link.latency + self.rng.random() * link.jitter
        conn = SimConn(self._next_id, client, server, address, port, latency)
        self._next_id += 1
        self.conns[conn.id] = conn
        if server is None or not server.alive or port not in server.ports:
            self.scheduler.call_at(self.scheduler.now + 2 * latency, self._refused, conn)
        elif not self.reachable(client.name, server.name):
            self.scheduler.call_at(self.scheduler.now + link.connect_timeout, self._refused, conn)
        else:
            self.scheduler.call_at(self.scheduler.now + latency, self._accept, conn)
        return conn

    def _refused(self, conn: SimConn) -> None:
        if conn.state is not ConnState.CONNECTING:
            return
        conn.state = ConnState.CLOSED
        del self.conns[conn.id]
        if conn.client.alive:
            conn.client.on_connect_failed(conn, self.scheduler.now)
            self.after(conn.client)

    def _accept(self, conn: SimConn) -> None:
        server = conn.server
        assert server is not None
        if conn.state is not ConnState.CONNECTING:
            return
        if not server.alive or conn.port not in server.ports or not conn.client.alive:
            self._refused(conn)
            return
        conn.state = ConnState.OPEN
        for factory in self.observer_factories:
            observer = factory(conn)
            if observer is not None:
                conn.observers.append(observer)
        now = self.scheduler.now
        conn.last_arrival[SERVER_TO_CLIENT] = now + conn.latency
        self.scheduler.call_at(now + conn.latency, self._connected, conn)
        server.on_accept(conn, now)
        self.after(server)

    def _connected(self, conn: SimConn) -> None:
        if conn.state is ConnState.OPEN and conn.open_ends[CLIENT_TO_SERVER]:
            conn.client.on_connected(conn, self.scheduler.now)
            self.after(conn.client)

    def send(self, conn: SimConn, node: Endpoint, data: bytes) -> None:
        """``node`` writes ``data`` on ``conn`` (ignored when its side is closed)."""
        if not data:
            return
        direction = conn.side_of(node)
        if conn.state is not ConnState.OPEN or not conn.open_ends[direction]:
            return
        self.bytes_sent += len(data)
        now = self.scheduler.now
        for observer in conn.observers:
            observer.sent(direction, data, now)
        self._transmit(conn, direction, data)

    def close(self, conn: SimConn, node: Endpoint) -> None:
        """``node`` closes its side: the peer reads EOF after the bytes already sent."""
        direction = conn.side_of(node)
        if conn.state is ConnState.CONNECTING:
            conn.state = ConnState.CLOSED
            self.conns.pop(conn.id, None)
            return
        if conn.state is ConnState.CLOSED or not conn.open_ends[direction]:
            return
        conn.open_ends[direction] = False
        self._transmit(conn, direction, None)
        if not any(conn.open_ends):
            self._finish(conn)

    def drop(self, conn: SimConn) -> None:
        """Reset the connection (a fault): bytes in transit are lost, both ends read EOF."""
        if conn.state is ConnState.CONNECTING:
            self._refused(conn)
            return
        if conn.state is ConnState.CLOSED:
            return
        ends = list(conn.open_ends)
        self._finish(conn)
        now = self.scheduler.now
        for direction, node in ((CLIENT_TO_SERVER, conn.client), (SERVER_TO_CLIENT, conn.server)):
            if ends[direction] and node is not None:
                self.scheduler.call_at(now + conn.latency, self._reset_notice, (conn, node))

    def crash_node(self, node: Endpoint) -> None:
        """``node`` died: its connections are reset; peers read EOF when reachable (at once)
        or when the partition between them heals."""
        now = self.scheduler.now
        for conn in [c for c in self.conns.values() if c.client is node or c.server is node]:
            if conn.state is ConnState.CONNECTING:
                conn.state = ConnState.CLOSED
                del self.conns[conn.id]
                if conn.client is not node and conn.client.alive:
                    self.scheduler.call_at(now + 2 * conn.latency, self._fail_notice, conn)
                continue
            peer = conn.peer_of(node)
            peer_direction = conn.side_of(peer) if peer is not None else 0
            peer_open = peer is not None and conn.open_ends[peer_direction]
            self._finish(conn)
            if peer is None or not peer_open:
                continue
            if self.reachable(node.name, peer.name):
                self.scheduler.call_at(now + conn.latency, self._reset_notice, (conn, peer))
            else:
                self._pending_resets.append((node.name, conn, peer))

    def _fail_notice(self, conn: SimConn) -> None:
        if conn.client.alive:
            conn.client.on_connect_failed(conn, self.scheduler.now)
            self.after(conn.client)

    def _reset_notice(self, item: tuple[SimConn, Endpoint]) -> None:
        conn, node = item
        if node.alive:
            node.on_eof(conn, self.scheduler.now)
            self.after(node)

    def _finish(self, conn: SimConn) -> None:
        if conn.state is not ConnState.CLOSED:
            conn.state = ConnState.CLOSED
            conn.open_ends = [False, False]
            conn.held = []
            self.conns.pop(conn.id, None)
            now = self.scheduler.now
            for observer in conn.observers:
                observer.closed(now)

    def _transmit(self, conn: SimConn, direction: int, data: bytes | None) -> None:
        source = conn.client if direction == CLIENT_TO_SERVER else conn.server
        target = conn.server if direction == CLIENT_TO_SERVER else conn.client
        assert source is not None and target is not None
        if conn.held or (self._cuts and not self.reachable(source.name, target.name)):
            conn.held.append((direction, data))  # behind bytes already held: FIFO
            return
        now = self.scheduler.now
        link = self.link
        start = now
        if link.bandwidth is not None and data:
            start = max(now, conn.tx_free[direction]) + len(data) / link.bandwidth
            conn.tx_free[direction] = start
        arrival = start + conn.latency
        if link.jitter:
            arrival += self.rng.random() * link.jitter
        if arrival < conn.last_arrival[direction]:
            arrival = conn.last_arrival[direction]
        conn.last_arrival[direction] = arrival
        segment = link.segment
        if segment is not None and data is not None and len(data) > segment:
            for offset in range(0, len(data), segment):
                piece = data[offset : offset + segment]
                self.scheduler.call_at(arrival, self._deliver, (conn, direction, piece))
            return
        self.scheduler.call_at(arrival, self._deliver, (conn, direction, data))

    def _deliver(self, item: tuple[SimConn, int, bytes | None]) -> None:
        conn, direction, data = item
        if conn.state is not ConnState.OPEN or not conn.open_ends[1 - direction]:
            return  # reset, or the reader closed its side already and does not care
        target = conn.server if direction == CLIENT_TO_SERVER else conn.client
        if target is None or not target.alive:
            return
        now = self.scheduler.now
        if data is None:
            target.on_eof(conn, now)
        else:
            for observer in conn.observers:
                observer.delivered(direction, data, now)
            target.on_data(conn, data, now)
        self.after(target)


def _nothing(node: Endpoint) -> None:
    return None

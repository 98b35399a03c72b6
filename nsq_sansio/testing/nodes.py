"""Simulated nodes: the core's state machines (nsqd, nsqlookupd, consumer, producer) driven
exactly as a transport would drive them, but over the simulated network and clock."""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import h11

from ..config import Config
from ..connection import ClientConnection
from ..consumer import (
    CloseConnection,
    CloseHTTPRequest,
    Connect,
    ConsumerCoordinator,
    ConsumerState,
    Deliver,
    DrainComplete,
    GiveUp,
    SendHTTPRequest,
    StartTLS,
    TakenBack,
)
from ..errors import NSQError
from ..events import ConnectionClosed, ConnectionReady, PublishAcknowledged, PublishFailed
from ..pull import FetchEnd, FetchResult
from ..server.backend import Backend, decode_record
from ..server.events import ChannelCreated, ChannelDeleted, ServerEvent, TopicCreated
from ..server.events import CloseConnection as ServerClose
from ..server.events import StartTLS as ServerStartTLS
from ..server.lookupd import Lookupd, LookupdAPIError, LookupdOptions
from ..server.lookupd_client import (
    LookupPeer,
    LookupPeerClosed,
    NodeIdentity,
    sync_registrations,
)
from ..server.nsqd import NSQD
from ..server.options import NSQDOptions
from .invariants import Invariant
from .network import ConnState, SimConn

if TYPE_CHECKING:
    from .simulator import Simulator

__all__ = [
    "HANG",
    "ConsumerNode",
    "Handler",
    "LookupdNode",
    "NsqdNode",
    "ProducerNode",
    "SimDisk",
    "SimNode",
]


class SimNode:
    """Base of every simulated node: a host name, listening ports, liveness and callbacks."""

    def __init__(self, sim: Simulator, name: str) -> None:
        self.sim = sim
        self.name = name
        self.ports: set[int] = set()
        self.alive = True
        self.timer_token = 0
        self.timer_at: float | None = None

    # network callbacks (overridden)
    def on_accept(self, conn: SimConn, now: float) -> None:
        raise NotImplementedError

    def on_connected(self, conn: SimConn, now: float) -> None:
        raise NotImplementedError

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        raise NotImplementedError

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        raise NotImplementedError

    def on_eof(self, conn: SimConn, now: float) -> None:
        raise NotImplementedError

    def next_deadline(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        """Timers due at ``now``."""

    def check(self, now: float) -> None:
        """Per-step invariant hooks (overridden)."""


# --- storage that survives a crash --------------------------------------------------------------


class _DiskQueue:
    """A backend whose records live in a :class:`SimDisk` (so they survive the process)."""

    __slots__ = ("_records",)

    def __init__(self, records: deque[bytes]) -> None:
        self._records = records

    @property
    def depth(self) -> int:
        return len(self._records)

    def put(self, data: bytes) -> None:
        self._records.append(data)

    def get(self) -> bytes | None:
        return self._records.popleft() if self._records else None

    def empty(self) -> None:
        self._records.clear()

    def close(self) -> None:
        """Records stay on the simulated disk."""

    def delete(self) -> None:
        self._records.clear()


class SimDisk:
    """An nsqd's simulated disk: backend queues by name plus ``nsqd.dat`` metadata.

    With ``durable=False`` a crash wipes it (the backends were only memory).
    """

    def __init__(self, durable: bool) -> None:
        self.durable = durable
        self.queues: dict[str, deque[bytes]] = {}
        self.metadata: dict[str, Any] | None = None

    def factory(self, name: str) -> Backend:
        return _DiskQueue(self.queues.setdefault(name, deque()))

    def bodies(self) -> dict[str, set[bytes]]:
        """Bodies of the records on disk, by queue (``topic`` or ``topic:channel``)."""
        found: dict[str, set[bytes]] = {}
        for name, records in self.queues.items():
            bodies = found.setdefault(name, set())
            for data in records:
                record = decode_record(data)
                if record is not None:
                    bodies.add(record.body)
        return found

    def lose_volatile(self) -> None:
        if not self.durable:
            self.queues.clear()
            self.metadata = None


# --- nsqd -------------------------------------------------------------------------------------


class NsqdNode(SimNode):
    """An nsqd (the core's :class:`NSQD`) plus one :class:`LookupPeer` per lookupd."""

    def __init__(
        self,
        sim: Simulator,
        name: str,
        options: NSQDOptions,
        lookupds: list[str],
        *,
        durable: bool,
        seed: int,
    ) -> None:
        super().__init__(sim, name)
        self.options = options
        self.ports = {options.tcp_port}
        self.disk = SimDisk(durable)
        self.lookupd_addresses = lookupds
        self.seed = seed
        self.restarts = 0
        self.nsqd: NSQD = self._new_nsqd(sim.now)
        self.by_conn: dict[int, int] = {}  # SimConn.id -> nsqd connection id
        self.conns: dict[int, SimConn] = {}  # nsqd connection id -> SimConn
        self.peers: list[LookupPeer] = []
        self.peer_conns: dict[int, SimConn] = {}  # index in peers -> SimConn
        self._make_peers()

    def _new_nsqd(self, now: float) -> NSQD:
        rng = random.Random(self.seed * 1000 + self.restarts)
        node = NSQD(self.options, rng, backend_factory=self.disk.factory, now=now)
        if self.disk.metadata is not None:
            node.load_metadata(self.disk.metadata, now)
        return node

    def _make_peers(self) -> None:
        identity = NodeIdentity(
            self.name,
            self.options.tcp_port,
            self.options.http_port,
            self.name,
            self.options.version,
        )
        rng = random.Random(self.seed * 7919 + self.restarts)
        self.peers = [
            LookupPeer(address, identity, ping_interval=self.sim.spec.lookup_ping_interval, rng=rng)
            for address in self.lookupd_addresses
        ]
        self.peer_conns = {}

    @property
    def address(self) -> str:
        return f"{self.name}:{self.options.tcp_port}"

    # admin (the HTTP API, called directly)
    def publish(self, topic: str, bodies: list[bytes], now: float) -> bool:
        if not self.alive:
            return False
        try:
            if len(bodies) == 1:
                self.nsqd.publish(topic, bodies[0], now)
            else:
                self.nsqd.multi_publish(topic, bodies, now)
        except NSQError:
            return False
        self.sim.monitor.on_accepted(self.name, topic, bodies, now)
        self._flush(now)
        return True

    def create_channel(self, topic: str, channel: str, now: float) -> None:
        self.nsqd.create_channel(topic, channel, now)
        self._flush(now)

    # network
    def on_accept(self, conn: SimConn, now: float) -> None:
        cid = self.nsqd.connect(now, f"{conn.client.name}:{conn.id}")
        self.by_conn[conn.id] = cid
        self.conns[cid] = conn
        self._flush(now)

    def on_connected(self, conn: SimConn, now: float) -> None:
        for index, peer_conn in self.peer_conns.items():
            if peer_conn is conn:
                peer = self.peers[index]
                regs = sync_registrations(
                    (t, self.nsqd.channel_names(t)) for t in self.nsqd.topic_names()
                )
                peer.connection_made(now, regs)
                self._flush(now)
                return

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        for index, peer_conn in list(self.peer_conns.items()):
            if peer_conn is conn:
                del self.peer_conns[index]
                self.peers[index].connection_failed(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        cid = self.by_conn.get(conn.id)
        if cid is not None:
            self._events(self.nsqd.receive_data(cid, data, now), now)
            self._flush(now)
            return
        for index, peer_conn in list(self.peer_conns.items()):
            if peer_conn is conn:
                for event in self.peers[index].receive_data(data, now):
                    if isinstance(event, LookupPeerClosed):
                        self.sim.net.close(conn, self)
                        del self.peer_conns[index]
                self._flush(now)
                return

    def on_eof(self, conn: SimConn, now: float) -> None:
        cid = self.by_conn.pop(conn.id, None)
        if cid is not None:
            self.conns.pop(cid, None)
            self._events(self.nsqd.receive_data(cid, b"", now), now, lost=True)
            self.nsqd.connection_lost(cid, now)
            self.sim.net.close(conn, self)
            self._flush(now)
            return
        for index, peer_conn in list(self.peer_conns.items()):
            if peer_conn is conn:
                del self.peer_conns[index]
                self.sim.net.close(conn, self)
                self.peers[index].connection_lost(now)

    def _events(self, events: list[ServerEvent], now: float, lost: bool = False) -> None:
        for event in events:
            if isinstance(event, ServerClose):
                conn = self.conns.pop(event.conn_id, None)
                if conn is None:
                    continue
                self.sim.net.send(conn, self, self.nsqd.data_to_send(event.conn_id))
                self.by_conn.pop(conn.id, None)
                self.nsqd.connection_lost(event.conn_id, now)
                self.sim.net.close(conn, self)
            elif isinstance(event, ServerStartTLS):  # pragma: no cover - no TLS in the sim
                raise NSQError("the simulator does not run TLS")

    def _flush(self, now: float) -> None:
        nsqd = self.nsqd
        net = self.sim.net
        # taking a connection's output may release more deliveries to it (nsqd's output
        # back-pressure): take until nothing is left
        for _ in range(100):
            ready = nsqd.connections_with_output()
            if not ready:
                break
            for cid in ready:
                conn = self.conns.get(cid)
                data = nsqd.data_to_send(cid, now)
                if conn is not None and data:
                    net.send(conn, self, data)
        registry = nsqd.take_registry_events()
        if registry:
            self.disk.metadata = nsqd.metadata()
            for event in registry:
                channel = (
                    event.channel if isinstance(event, (ChannelCreated, ChannelDeleted)) else None
                )
                for peer in self.peers:
                    if isinstance(event, (TopicCreated, ChannelCreated)):
                        peer.register(now, event.topic, channel)
                    else:
                        peer.unregister(now, event.topic, channel)
        for index, peer_conn in self.peer_conns.items():
            data = self.peers[index].data_to_send()
            if data:
                net.send(peer_conn, self, data)

    def next_deadline(self) -> float | None:
        best = self.nsqd.next_deadline()
        for peer in self.peers:
            deadline = peer.next_deadline()
            if deadline is not None and (best is None or deadline < best):
                best = deadline
        return best

    def handle_timer(self, now: float) -> None:
        self._events(self.nsqd.handle_timer(now), now)
        for index, peer in enumerate(self.peers):
            if index not in self.peer_conns and peer.wants_connect(now):
                self.peer_conns[index] = self.sim.net.connect(self, peer.address)
                # not connected yet: keep it from asking again until connected or failed
                continue
            for event in peer.handle_timer(now):
                if isinstance(event, LookupPeerClosed) and index in self.peer_conns:
                    self.sim.net.close(self.peer_conns.pop(index), self)
        self._flush(now)

    def crash(self, now: float, clean: bool = False) -> None:
        """Stop the process: ``clean`` is a graceful shutdown (everything written to the
        backends), otherwise a kill (memory, in-flight and deferred messages are lost, and the
        backends too unless durable)."""
        if not self.alive:
            return
        if clean:
            self.nsqd.close(now)
            self.disk.metadata = self.nsqd.metadata()
        self.sim.net.crash_node(self)
        self.alive = False
        self.by_conn.clear()
        self.conns.clear()
        if not clean:
            self.disk.lose_volatile()
        self.sim.monitor.on_nsqd_down(self.name, self.disk.bodies(), now)

    def restart(self, now: float) -> None:
        if self.alive:
            return
        self.restarts += 1
        self.alive = True
        self.nsqd = self._new_nsqd(now)
        self._make_peers()
        self.restart_topics(now)

    def restart_topics(self, now: float) -> None:
        """Create the cluster's topic and channels (so nothing published is lost for want of
        a channel), as an operator's provisioning would."""
        for topic, channels in self.sim.spec.topics_channels():
            self.nsqd.create_topic(topic, now)
            for channel in channels:
                self.nsqd.create_channel(topic, channel, now)
        self._flush(now)


# --- nsqlookupd -------------------------------------------------------------------------------


class LookupdNode(SimNode):
    """An nsqlookupd: TCP V1 for nsqd (the core's :class:`Lookupd`) and HTTP for consumers."""

    def __init__(self, sim: Simulator, name: str, options: LookupdOptions) -> None:
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
        return f"http://{self.name}:{self.options.http_port}"

    @property
    def tcp_address(self) -> str:
        return f"{self.name}:{self.options.tcp_port}"

    def on_accept(self, conn: SimConn, now: float) -> None:
        if conn.port == self.options.tcp_port:
            self.tcp[conn.id] = self.lookupd.connect(f"{conn.client.name}:{conn.id}", now)
        else:
            self.http[conn.id] = h11.Connection(h11.SERVER)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
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
        handle = self.tcp.pop(conn.id, None)
        if handle is not None:
            self.lookupd.connection_lost(handle, now)
        self.http.pop(conn.id, None)
        self.sim.net.close(conn, self)

    def crash(self, now: float) -> None:
        if self.alive:
            self.sim.net.crash_node(self)
            self.alive = False
            self.tcp.clear()
            self.http.clear()

    def restart(self, now: float) -> None:
        if not self.alive:
            self.alive = True
            self.lookupd = Lookupd(self.options)


# --- user handlers ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handler:
    """A user handler as a plain function plus simulated timing and failures.

    ``fn(body)`` is the user's own logic, called when the simulated work ends; raising makes the
    message fail (REQ). ``duration`` (seconds, or a function of the delivery) and ``jitter``
    (a random extra up to that) give the time it takes; ``failure_rate`` fails that share of
    messages at random; ``keepalive`` TOUCHes the message while the job runs (up to the server's
    max_msg_timeout). ``requeue_delay``/``backoff`` are passed to ``requeue``.
    """

    fn: Callable[[bytes], object] | None = None
    duration: float | Callable[[Deliver], float] = 0.001
    jitter: float = 0.0
    failure_rate: float = 0.0
    keepalive: bool = False
    requeue_delay: float | None = None
    backoff: bool = True
    hang_rate: float = 0.0
    #: Jobs run at once; more deliveries wait in a local buffer, not yet in user code (a drain
    #: requeues those at once). ``None``: every delivery starts at once.
    concurrency: int | None = None

    def decide(self, delivery: Deliver, rng: random.Random) -> tuple[float, bool]:
        """(duration, hang) for one delivery; the outcome is decided when the work ends."""
        base = self.duration(delivery) if callable(self.duration) else self.duration
        if self.jitter:
            base += rng.random() * self.jitter
        hang = self.hang_rate > 0 and rng.random() < self.hang_rate
        return base, hang

    def outcome(self, delivery: Deliver, rng: random.Random) -> bool | None:
        """True to FIN, False to REQ, None to never answer (``fn`` returned :data:`HANG`)."""
        if self.failure_rate and rng.random() < self.failure_rate:
            return False
        if self.fn is not None:
            try:
                if self.fn(delivery.body) is HANG:
                    return None
            except Exception:
                return False
        return True


#: What a handler function returns to simulate a worker stuck on the message forever.
HANG = object()


@dataclass(slots=True)
class _Job:
    delivery: Deliver
    done_at: float
    cancelled: bool = False


# --- consumer ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ConsumerStats:
    delivered: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    taken_back: int = 0
    touches: int = 0
    lookup_polls: list[float] = field(default_factory=list)


class ConsumerNode(SimNode):
    """A consumer: the core's :class:`ConsumerCoordinator` with a simulated user handler."""

    def __init__(
        self,
        sim: Simulator,
        name: str,
        topic: str,
        channel: str,
        config: Config,
        handler: Handler,
        *,
        nsqd: Iterable[str] = (),
        lookupd: Iterable[str] = (),
        seed: int = 0,
        pull: bool = False,
        fetch_batch: int = 10,
    ) -> None:
        super().__init__(sim, name)
        self.topic = topic
        self.channel = channel
        self.config = config
        self.handler = handler
        self.nsqd_addresses = list(nsqd)
        self.lookupd_addresses = list(lookupd)
        self.rng = random.Random(seed)
        self.pull = pull
        self.fetch_batch = fetch_batch
        self.fetching = False
        self.coord = ConsumerCoordinator(
            topic,
            channel,
            config,
            rng=self.rng,
            nsqd=self.nsqd_addresses,
            lookupd=self.lookupd_addresses,
            pull=pull,
        )
        self.started = False
        self.drained_at: float | None = None
        self.drain_started_at: float | None = None
        self.stats = ConsumerStats()
        self.conn_of: dict[int, SimConn] = {}  # coordinator conn id -> SimConn
        self.coord_id: dict[int, int] = {}  # SimConn.id -> coordinator conn id
        self.http_of: dict[int, SimConn] = {}  # request id -> SimConn
        self.http_req: dict[int, tuple[int, bytes]] = {}  # SimConn.id -> (request id, data)
        self.jobs: dict[bytes, _Job] = {}
        self.waiting: deque[Deliver] = deque()

    def start(self, now: float) -> None:
        self.started = True
        self.coord.start(now)
        self._fetch_more(now)
        self._pump(now)

    def _fetch_more(self, now: float) -> None:
        """Pull mode: ask for the next batch once the last one is handled (a fetch loop)."""
        if (
            not self.pull
            or self.fetching
            or self.jobs
            or self.waiting
            or self.coord.state is not ConsumerState.RUNNING
        ):
            return
        self.fetching = True
        self.coord.fetch(self.fetch_batch, now, expires=2.0)

    def drain(self, now: float, timeout: float | None = None) -> None:
        self.drain_started_at = now
        self.sim.monitor.on_drain_started(self.name, now)
        self.coord.drain(now, timeout)
        self._pump(now)

    def kill(self, now: float) -> None:
        """The consumer process dies at once (no drain): nsqd sees its connections reset."""
        if not self.alive:
            return
        self.sim.monitor.on_consumer_killed(self.name, now)
        self.sim.net.crash_node(self)
        self.alive = False
        for job in self.jobs.values():
            job.cancelled = True
        self.jobs.clear()
        self.waiting.clear()

    # network
    def on_accept(self, conn: SimConn, now: float) -> None:  # pragma: no cover - never listens
        self.sim.net.close(conn, self)

    def on_connected(self, conn: SimConn, now: float) -> None:
        cid = self.coord_id.get(conn.id)
        if cid is not None:
            self.coord.connection_made(cid, now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.sim.net.send(conn, self, request[1])
        self._pump(now)

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        cid = self.coord_id.pop(conn.id, None)
        if cid is not None:
            self.conn_of.pop(cid, None)
            self.coord.connection_failed(cid, "connection refused or timed out", now)
        else:
            request = self.http_req.pop(conn.id, None)
            if request is not None:
                self.http_of.pop(request[0], None)
                self.coord.http_failed(request[0], "connection refused or timed out", now)
        self._pump(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        cid = self.coord_id.get(conn.id)
        if cid is not None:
            self.coord.receive_data(cid, data, now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.coord.http_data(request[0], data, now)
        self._pump(now)

    def on_eof(self, conn: SimConn, now: float) -> None:
        cid = self.coord_id.pop(conn.id, None)
        if cid is not None:
            self.conn_of.pop(cid, None)
            self.sim.monitor.on_client_conn_ended(conn, by_client=False)
            self.coord.receive_data(cid, b"", now)
        else:
            request = self.http_req.get(conn.id)
            if request is not None:
                self.coord.http_data(request[0], b"", now)
        self._pump(now)
        if conn.state is not ConnState.CLOSED:
            self.sim.net.close(conn, self)

    def next_deadline(self) -> float | None:
        return self.coord.next_deadline()

    def handle_timer(self, now: float) -> None:
        self.coord.handle_timer(now)
        self._pump(now)

    # the transport loop
    def _pump(self, now: float) -> None:
        net = self.sim.net
        coord = self.coord
        monitor = self.sim.monitor
        for _ in range(1000):
            actions = coord.take_actions()
            for action in actions:
                kind = type(action)
                if kind is Deliver:
                    self._deliver(action, now)  # type: ignore[arg-type]
                elif kind is Connect:
                    assert isinstance(action, Connect)
                    conn = net.connect(self, str(action.address))
                    self.conn_of[action.conn_id] = conn
                    self.coord_id[conn.id] = action.conn_id
                elif kind is CloseConnection:
                    assert isinstance(action, CloseConnection)
                    closing = self.conn_of.pop(action.conn_id, None)
                    if closing is not None:
                        self.coord_id.pop(closing.id, None)
                        net.send(closing, self, action.final_data)
                        monitor.on_client_conn_ended(closing, by_client=True)
                        net.close(closing, self)
                elif kind is SendHTTPRequest:
                    assert isinstance(action, SendHTTPRequest)
                    address = f"{action.lookupd.host}:{action.lookupd.port}"
                    conn = net.connect(self, address)
                    self.http_of[action.request_id] = conn
                    self.http_req[conn.id] = (action.request_id, action.data)
                    self.stats.lookup_polls.append(now)
                elif kind is CloseHTTPRequest:
                    assert isinstance(action, CloseHTTPRequest)
                    http = self.http_of.pop(action.request_id, None)
                    if http is not None:
                        self.http_req.pop(http.id, None)
                        net.close(http, self)
                elif kind is GiveUp:
                    assert isinstance(action, GiveUp)
                    self.stats.given_up += 1
                    monitor.on_give_up(
                        self.name, self.topic, self.channel, action.message.body, now
                    )
                elif kind is TakenBack:
                    self.stats.taken_back += 1
                elif kind is FetchResult:
                    assert isinstance(action, FetchResult)
                    self.fetching = False
                    for delivery in action.messages:
                        self._deliver(delivery, now)
                    if action.reason is not FetchEnd.DRAINING:
                        self._fetch_more(now)
                elif kind is DrainComplete:
                    self.drained_at = now
                    monitor.on_drain_complete(self.name, now)
                elif kind is StartTLS:  # pragma: no cover - no TLS in the sim
                    raise NSQError("the simulator does not run TLS")
            for cid, data in coord.pending_data():
                target = self.conn_of.get(cid)
                if target is not None:
                    net.send(target, self, data)
            if not actions:
                break
        monitor.on_consumer_step(self, now)

    # simulated user code
    def _deliver(self, delivery: Deliver, now: float) -> None:
        self.stats.delivered += 1
        if (
            self.coord.state is not ConsumerState.RUNNING
            and self.coord.state is not ConsumerState.DRAINING
        ):
            return
        limit = self.handler.concurrency
        if limit is not None and len(self.jobs) >= limit:
            self.waiting.append(delivery)
            return
        self._start_job(delivery, now)

    def _start_next(self, now: float) -> None:
        limit = self.handler.concurrency
        while self.waiting and (limit is None or len(self.jobs) < limit):
            delivery = self.waiting.popleft()
            if self.coord.deadline(delivery) is None:
                continue  # requeued by a drain, or its connection is gone: not ours any more
            self._start_job(delivery, now)

    def _start_job(self, delivery: Deliver, now: float) -> None:
        self.coord.mark_delivered(delivery)
        duration, hang = self.handler.decide(delivery, self.rng)
        if hang:
            return
        job = _Job(delivery, now + duration)
        self.sim.monitor.on_job(self.name, delivery.body, now, now + duration)
        old = self.jobs.get(delivery.id)
        if old is not None:
            old.cancelled = True
        self.jobs[delivery.id] = job
        self.sim.scheduler.call_at(now + duration, self._job_done, job)
        if self.handler.keepalive:
            self._schedule_touch(job, now)

    def _schedule_touch(self, job: _Job, now: float) -> None:
        deadline = self.coord.deadline(job.delivery)
        if deadline is None:
            return
        # touch at half the time left, like the transports' keepalive helper
        at = now + max((deadline - now) / 2, 0.001)
        if at < job.done_at:
            self.sim.scheduler.call_at(at, self._touch, job)

    def _touch(self, job: _Job) -> None:
        if job.cancelled or not self.alive:
            return
        now = self.sim.now
        limit = self.coord.max_deadline(job.delivery)
        current = self.coord.deadline(job.delivery)
        if limit is None or current is None or current >= limit:
            return
        try:
            self.coord.touch(job.delivery, now)
        except NSQError as exc:
            self.sim.monitor.violate(
                Invariant.CLIENT_API, now, f"{self.name}: touch({job.delivery.id!r}) raised {exc!r}"
            )
            return
        self.stats.touches += 1
        self._pump(now)
        self.sim.after(self)
        self._schedule_touch(job, now)

    def _job_done(self, job: _Job) -> None:
        if job.cancelled or not self.alive:
            return
        if self.jobs.get(job.delivery.id) is job:
            del self.jobs[job.delivery.id]
        now = self.sim.now
        handler = self.handler
        try:
            verdict = handler.outcome(job.delivery, self.rng)
            if verdict is None:
                pass  # stuck: never answers (nsqd times the message out)
            elif verdict:
                if self.coord.finish(job.delivery, now):
                    self.stats.finished += 1
                    self.sim.monitor.on_handled(self.name, job.delivery, now)
            elif self.coord.requeue(
                job.delivery, now, handler.requeue_delay, backoff=handler.backoff
            ):
                self.stats.requeued += 1
        except NSQError as exc:
            self.sim.monitor.violate(
                Invariant.CLIENT_API,
                now,
                f"{self.name}: answering message {job.delivery.id!r} (attempt "
                f"{job.delivery.attempts}) raised {exc!r}",
            )
        self._start_next(now)
        self._fetch_more(now)
        self._pump(now)
        self.sim.after(self)


# --- producer ----------------------------------------------------------------------------------


class ProducerNode(SimNode):
    """Publishes bodies to one nsqd over protocol V2 (PUB/MPUB), retrying what was not
    acknowledged on a new connection; acknowledged bodies go to the monitor's ledger."""

    def __init__(
        self, sim: Simulator, name: str, nsqd_address: str, topic: str, *, retry_delay: float = 1.0
    ) -> None:
        super().__init__(sim, name)
        self.address = nsqd_address
        self.topic = topic
        self.retry_delay = retry_delay
        self.queue: deque[list[bytes]] = deque()
        self.pending: dict[int, list[bytes]] = {}
        self.proto: ClientConnection | None = None
        self.conn: SimConn | None = None
        self.ready = False
        self.retry_at: float | None = None
        self.acked = 0

    def publish(self, bodies: list[bytes], now: float) -> None:
        self.queue.append(bodies)
        self._kick(now)

    def _kick(self, now: float) -> None:
        if self.conn is None and self.retry_at is None:
            self.proto = ClientConnection({"client_id": self.name, "heartbeat_interval": 5000})
            self.conn = self.sim.net.connect(self, self.address)
            self.ready = False
        elif self.ready:
            self._send_queue(now)

    def _send_queue(self, now: float) -> None:
        proto = self.proto
        assert proto is not None and self.conn is not None
        while self.queue:
            bodies = self.queue.popleft()
            if len(bodies) == 1:
                rid = proto.publish(self.topic, bodies[0])
            else:
                rid = proto.multi_publish(self.topic, bodies)
            self.pending[rid] = bodies
        self.sim.net.send(self.conn, self, proto.data_to_send())

    def on_connected(self, conn: SimConn, now: float) -> None:
        if conn is self.conn and self.proto is not None:
            self.sim.net.send(conn, self, self.proto.data_to_send())

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        if conn is self.conn:
            self._lost(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        if conn is not self.conn or self.proto is None:
            return
        for event in self.proto.receive_data(data, now):
            if isinstance(event, ConnectionReady):
                self.ready = True
            elif isinstance(event, PublishAcknowledged):
                bodies = self.pending.pop(event.request_id, None)
                if bodies is not None:
                    self.acked += len(bodies)
                    self.sim.monitor.on_accepted(
                        conn.server.name if conn.server else "?", self.topic, bodies, now
                    )
            elif isinstance(event, PublishFailed):
                bodies = self.pending.pop(event.request_id, None)
                if bodies is not None:
                    self.queue.appendleft(bodies)
            elif isinstance(event, ConnectionClosed):
                self.sim.net.close(conn, self)
                self._lost(now)
                return
        if self.ready:
            self._send_queue(now)
        else:
            self.sim.net.send(conn, self, self.proto.data_to_send())

    def on_eof(self, conn: SimConn, now: float) -> None:
        if conn is self.conn:
            self.sim.net.close(conn, self)
            self._lost(now)

    def _lost(self, now: float) -> None:
        for rid in sorted(self.pending, reverse=True):
            self.queue.appendleft(self.pending[rid])
        self.pending.clear()
        self.conn = None
        self.proto = None
        self.ready = False
        self.retry_at = now + self.retry_delay

    def next_deadline(self) -> float | None:
        if self.retry_at is not None:
            return self.retry_at
        if self.proto is not None:
            return self.proto.next_deadline()
        return None

    def handle_timer(self, now: float) -> None:
        if self.retry_at is not None and now >= self.retry_at:
            self.retry_at = None
            if self.queue:
                self._kick(now)
            return
        if self.proto is not None and self.conn is not None:
            for event in self.proto.handle_timer(now):
                if isinstance(event, ConnectionClosed):
                    self.sim.net.close(self.conn, self)
                    self._lost(now)
                    return

"""A simulated nsqd: the core's :class:`~nsq_sansio.server.nsqd.NSQD` driven exactly as the
embedded broker drives it, plus one :class:`~nsq_sansio.server.lookupd_client.LookupPeer` per
lookupd, over the simulated network and clock; a crash loses what is not on its :class:`SimDisk`.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from ...errors import NSQError
from ...server.backend import Backend, decode_record
from ...server.events import ChannelCreated, ChannelDeleted, ServerEvent, TopicCreated
from ...server.events import CloseConnection as ServerClose
from ...server.events import StartTLS as ServerStartTLS
from ...server.lookupd_client import (
    LookupPeer,
    LookupPeerClosed,
    NodeIdentity,
    sync_registrations,
)
from ...server.nsqd import NSQD
from ...server.options import NSQDOptions
from ..network import SimConn
from .base import SimNode, World

# --- storage that survives a crash --------------------------------------------------------------

__all__ = ["NsqdNode", "SimDisk"]


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
        """The disk queue named ``name`` (nsqd's backend factory): survives restarts."""
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
        """A crash without a durable disk: the queues and metadata are gone."""
        if not self.durable:
            self.queues.clear()
            self.metadata = None


class NsqdNode(SimNode):
    """An nsqd (the core's :class:`NSQD`) plus one :class:`LookupPeer` per lookupd."""

    def __init__(
        self,
        sim: World,
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
        """The TCP address consumers and producers connect to (``name:port``)."""
        return f"{self.name}:{self.options.tcp_port}"

    # admin (the HTTP API, called directly)
    def publish(self, topic: str, bodies: list[bytes], now: float) -> bool:
        """Publish ``bodies`` on ``topic`` directly (as over HTTP); False if nsqd is down or
        refused them."""
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
        """Create ``channel`` on ``topic`` ahead of any consumer (as an admin would), so
        messages published before a consumer subscribes are kept for it."""
        self.nsqd.create_channel(topic, channel, now)
        self._flush(now)

    # network
    def on_accept(self, conn: SimConn, now: float) -> None:
        """A client connected: nsqd gets a new client connection."""
        cid = self.nsqd.connect(now, f"{conn.client.name}:{conn.id}")
        self.by_conn[conn.id] = cid
        self.conns[cid] = conn
        self._flush(now)

    def on_connected(self, conn: SimConn, now: float) -> None:
        """A connection to a lookupd is up: nsqd identifies and registers its topics and
        channels."""
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
        """A connection to a lookupd failed: that peer retries later."""
        for index, peer_conn in list(self.peer_conns.items()):
            if peer_conn is conn:
                del self.peer_conns[index]
                self.peers[index].connection_failed(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        """Bytes from a client go to nsqd, from a lookupd to that peer."""
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
        """A client or lookupd closed: nsqd handles the lost connection (its in-flight
        messages go back to the queue as nsqd does)."""
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
        """The earliest deadline of nsqd itself or of its lookupd peers."""
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
        """Bring a crashed or stopped nsqd back on the same address, with what its disk kept."""
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

"""A simulated producer: PUB/MPUB to one nsqd over protocol V2 with the core's
:class:`~nsq_sansio.connection.ClientConnection`, retrying what was not acknowledged on a new
connection; acknowledged bodies go to the monitor's ledger.
"""

from __future__ import annotations

from collections import deque

from ...connection import ClientConnection
from ...events import ConnectionClosed, ConnectionReady, PublishAcknowledged, PublishFailed
from ..network import SimConn
from .base import SimNode, World

__all__ = ["ProducerNode"]


class ProducerNode(SimNode):
    """Publishes bodies to one nsqd over protocol V2 (PUB/MPUB), retrying what was not
    acknowledged on a new connection; acknowledged bodies go to the monitor's ledger."""

    def __init__(
        self, sim: World, name: str, nsqd_address: str, topic: str, *, retry_delay: float = 1.0
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
        """Queue ``bodies`` for one publish (one message: PUB, more: MPUB), sent when
        connected."""
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
        """The connection to nsqd is up: the handshake goes out."""
        if conn is self.conn and self.proto is not None:
            self.sim.net.send(conn, self, self.proto.data_to_send())

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        """The connection to nsqd failed: what was queued is retried after a delay."""
        if conn is self.conn:
            self._lost(now)

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        """nsqd's answers: acknowledged publishes are reported to the monitor as accepted."""
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
        """nsqd closed: unacknowledged publishes go back to the queue, retried on a new
        connection after a delay."""
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
        """When to retry a lost connection, or the connection's own next deadline."""
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

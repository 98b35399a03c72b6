"""The stats snapshots every client returns: :class:`ConsumerStats`, :class:`ProducerStats`,
and one :class:`ConnectionStats` per connection.

Plain frozen dataclasses, the same for every runtime (anyio, trio, blocking), so a metrics
exporter or a dashboard reads them without knowing which client produced them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionStats", "ConsumerStats", "ProducerStats"]


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One nsqd connection at the moment of the snapshot."""

    address: str
    state: str
    connected: bool
    rdy: int = 0
    in_flight: int = 0
    received: int = 0
    finished: int = 0
    requeued: int = 0
    touched: int = 0
    reconnects: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer at the moment of the snapshot: totals plus one entry per connection."""

    topic: str
    channel: str
    received: int = 0
    finished: int = 0
    requeued: int = 0
    given_up: int = 0
    taken_back: int = 0
    in_flight: int = 0
    rdy: int = 0
    max_in_flight: int = 0
    backoff_level: int = 0
    backoff_phase: str = "normal"
    reconnects: int = 0
    connection_errors: int = 0
    connections: tuple[ConnectionStats, ...] = ()

    @property
    def connected(self) -> int:
        return sum(1 for c in self.connections if c.connected)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer at the moment of the snapshot."""

    published: int = 0
    failed: int = 0
    pending: int = 0
    reconnects: int = 0
    connections: tuple[ConnectionStats, ...] = ()

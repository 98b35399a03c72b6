"""The stats snapshots every client returns: :class:`ConsumerStats`, :class:`ProducerStats`,
and one :class:`ConnectionStats` per connection.

Plain frozen dataclasses with one vocabulary for every runtime (anyio, trio, blocking), so a
metrics exporter or a dashboard reads them without knowing which client produced them: a
connection's ``state`` is one of :data:`CONNECTION_STATES`, ``backoff_phase`` one of
``"normal"``, ``"waiting"``, ``"testing"`` (:class:`~nsq_sansio.backoff.BackoffPhase`),
``backoff_windows`` counts the backoff windows opened.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CONNECTION_STATES", "ConnectionStats", "ConsumerStats", "ProducerStats"]

#: What ``ConnectionStats.state`` says, on every runtime: ``"connecting"`` (TCP connect under
#: way), ``"handshaking"`` (IDENTIFY, TLS, AUTH, SUB), ``"subscribed"`` (a consumer's: messages
#: flow), ``"ready"`` (a producer's: publishes flow), ``"closing"`` (a consumer's: CLS sent),
#: ``"closed"`` (not connected: not yet, or lost; ``last_error`` says why).
CONNECTION_STATES = ("connecting", "handshaking", "subscribed", "ready", "closing", "closed")


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """One nsqd connection at the moment of the snapshot: ``state`` (one of
    :data:`CONNECTION_STATES`), ``connected`` (subscribed, or ready to publish), the RDY last
    sent and the messages in flight (a consumer's), the publishes waiting for an answer (a
    producer's ``in_flight``), how many times this address was connected again, bytes read
    and written, and the last error (a producer's)."""

    address: str
    state: str
    connected: bool
    rdy: int = 0
    in_flight: int = 0
    reconnects: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """A consumer at the moment of the snapshot: totals plus one entry per connection.

    ``paused`` is True while ``max_in_flight`` is 0 (nothing is asked of nsqd until
    ``set_max_in_flight()`` raises it); ``topic_not_found`` counts lookupd answers that listed
    no nsqd for the topic; ``reconnects`` counts connections made again to an address that
    was connected before."""

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
    #: Backoff windows opened since the consumer started (RDY 0 for a while after failures).
    backoff_windows: int = 0
    reconnects: int = 0
    connection_errors: int = 0
    connections: tuple[ConnectionStats, ...] = ()
    paused: bool = False
    topic_not_found: int = 0

    @property
    def connected(self) -> int:
        """Connections connected now (subscribed, or ready to publish)."""
        return sum(1 for c in self.connections if c.connected)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """A producer at the moment of the snapshot."""

    published: int = 0
    failed: int = 0
    pending: int = 0
    reconnects: int = 0
    connections: tuple[ConnectionStats, ...] = ()

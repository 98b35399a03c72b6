"""Plain snapshot objects for the blocking transport's ``stats()`` (copied, never live)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConnectionStats", "ConsumerStats", "NodeStats", "ProducerStats"]


@dataclass(frozen=True)
class NodeStats:
    """One nsqd of a producer's pool."""

    address: str
    connected: bool
    in_flight: int
    published: int
    failed: int
    connects: int
    last_error: str | None


@dataclass(frozen=True)
class ProducerStats:
    published: int
    failed: int
    #: Publishes sent again on another nsqd after their connection died.
    retried: int
    #: Publishes handed over and not answered yet (bounded by ``max_pending``).
    pending: int
    nodes: tuple[NodeStats, ...]


@dataclass(frozen=True)
class ConnectionStats:
    """One consumer connection to nsqd."""

    address: str
    state: str
    rdy: int
    in_flight: int
    messages: int
    tls: bool
    compression: str | None


@dataclass(frozen=True)
class ConsumerStats:
    #: Messages received from nsqd.
    received: int
    finished: int
    requeued: int
    #: Messages that exceeded max_attempts and were given up.
    given_up: int
    #: Late FIN/REQ/TOUCH answers: the server had taken the message back already.
    taken_back: int
    #: Messages handed to user code and not answered yet.
    in_user_code: int
    #: Messages received but not handed to user code yet.
    queued: int
    connects: int
    disconnects: int
    connections: tuple[ConnectionStats, ...]
    #: Anything else the core's coordinator reports (a copy).
    extra: dict[str, object]

"""nsqlookupd's registration DB (its ``registration_db.go``): which nsqd (producers) registered
which topics and channels, with each producer's liveness and tombstones.

Keys are :class:`Registration` s (category ``client``, ``topic`` or ``channel``); a key maps to
the :class:`Producer` s registered under it, each pointing at its nsqd's shared :class:`Peer`
(identity and last update). Lookups take ``*`` for any key or subkey, as nsqlookupd's do. The
protocol and HTTP semantics around it are :mod:`.lookupd`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Peer", "PeerInfo", "Producer", "Registration", "RegistrationDB"]


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """An nsqd as it identified itself; ``id`` is its connection's remote address."""

    id: str
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str

    def to_json(self) -> dict[str, Any]:
        """The producer object of ``/lookup``: nsqlookupd's field names and order."""
        return {
            "remote_address": self.remote_address,
            "hostname": self.hostname,
            "broadcast_address": self.broadcast_address,
            "tcp_port": self.tcp_port,
            "http_port": self.http_port,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class Registration:
    """A registry key: category ``client``, ``topic`` (subkey "") or ``channel``."""

    category: str
    key: str = ""
    subkey: str = ""

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """Whether this key matches a pattern where ``*`` stands for any key or subkey."""
        return (
            self.category == category
            and (key == "*" or self.key == key)
            and (subkey == "*" or self.subkey == subkey)
        )


@dataclass(slots=True)
class Peer:
    """Mutable per-peer liveness (shared by all of a peer's registrations, as in nsqlookupd)."""

    info: PeerInfo
    last_update: float


@dataclass(slots=True)
class Producer:
    """A peer under one registration; tombstones are per registration."""

    peer: Peer
    tombstoned: bool = False
    tombstoned_at: float = 0.0

    def is_tombstoned(self, now: float, lifetime: float) -> bool:
        return self.tombstoned and now - self.tombstoned_at < lifetime


class RegistrationDB:
    """Registrations to producers, kept in insertion order so answers are deterministic."""

    def __init__(self) -> None:
        self._map: dict[Registration, dict[str, Producer]] = {}

    def __len__(self) -> int:
        return len(self._map)

    def add_registration(self, key: Registration) -> None:
        """Create a key with no producers (``/topic/create``) if it is not there yet."""
        self._map.setdefault(key, {})

    def add_producer(self, key: Registration, peer: Peer) -> bool:
        """Add ``peer`` under ``key``; False if it was already there (tombstone kept)."""
        producers = self._map.setdefault(key, {})
        if peer.info.id in producers:
            return False
        producers[peer.info.id] = Producer(peer)
        return True

    def remove_producer(self, key: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove a peer from a key; returns (was it there, producers left). Keeps the key."""
        producers = self._map.get(key)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        return removed, len(producers)

    def remove_registration(self, key: Registration) -> None:
        """Drop a key and all of its producers."""
        self._map.pop(key, None)

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """Keys matching a pattern (``*`` wildcards for key and subkey)."""
        if key != "*" and subkey != "*":
            exact = Registration(category, key, subkey)
            return [exact] if exact in self._map else []
        return [k for k in self._map if k.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under matching keys, each peer once."""
        seen: set[str] = set()
        result: list[Producer] = []
        for k in self.find_registrations(category, key, subkey):
            for peer_id, producer in self._map[k].items():
                if peer_id not in seen:
                    seen.add(peer_id)
                    result.append(producer)
        return result

    def items(self) -> list[tuple[Registration, list[Producer]]]:
        """Every registration with its producers, in insertion order."""
        return [(key, list(producers.values())) for key, producers in self._map.items()]

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key a peer is registered under."""
        return [k for k, producers in self._map.items() if peer_id in producers]

    def producer(self, key: Registration, peer_id: str) -> Producer | None:
        """The producer record of one peer under one key, if any."""
        producers = self._map.get(key)
        return None if producers is None else producers.get(peer_id)

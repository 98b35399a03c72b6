"""Recognise the redelivered messages of a committed micro-batch, from a bounded summary.

Why: a query stopped after Spark committed batch N but before the source FIN'd it (the FINs go
out at the next trigger) gets batch N's messages again from nsqd once they time out. The
restarted source must drop them (FIN, not read again), but the offset log cannot hold every
id of every batch (16 bytes per message, and Spark keeps 100 entries).

So the offset of a batch holds, per nsqd, a :class:`NodeDigest`: how many messages came from
that nsqd, the smallest and largest id, and a 128-bit hash of the sorted ids (about 100 bytes
per nsqd, whatever the batch size). After a restart, :class:`RedeliveryFilter` sets aside the
*candidates*: messages from that nsqd delivered before (``attempts >= 2``; a first delivery
cannot belong to a batch read earlier) with an id in the range. When exactly ``count`` of them
are set aside and their hash matches, they are batch N: the caller FINs and drops them. If the
set cannot match (more candidates than the batch had, a different hash, or no new candidate
for ``patience`` seconds, e.g. because part of the batch went to another consumer of the
channel), every candidate of that nsqd is released to be read: a duplicate, never a loss.
Redeliveries come within a msg_timeout of the stop, so the filter gives up after that
(``give_up_at``) and costs nothing more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["NodeDigest", "RedeliveryFilter", "batch_digests", "digests_from_offset"]

T = TypeVar("T")


def _hash(ids: Iterable[bytes]) -> str:
    return _hash_sorted(sorted(ids))


def _hash_sorted(ids: list[bytes]) -> str:
    # Ids have a fixed size (16 bytes), so the concatenation is unambiguous.
    return hashlib.blake2b(b"".join(ids), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class NodeDigest:
    """What a batch took from one nsqd: count, id range and hash of the sorted ids."""

    count: int
    low: bytes
    high: bytes
    hash: str

    @classmethod
    def of(cls, ids: Sequence[bytes]) -> NodeDigest:
        ordered = sorted(ids)  # one sort gives the range and the hash
        return cls(len(ordered), ordered[0], ordered[-1], _hash_sorted(ordered))

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.count,
            "lo": self.low.decode("ascii"),
            "hi": self.high.decode("ascii"),
            "h": self.hash,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeDigest:
        return cls(
            int(data["n"]),
            str(data["lo"]).encode("ascii"),
            str(data["hi"]).encode("ascii"),
            str(data["h"]),
        )


def batch_digests(ids_by_node: Mapping[str, Sequence[bytes]]) -> dict[str, dict[str, Any]]:
    """The offset's ``nsqd`` entry: ``{address: NodeDigest as JSON}``, sorted by address."""
    return {
        address: NodeDigest.of(ids).to_json() for address, ids in sorted(ids_by_node.items()) if ids
    }


def digests_from_offset(offset: Mapping[str, Any], id_size: int) -> dict[str, NodeDigest]:
    """The digests of an offset: the ``nsqd`` entry, or an older offset's full ``ids`` list
    (the concatenated ids of each nsqd), summarised the same way."""
    found: dict[str, NodeDigest] = {}
    for address, data in (offset.get("nsqd") or {}).items():
        found[address] = NodeDigest.from_json(data)
    for address, joined in (offset.get("ids") or {}).items():
        raw = str(joined).encode("ascii")
        ids = [raw[i : i + id_size] for i in range(0, len(raw), id_size)]
        if ids:
            found[address] = NodeDigest.of(ids)
    return found


class _Pending(Generic[T]):
    __slots__ = ("ids", "items", "last_at")

    def __init__(self) -> None:
        self.items: list[T] = []
        self.ids: list[bytes] = []
        self.last_at = 0.0


class RedeliveryFilter(Generic[T]):
    """Sorts messages into fresh ones, the committed batch's redeliveries, and released ones.

    ``key(item)`` gives ``(nsqd address, id, attempts)``. Each nsqd's digest is used once:
    after a match or a release, that nsqd's messages all pass as fresh.
    """

    def __init__(
        self,
        digests: Mapping[str, NodeDigest],
        key: Callable[[T], tuple[str, bytes, int]],
        *,
        patience: float,
        give_up_at: float | None = None,
    ) -> None:
        self._digests = dict(digests)
        self._key = key
        self._patience = patience
        #: With nothing set aside, the digests are forgotten from then on (the redeliveries
        #: come within a msg_timeout of the stop; later, the filter would only cost time).
        self._give_up_at = give_up_at
        self._pending: dict[str, _Pending[T]] = {}

    @property
    def active(self) -> bool:
        """True while some nsqd's redeliveries may still come (or wait to be matched)."""
        return bool(self._digests)

    def pending(self) -> list[T]:
        """Candidates set aside, not decided yet (the caller keeps them in flight)."""
        return [item for p in self._pending.values() for item in p.items]

    def offer(self, items: Iterable[T], now: float) -> tuple[list[T], list[T], list[T]]:
        """``(fresh, committed, released)``: read ``fresh`` and ``released``, FIN and drop
        ``committed``. Candidates not decided yet are kept (see :meth:`pending`)."""
        fresh: list[T] = []
        committed: list[T] = []
        released: list[T] = []
        if self._give_up_at is not None and now >= self._give_up_at:
            for address in [a for a in self._digests if a not in self._pending]:
                del self._digests[address]
        digests = self._digests
        if not digests:
            fresh.extend(items)
            return fresh, committed, released
        touched: set[str] = set()
        for item in items:
            address, message_id, attempts = self._key(item)
            digest = digests.get(address)
            if digest is None or attempts < 2 or not digest.low <= message_id <= digest.high:
                fresh.append(item)
                continue
            pending = self._pending.get(address)
            if pending is None:
                pending = self._pending[address] = _Pending()
            pending.items.append(item)
            pending.ids.append(message_id)
            pending.last_at = now
            touched.add(address)
        for address in touched:
            digest = digests[address]
            pending = self._pending[address]
            if len(pending.ids) < digest.count:
                continue
            if len(pending.ids) == digest.count and _hash(pending.ids) == digest.hash:
                committed += pending.items
            else:
                released += pending.items
            self._settle(address)
        released += self.expire(now)
        return fresh, committed, released

    def expire(self, now: float) -> list[T]:
        """Release the candidates of every nsqd that sent no new one for ``patience`` seconds
        (its set can no longer be matched): they are read, as duplicates."""
        released: list[T] = []
        for address, pending in list(self._pending.items()):
            if now - pending.last_at >= self._patience:
                released += pending.items
                self._settle(address)
        return released

    def _settle(self, address: str) -> None:
        self._pending.pop(address, None)
        self._digests.pop(address, None)

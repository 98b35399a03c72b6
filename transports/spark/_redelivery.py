"""Recognise the redelivered messages of a committed micro-batch, from a bounded summary.

Why: a query stopped after Spark committed batch N but before the source FIN'd it (the FINs go
out at the next trigger) gets batch N's messages again from nsqd once they time out. The
restarted source must drop them (FIN, not read again), but the offset log cannot hold every
id of every batch (16 bytes per message, and Spark keeps 100 entries).

So the offset of a batch holds, per nsqd, a few :class:`NodeDigest` s: the batch's ids from that
nsqd, sorted and cut at their largest gaps into at most :data:`MAX_BUCKETS` runs, each summarised
by its count, smallest and largest id and a 128-bit hash of its ids (about 100 bytes a run,
whatever the batch size). nsqd's ids grow with publication, and a batch takes the head of the
channel's memory queue and of its disk queue, so its ids form a few dense runs; cutting at the
gaps keeps the messages that came after the batch (fetched ahead, say) out of every run.

After a restart, :class:`RedeliveryFilter` sets aside the *candidates*: messages from that nsqd
delivered before (``attempts >= 2``; a first delivery cannot belong to a batch read earlier)
with an id inside one of its runs. When a run has exactly its count of candidates and their
hash matches, they are batch N's: the caller FINs and drops them. A run that gets more
candidates than it had, or the right number with another hash, cannot be matched: its
candidates are released (read: duplicates, never a loss). The filter keeps waiting for the rest
for as long as the caller says they may come (:meth:`RedeliveryFilter.settle` ends an nsqd's
wait); candidates that nsqd took back meanwhile are forgotten (they come again).
"""

from __future__ import annotations

import hashlib
import heapq
import operator
import sys
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "MAX_BUCKETS",
    "NodeDigest",
    "RedeliveryFilter",
    "batch_digests",
    "digests_from_offset",
    "node_digests",
]

T = TypeVar("T")

#: Most runs an nsqd's ids are cut into (an offset entry stays under a kilobyte per nsqd).
MAX_BUCKETS = 8


def _hash(ids: Iterable[bytes]) -> str:
    return _hash_sorted(sorted(ids))


def _hash_sorted(ids: list[bytes]) -> str:
    # Ids have a fixed size (16 bytes), so the concatenation is unambiguous.
    return hashlib.blake2b(b"".join(ids), digest_size=16).hexdigest()


@dataclass(frozen=True, slots=True)
class NodeDigest:
    """One run of a batch's ids from one nsqd: count, id range and hash of the sorted ids."""

    count: int
    low: bytes
    high: bytes
    hash: str

    @classmethod
    def of(cls, ids: Sequence[bytes]) -> NodeDigest:
        ordered = sorted(ids)  # one sort gives the range and the hash
        return cls._of_sorted(ordered)

    @classmethod
    def _of_sorted(cls, ordered: list[bytes]) -> NodeDigest:
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


def _gaps(ordered: list[bytes]) -> list[int] | None:
    """Differences between neighbouring ids read as 16-digit hexadecimal numbers (nsqd's ids);
    None when they are not. Converted all at once (a per-id int() cost 0.4 us each)."""
    try:
        raw = bytes.fromhex(b"".join(ordered).decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None
    if len(raw) != 8 * len(ordered):
        return None
    values = array("Q", raw)
    if sys.byteorder == "little":
        values.byteswap()  # the ids are big-endian numbers
    return list(map(operator.sub, values[1:], values))


def _largest(gaps: list[int], count: int) -> list[int]:
    """Positions of the ``count`` largest values of ``gaps`` (fewer if there are fewer)."""
    cuts: list[int] = []
    for value in sorted(set(heapq.nlargest(count, gaps)), reverse=True):
        position = -1
        while len(cuts) < count:
            try:
                position = gaps.index(value, position + 1)
            except ValueError:
                break
            cuts.append(position)
    return cuts


def node_digests(ids: Sequence[bytes]) -> list[NodeDigest]:
    """A batch's ids from one nsqd as at most :data:`MAX_BUCKETS` runs, cut at the largest gaps
    between neighbouring ids (one run when the ids are not nsqd's hexadecimal ones)."""
    ordered = sorted(ids)
    gaps = _gaps(ordered) if len(ordered) > 1 else None
    if not gaps:
        return [NodeDigest._of_sorted(ordered)]
    bounds = sorted(i + 1 for i in _largest(gaps, MAX_BUCKETS - 1) if gaps[i] > 1)
    runs = []
    start = 0
    for end in [*bounds, len(ordered)]:  # never cut inside a contiguous run (gap 1)
        runs.append(NodeDigest._of_sorted(ordered[start:end]))
        start = end
    return runs


def batch_digests(ids_by_node: Mapping[str, Sequence[bytes]]) -> dict[str, list[dict[str, Any]]]:
    """The offset's ``nsqd`` entry: ``{address: [run as JSON, ...]}``, sorted by address."""
    return {
        address: [d.to_json() for d in node_digests(ids)]
        for address, ids in sorted(ids_by_node.items())
        if ids
    }


def digests_from_offset(offset: Mapping[str, Any], id_size: int) -> dict[str, list[NodeDigest]]:
    """The runs of an offset, by nsqd: the ``nsqd`` entry (a list of runs, or one run as an
    earlier version wrote it), or an older offset's full ``ids`` list (the concatenated ids of
    each nsqd), summarised the same way."""
    found: dict[str, list[NodeDigest]] = {}
    for address, data in (offset.get("nsqd") or {}).items():
        entries = [data] if isinstance(data, Mapping) else list(data)
        found[address] = sorted((NodeDigest.from_json(e) for e in entries), key=_low)
    for address, joined in (offset.get("ids") or {}).items():
        raw = str(joined).encode("ascii")
        ids = [raw[i : i + id_size] for i in range(0, len(raw), id_size)]
        if ids:
            found[address] = node_digests(ids)
    return found


def _low(digest: NodeDigest) -> bytes:
    return digest.low


class _Pending(Generic[T]):
    __slots__ = ("ids", "items")

    def __init__(self) -> None:
        self.items: list[T] = []
        self.ids: list[bytes] = []


class _Node(Generic[T]):
    """The runs of one nsqd and the candidates set aside for each."""

    __slots__ = ("digests", "highs", "last_at", "lows", "pending", "state")

    def __init__(self, digests: Sequence[NodeDigest]) -> None:
        self.digests = sorted(digests, key=_low)
        self.lows = [d.low for d in self.digests]
        self.highs = [d.high for d in self.digests]
        self.state = [_OPEN] * len(self.digests)
        self.pending: dict[int, _Pending[T]] = {}
        self.last_at: float | None = None  # when the last candidate came

    def run_of(self, message_id: bytes) -> int | None:
        index = bisect_right(self.lows, message_id) - 1
        if index < 0 or message_id > self.highs[index]:
            return None
        return index

    @property
    def open(self) -> bool:
        return _OPEN in self.state


_OPEN, _MATCHED, _RELEASED = 0, 1, 2


class RedeliveryFilter(Generic[T]):
    """Sorts messages into fresh ones, the committed batch's redeliveries, and released ones.

    ``key(item)`` gives ``(nsqd address, id, attempts)``; ``gone(item)`` is true for a
    candidate nsqd took back (it will come again, as another item). Each run is decided once:
    matched (its items are the batch's: dropped) or released (read). An nsqd is filtered until
    all its runs are matched or the caller :meth:`settle` s it (no more can come); until then,
    messages that fall in a released run are still counted in :attr:`released` (they may be
    the batch's: read again).
    """

    def __init__(
        self,
        digests: Mapping[str, Sequence[NodeDigest]],
        key: Callable[[T], tuple[str, bytes, int]],
        *,
        gone: Callable[[T], bool] | None = None,
    ) -> None:
        self._nodes: dict[str, _Node[T]] = {a: _Node(d) for a, d in digests.items() if d}
        self._key = key
        self._gone = gone
        #: Over the filter's life: messages dropped as the batch's, and messages read that may
        #: be the batch's (released runs and what came later in their ranges).
        self.matched = 0
        self.released = 0

    @property
    def active(self) -> bool:
        """True while some nsqd's redeliveries may still come (or wait to be matched)."""
        return bool(self._nodes)

    def addresses(self) -> list[str]:
        """The nsqd still filtered."""
        return sorted(self._nodes)

    def expected(self) -> int:
        """How many messages the open runs wait for (those set aside included): the most this
        filter holds."""
        return sum(
            d.count
            for node in self._nodes.values()
            for d, state in zip(node.digests, node.state, strict=True)
            if state == _OPEN
        )

    def last_candidate_at(self, address: str) -> float | None:
        node = self._nodes.get(address)
        return None if node is None else node.last_at

    def pending(self) -> list[T]:
        """Candidates set aside, not decided yet (the caller keeps them in flight)."""
        return [
            item for node in self._nodes.values() for p in node.pending.values() for item in p.items
        ]

    def offer(self, items: Iterable[T], now: float) -> tuple[list[T], list[T], list[T]]:
        """``(fresh, committed, released)``: read ``fresh`` and ``released``, FIN and drop
        ``committed``. Candidates not decided yet are kept (see :meth:`pending`)."""
        fresh: list[T] = []
        committed: list[T] = []
        released: list[T] = []
        nodes = self._nodes
        if not nodes:
            fresh.extend(items)
            return fresh, committed, released
        touched: set[tuple[str, int]] = set()
        for item in items:
            address, message_id, attempts = self._key(item)
            node = nodes.get(address)
            run = None if node is None or attempts < 2 else node.run_of(message_id)
            if run is None:
                fresh.append(item)
                continue
            assert node is not None
            state = node.state[run]
            if state != _OPEN:
                if state == _RELEASED:
                    self.released += 1  # may be one of the batch's, late
                fresh.append(item)
                continue
            pending = node.pending.get(run)
            if pending is None:
                pending = node.pending[run] = _Pending()
            pending.items.append(item)
            pending.ids.append(message_id)
            node.last_at = now
            touched.add((address, run))
        for address, run in touched:
            self._decide(address, run, committed, released)
        return fresh, committed, released

    def _decide(self, address: str, run: int, committed: list[T], released: list[T]) -> None:
        node = self._nodes[address]
        digest = node.digests[run]
        pending = node.pending[run]
        if len(pending.ids) >= digest.count:
            self._forget_gone(pending)
        if len(pending.ids) < digest.count:
            return
        if len(pending.ids) == digest.count and _hash(pending.ids) == digest.hash:
            committed += pending.items
            self.matched += len(pending.items)
            node.state[run] = _MATCHED
        else:
            released += pending.items
            self.released += len(pending.items)
            node.state[run] = _RELEASED
        del node.pending[run]
        if _OPEN not in node.state and _RELEASED not in node.state:
            del self._nodes[address]  # all matched: nothing more of the batch can come

    def _forget_gone(self, pending: _Pending[T]) -> None:
        gone = self._gone
        if gone is None or not any(map(gone, pending.items)):
            return
        kept = [(i, m) for i, m in zip(pending.items, pending.ids, strict=True) if not gone(i)]
        pending.items = [i for i, _ in kept]
        pending.ids = [m for _, m in kept]

    def forget_gone(self) -> None:
        """Drop the candidates nsqd took back (they will be offered again)."""
        for node in self._nodes.values():
            for pending in node.pending.values():
                self._forget_gone(pending)

    def settle(self, address: str) -> list[T]:
        """No more of the batch can come from ``address``: release what is set aside for it
        (read: its runs could not be matched, so these may be duplicates) and stop filtering
        it."""
        node = self._nodes.pop(address, None)
        if node is None:
            return []
        out: list[T] = []
        for pending in node.pending.values():
            self._forget_gone(pending)
            out += pending.items
        self.released += len(out)
        return out

    def settle_all(self) -> list[T]:
        """:meth:`settle` every nsqd."""
        return [item for address in list(self._nodes) for item in self.settle(address)]

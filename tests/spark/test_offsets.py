"""Offsets stay small at any batch size, and still let a restarted query drop the
redeliveries of its last committed batch; micro-batches are cut into tasks by count and bytes
(no Spark session: the pieces on their own)."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from nsq_sansio.consumer import Deliver
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.events import Message as CoreMessage
from transports.spark._redelivery import (
    MAX_BUCKETS,
    NodeDigest,
    RedeliveryFilter,
    batch_digests,
    digests_from_offset,
    node_digests,
)
from transports.spark.reader import _Nodes, _offset, _record_batch, split_bounds
from transports.sync import Message

pytestmark = pytest.mark.spark

NODES = [NSQDAddress("10.0.0.1", 4150), NSQDAddress("10.0.0.2", 4150)]


def _messages(count: int, start: int = 0, attempts: int = 1) -> list[Message]:
    """Sync-transport messages as the source gets them, alternating between two nsqd."""
    out = []
    for i in range(start, start + count):
        core = CoreMessage(b"%016x" % i, b"x" * 100, 0, attempts)
        out.append(Message(None, Deliver(i % 2, core, NODES[i % 2], 0.0, 60.0)))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("rows", [1, 1_000, 100_000])
def test_an_offset_entry_is_under_a_kilobyte_per_nsqd_at_any_batch_size(rows: int) -> None:
    entry = json.dumps(_offset(7, _messages(rows)))
    assert len(entry) < 2 * 1024, entry  # was 16 bytes per message: 1.6 MB for 100,000 rows
    back = json.loads(entry)
    assert back["batch"] == 7 and back["count"] == rows
    digests = digests_from_offset(back, 16)
    assert sum(d.count for runs in digests.values() for d in runs) == rows
    assert all(len(runs) <= MAX_BUCKETS for runs in digests.values())


def test_rows_and_digests_name_each_message_s_nsqd_over_many_connections() -> None:
    # 40 connections (one address object each) to two nsqd, messages interleaved.
    links = [NSQDAddress(f"10.0.0.{1 + i % 2}", 4150) for i in range(40)]
    deliveries = [
        Deliver(
            i % 40,
            CoreMessage(b"%016x" % i, b"b%d" % i, 5_000_123 * i, 1 + i % 3),
            links[i % 40],
            0.0,
            60.0,
        )
        for i in range(1000)
    ]
    nodes = _Nodes(deliveries)
    assert nodes.names == ["10.0.0.1:4150", "10.0.0.2:4150"]
    rows = _record_batch(deliveries, nodes.names, nodes.codes, "t", "c").to_pylist()
    assert [r["nsqd"] for r in rows] == [str(d.address) for d in deliveries]
    assert [r["id"].encode() for r in rows] == [d.id for d in deliveries]
    assert [r["body"] for r in rows] == [d.body for d in deliveries]
    assert [r["attempts"] for r in rows] == [d.attempts for d in deliveries]
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    assert [(r["timestamp"] - epoch) // timedelta(microseconds=1) for r in rows] == [
        d.timestamp // 1000 for d in deliveries
    ]
    digests = digests_from_offset(_offset(1, [Message(None, d) for d in deliveries]), 16)  # type: ignore[arg-type]
    assert digests == {
        "10.0.0.1:4150": node_digests([d.id for d in deliveries[0::2]]),
        "10.0.0.2:4150": node_digests([d.id for d in deliveries[1::2]]),
    }
    one = _Nodes(deliveries[0::2])  # one nsqd over 20 connections: no per-row codes
    assert one.names == ["10.0.0.1:4150"] and one.codes is None


def test_offsets_of_earlier_versions_are_read() -> None:
    ids = [b"%016x" % i for i in (5, 1, 9)]
    # every id, concatenated
    old = {"batch": 3, "ids": {"10.0.0.1:4150": b"".join(ids).decode()}}
    (runs,) = digests_from_offset(old, 16).values()
    assert runs == node_digests(ids) and sum(d.count for d in runs) == 3
    # one run per nsqd, as an object
    single = {"batch": 3, "nsqd": {"10.0.0.1:4150": NodeDigest.of(ids).to_json()}}
    assert digests_from_offset(single, 16) == {"10.0.0.1:4150": [NodeDigest.of(ids)]}
    (digest,) = digests_from_offset(single, 16)["10.0.0.1:4150"]
    assert digest.low == ids[1] and digest.high == ids[2]


def test_runs_are_cut_at_the_largest_gaps() -> None:
    """A batch that took the head of nsqd's memory queue and of its disk queue: two dense
    runs of ids with a wide gap between them (what came after the batch lies there)."""
    memory = [b"%016x" % i for i in range(1000, 1600)]
    disk = [b"%016x" % i for i in range(90_000, 90_700)]
    runs = node_digests(disk + memory)
    assert (runs[0].low, runs[0].high, runs[0].count) == (memory[0], memory[-1], 600)
    assert (runs[-1].low, runs[-1].high, runs[-1].count) == (disk[0], disk[-1], 700)
    assert len(runs) == 2  # contiguous ids are never cut
    scattered = [b"%016x" % (i * i) for i in range(100)]
    assert len(node_digests(scattered)) == MAX_BUCKETS
    assert sum(d.count for d in node_digests(scattered)) == 100
    assert node_digests([b"not-hex-id-%05d" % i for i in range(9)]) == [
        NodeDigest.of([b"not-hex-id-%05d" % i for i in range(9)])
    ]


def _key(item: tuple[str, bytes, int]) -> tuple[str, bytes, int]:
    return item


def _filter(ids_by_node: dict[str, list[bytes]], **kwargs: Any) -> RedeliveryFilter[Any]:
    offset = {"batch": 1, "nsqd": batch_digests(ids_by_node)}
    return RedeliveryFilter(digests_from_offset(json.loads(json.dumps(offset)), 16), _key, **kwargs)


def test_a_committed_batch_that_comes_back_whole_is_dropped_among_fresh_messages() -> None:
    batch = [("a:1", b"%016x" % i, 1) for i in range(10, 60)]
    flt = _filter({"a:1": [m[1] for m in batch]})
    again = [(a, i, 2) for a, i, _ in batch]
    fresh = [("a:1", b"%016x" % i, 1) for i in range(60, 80)]
    random.Random(1).shuffle(again)
    got_fresh, committed, released = flt.offer(again[:20] + fresh[:10], now=0.0)
    assert got_fresh == fresh[:10] and not committed and not released
    assert len(flt.pending()) == 20  # set aside, waiting for the rest of the batch
    got_fresh, committed, released = flt.offer(fresh[10:] + again[20:], now=1.0)
    assert got_fresh == fresh[10:] and not released
    assert sorted(committed) == sorted(again)
    assert not flt.active and flt.pending() == []


def test_what_came_after_the_batch_is_fresh_even_inside_its_id_range() -> None:
    """Fetched ahead before the stop (so redelivered too, attempts 2): the rest of nsqd's
    memory queue has ids between the batch's two runs, and is no candidate: the batch is
    still matched whole, and nothing is read twice."""
    memory = [b"%016x" % i for i in range(1000, 1600)]
    disk = [b"%016x" % i for i in range(90_000, 90_700)]
    flt = _filter({"a:1": memory + disk})
    ahead = [("a:1", b"%016x" % i, 2) for i in [*range(1600, 2000), *range(90_700, 90_900)]]
    again = [("a:1", i, 2) for i in memory + disk]
    stream = again + ahead
    random.Random(7).shuffle(stream)
    fresh, committed, released = flt.offer(stream, now=0.0)
    assert sorted(fresh) == sorted(ahead) and not released
    assert sorted(committed) == sorted(again)
    assert not flt.active and (flt.matched, flt.released) == (1300, 0)


def test_the_filter_waits_until_told_no_more_can_come() -> None:
    """Part of the batch went to another consumer of the channel (or was FIN'd before the
    stop): the filter keeps what came, however long it takes, until the caller settles that
    nsqd (its channel holds nothing more); then it is released, counted, never dropped."""
    ids = [b"%016x" % i for i in range(10)]
    flt = _filter({"a:1": ids, "b:2": ids})
    part = [("a:1", i, 2) for i in ids[:7]]
    assert flt.offer(part, now=0.0) == ([], [], [])
    assert flt.offer([], now=10_000.0) == ([], [], [])
    assert flt.active and flt.pending() == part and flt.last_candidate_at("a:1") == 0.0
    assert flt.settle("a:1") == part
    assert flt.released == 7 and flt.addresses() == ["b:2"]
    assert flt.offer([("a:1", ids[8], 2)], now=1.0) == ([("a:1", ids[8], 2)], [], [])


def test_candidates_nsqd_took_back_are_forgotten_until_they_come_again() -> None:
    """A candidate held past nsqd's max_msg_timeout is timed out and comes again: the old copy
    is forgotten, the new one completes the batch."""
    ids = [b"%016x" % i for i in range(4)]
    gone: set[int] = set()

    class Item(tuple):  # (address, id, attempts), told apart by identity
        pass

    flt = RedeliveryFilter(
        digests_from_offset({"nsqd": batch_digests({"a:1": ids})}, 16),
        _key,
        gone=lambda item: id(item) in gone,
    )
    first = [Item(("a:1", i, 2)) for i in ids[:3]]
    assert flt.offer(first, now=0.0) == ([], [], [])
    gone.add(id(first[0]))  # nsqd took it back
    again = [Item(("a:1", ids[0], 3)), Item(("a:1", ids[3], 2))]
    fresh, committed, released = flt.offer(again, now=1.0)
    assert not fresh and not released
    assert sorted(map(id, committed)) == sorted(map(id, [*first[1:], *again]))


def test_a_run_that_cannot_match_is_released_and_later_arrivals_in_it_counted() -> None:
    ids = [b"%016x" % i for i in range(10, 20)]
    flt = _filter({"a:1": ids})
    stray = ("a:1", b"%016x" % 15, 3)  # same id range, one more than the batch had
    items = [("a:1", i, 2) for i in ids[:9]] + [stray]
    fresh, committed, released = flt.offer(items, now=0.0)
    assert not fresh and not committed and sorted(released) == sorted(items)
    late = ("a:1", ids[9], 2)
    assert flt.offer([late], now=1.0) == ([late], [], [])
    assert flt.released == 11 and flt.active  # counted until the nsqd is settled
    assert flt.settle("a:1") == [] and not flt.active


@settings(max_examples=300, deadline=None)
@given(
    committed=st.sets(st.integers(0, 400), min_size=1, max_size=60),
    others=st.sets(st.integers(0, 400), max_size=60),
    returned=st.floats(0.0, 1.0),
    chunks=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_the_filter_never_drops_a_message_outside_the_committed_batch(
    committed: set[int], others: set[int], returned: float, chunks: int, seed: int
) -> None:
    """Any committed batch, any share of it coming back, mixed with other messages (first
    deliveries, and redeliveries with ids in and out of its range) in any order and chunks:
    only the committed batch's messages are ever dropped, each message comes out exactly once,
    and a batch that comes back whole among first deliveries only is dropped."""
    rng = random.Random(seed)
    batch_ids = [b"%016x" % i for i in sorted(committed)]
    flt: RedeliveryFilter[tuple[str, bytes, int]] = _filter({"a:1": batch_ids})
    back = [("a:1", i, 2) for i in batch_ids if rng.random() < returned]
    foreign = [("a:1", b"%016x" % i, rng.choice([1, 2, 3])) for i in sorted(others - committed)]
    stream = back + foreign
    rng.shuffle(stream)
    out: dict[str, list[Any]] = {"fresh": [], "committed": [], "released": []}
    now = 0.0
    size = max(1, len(stream) // chunks)
    for start in range(0, len(stream) or 1, size):
        fresh, dropped, released = flt.offer(stream[start : start + size], now)
        out["fresh"] += fresh
        out["committed"] += dropped
        out["released"] += released
        now += 1.0
    out["released"] += flt.settle_all()
    assert set(out["committed"]) <= set(back), "dropped a message that was not committed"
    everything = out["fresh"] + out["committed"] + out["released"]
    assert sorted(everything) == sorted(stream) and flt.pending() == []
    assert flt.matched == len(out["committed"])
    if len(back) == len(batch_ids) and all(a == 1 for _, _, a in foreign):
        assert sorted(out["committed"]) == sorted(back)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5000), max_size=300),
    parts=st.integers(1, 20),
    cap=st.integers(1, 20_000),
)
def test_partitions_keep_every_row_in_order_within_the_byte_cap(
    sizes: list[int], parts: int, cap: int
) -> None:
    bounds = split_bounds(sizes, parts, cap)
    assert [i for b in bounds for i in range(*b)] == list(range(len(sizes)))
    for start, end in bounds:
        assert end > start
        assert sum(sizes[start:end]) <= cap or end == start + 1  # one row above the cap: alone
    if sum(sizes) <= cap:
        assert len(bounds) == min(parts, len(sizes))


def test_a_large_batch_is_cut_into_tasks_under_the_byte_cap() -> None:
    """20,000 messages of 1.5 KB (30 MB) with partitions=1 and a 1 MiB cap: every task's
    pickled partition (what Spark ships in the task) stays under the cap, every row is there,
    in order."""
    import pickle

    from transports.spark import ReadOptions
    from transports.spark.reader import NSQStreamReader, _Held

    options = ReadOptions.parse(
        {
            "topic": "t",
            "channel": "c",
            "nsqd": "10.0.0.1:4150",
            "max_in_flight": "20000",
            "max_partition_bytes": str(1 << 20),
        }
    )
    reader = NSQStreamReader(options)
    deliveries = [
        Deliver(0, CoreMessage(b"%016x" % i, b"%05d" % i + b"x" * 1500, i, 1), NODES[0], 0.0, 60.0)
        for i in range(20_000)
    ]
    reader._batches[1] = _Held(deliveries, deliveries, _Nodes(deliveries))  # type: ignore[arg-type]
    parts = reader.partitions({"batch": 0}, {"batch": 1})
    sizes = [len(pickle.dumps(p)) for p in parts]
    assert len(parts) >= 30 and max(sizes) <= 1 << 20, (len(parts), max(sizes))
    bodies = [b for p in parts for b in p.batch.column("body").to_pylist()]  # type: ignore[attr-defined]
    assert bodies == [d.body for d in deliveries]

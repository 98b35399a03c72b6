"""Offsets stay small at any batch size, and still let a restarted query drop the
redeliveries of its last committed batch (no Spark session: the pieces on their own)."""

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
    NodeDigest,
    RedeliveryFilter,
    batch_digests,
    digests_from_offset,
)
from transports.spark.reader import _Nodes, _offset, _record_batch
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
def test_an_offset_entry_is_a_few_hundred_bytes_at_any_batch_size(rows: int) -> None:
    entry = json.dumps(_offset(7, _messages(rows)))
    assert len(entry) < 400, entry  # was 16 bytes per message: 1.6 MB for 100,000 rows
    back = json.loads(entry)
    assert back["batch"] == 7 and back["count"] == rows
    digests = digests_from_offset(back, 16)
    assert sum(d.count for d in digests.values()) == rows


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
        "10.0.0.1:4150": NodeDigest.of([d.id for d in deliveries[0::2]]),
        "10.0.0.2:4150": NodeDigest.of([d.id for d in deliveries[1::2]]),
    }
    one = _Nodes(deliveries[0::2])  # one nsqd over 20 connections: no per-row codes
    assert one.names == ["10.0.0.1:4150"] and one.codes is None


def test_an_old_offset_with_every_id_is_read_as_digests() -> None:
    ids = [b"%016x" % i for i in (5, 1, 9)]
    old = {"batch": 3, "ids": {"10.0.0.1:4150": b"".join(ids).decode()}}
    (digest,) = digests_from_offset(old, 16).values()
    assert digest == NodeDigest.of(ids) and digest.count == 3
    assert digest.low == ids[1] and digest.high == ids[2]


def _key(item: tuple[str, bytes, int]) -> tuple[str, bytes, int]:
    return item


def test_a_committed_batch_that_comes_back_whole_is_dropped_among_fresh_messages() -> None:
    batch = [("a:1", b"%016x" % i, 1) for i in range(10, 60)]
    digests = {
        a: NodeDigest.from_json(d) for a, d in batch_digests({"a:1": [m[1] for m in batch]}).items()
    }
    flt = RedeliveryFilter(digests, _key, patience=10.0)
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


def test_a_batch_that_does_not_come_back_whole_is_read_after_the_patience() -> None:
    """Part of it went to another consumer of the channel (or was FIN'd before the stop):
    what came is released, as duplicates, never dropped."""
    ids = [b"%016x" % i for i in range(10)]
    flt = RedeliveryFilter({"a:1": NodeDigest.of(ids)}, _key, patience=10.0)
    part = [("a:1", i, 2) for i in ids[:7]]
    assert flt.offer(part, now=0.0) == ([], [], [])
    assert flt.offer([], now=9.0) == ([], [], [])
    assert flt.offer([], now=10.0) == ([], [], part)
    assert not flt.active


def test_the_filter_gives_up_once_no_redelivery_can_come_any_more() -> None:
    ids = [b"%016x" % i for i in range(5)]
    flt = RedeliveryFilter({"a:1": NodeDigest.of(ids)}, _key, patience=3.0, give_up_at=30.0)
    late = [("a:1", ids[0], 2)]
    assert flt.offer([], now=29.0) == ([], [], []) and flt.active
    assert flt.offer(late, now=30.0) == (late, [], [])  # too late to be a redelivery
    assert not flt.active


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
    flt: RedeliveryFilter[tuple[str, bytes, int]] = RedeliveryFilter(
        {"a:1": NodeDigest.of(batch_ids)}, _key, patience=5.0
    )
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
    out["released"] += flt.expire(now + 10.0)
    assert set(out["committed"]) <= set(back), "dropped a message that was not committed"
    everything = out["fresh"] + out["committed"] + out["released"]
    assert sorted(everything) == sorted(stream) and flt.pending() == []
    if len(back) == len(batch_ids) and all(a == 1 for _, _, a in foreign):
        assert sorted(out["committed"]) == sorted(back)

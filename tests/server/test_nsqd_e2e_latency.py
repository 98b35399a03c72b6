"""End-to-end processing latency percentiles in the pure nsqd role: the quantile summary's
accuracy and memory bound, the window, and what ``stats`` reports (the real nsqd's shape is
checked against the real binary in ``tests/embedded/test_e2e_latency.py``)."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio import frames
from nsq_sansio.errors import ConfigError
from nsq_sansio.server import NSQD, NSQDOptions
from nsq_sansio.server.quantile import EPSILON, LatencyWindow, QuantileStream, merged_result

from ._wire import Client

TARGETS = (0.99, 0.95, 0.5)


def _rank_error(data: list[int], value: float, quantile: float) -> float:
    """How far (as a fraction of the count) ``value`` is from the ``quantile`` rank."""
    ordered = sorted(data)
    low = sum(1 for v in ordered if v < value)
    high = sum(1 for v in ordered if v <= value)
    wanted = quantile * len(ordered)
    if low <= wanted <= high:
        return 0.0
    return min(abs(wanted - low), abs(wanted - high)) / len(ordered)


@settings(max_examples=60, deadline=None)
@given(
    data=st.lists(st.integers(0, 10**9), min_size=1, max_size=3000),
    split=st.integers(0, 3000),
)
def test_each_target_is_within_its_rank_error_also_after_merging(
    data: list[int], split: int
) -> None:
    whole = QuantileStream(TARGETS)
    for value in data:
        whole.insert(value)
    # two streams merged, as a topic merges its channels
    left, right = QuantileStream(TARGETS), QuantileStream(TARGETS)
    for value in data[:split]:
        left.insert(value)
    for value in data[split:]:
        right.insert(value)
    merged = QuantileStream(TARGETS)
    merged.merge(left.samples() + right.samples())
    for stream in (whole, merged):
        assert len(stream) == len(data)
        for quantile in TARGETS:
            # the summary's bound, plus the query's rounding on small counts
            bound = 2 * EPSILON + 2.5 / len(data)
            assert _rank_error(data, stream.query(quantile), quantile) <= bound


def test_memory_stays_bounded_and_inserting_stays_cheap() -> None:
    rng = random.Random(3)
    stream = QuantileStream(TARGETS)
    started = time.perf_counter()
    for _ in range(200_000):
        stream.insert(rng.expovariate(1 / 1e6))
    elapsed = time.perf_counter() - started
    assert len(stream) == 200_000
    assert len(stream.samples()) < 1500  # not 200,000: logarithmic in the count
    assert elapsed < 20  # a few microseconds a value (generous for a loaded machine)


def test_small_counts_and_the_maximum() -> None:
    empty = QuantileStream((1.0, 0.5))
    assert (len(empty), empty.query(1.0), empty.query(0.5)) == (0, 0, 0)
    single = QuantileStream((1.0, 0.5))
    single.insert(7)
    assert (single.query(1.0), single.query(0.5)) == (7, 7)
    top = QuantileStream((1.0,))
    for value in range(10_000):
        top.insert(value)
    assert top.query(1.0) == 9_999  # the maximum, in one summary entry
    assert len(top.samples()) == 1


def test_the_window_keeps_half_to_all_of_it_and_skips_long_idle_periods() -> None:
    window = LatencyWindow((1.0,), 10.0, now=0.0)
    window.insert(5, now=1.0)
    assert merged_result((1.0,), [window], 5.0)["count"] == 1
    window.insert(9, now=6.0)  # the other half
    assert merged_result((1.0,), [window], 10.0)["count"] == 2
    assert merged_result((1.0,), [window], 10.1)["count"] == 1  # the first half went
    assert merged_result((1.0,), [window], 15.1)["count"] == 0
    started = time.perf_counter()
    window.insert(3, now=1e9)  # a long idle period: not a billion window moves
    assert time.perf_counter() - started < 0.1
    result = merged_result((1.0,), [window], 1e9)
    assert result == {"count": 1, "percentiles": [{"quantile": 1, "value": 3}]}


def _node(**options: object) -> NSQD:
    return NSQD(NSQDOptions(**options), random.Random(1), epoch_offset=1000.0)  # type: ignore[arg-type]


def test_stats_report_publish_to_fin_latencies_per_channel_and_topic() -> None:
    node = _node(e2e_processing_latency_percentiles=[0.5, 1.0], msg_timeout=60.0)
    producer, fast, slow = Client(node), Client(node), Client(node)
    fast.sub("t", "fast", rdy=10)
    slow.sub("t", "slow", rdy=10)
    producer.send(frames.encode_pub("t", b"a") + frames.encode_pub("t", b"b"), now=0.0)
    for consumer, at in ((fast, 0.25), (slow, 2.0)):
        for message in consumer.messages():
            consumer.send(frames.encode_fin(message.id), now=at)
    (topic,) = node.stats(2.0)["topics"]
    channels = {c["channel_name"]: c["e2e_processing_latency"] for c in topic["channels"]}
    assert channels == {
        "fast": {"count": 2, "percentiles": [q(1, 250_000_000), q(0.5, 250_000_000)]},
        "slow": {"count": 2, "percentiles": [q(1, 2_000_000_000), q(0.5, 2_000_000_000)]},
    }
    merged = topic["e2e_processing_latency"]
    assert merged["count"] == 4
    assert merged["percentiles"][0] == q(1, 2_000_000_000)
    # requeues and timeouts are not processing: only FINs count
    producer.send(frames.encode_pub("t", b"c"), now=3.0)
    (message,) = fast.messages()
    fast.send(frames.encode_req(message.id, 0), now=3.5)
    (stats,) = node.stats(3.5, topic="t", channel="fast")["topics"]
    assert stats["channels"][0]["e2e_processing_latency"]["count"] == 2
    assert stats["e2e_processing_latency"]["count"] == 4  # all its channels, as nsqd


def q(quantile: float, value: int) -> dict[str, float]:
    return {"quantile": quantile, "value": value}


def test_off_by_default_and_with_no_channel() -> None:
    node = _node()
    Client(node).sub("t", "c")
    (topic,) = node.stats(0.0)["topics"]
    off = {"count": 0, "percentiles": None}
    assert topic["e2e_processing_latency"] == off
    assert topic["channels"][0]["e2e_processing_latency"] == off
    tracked = _node(e2e_processing_latency_percentiles=(0.9,))
    tracked.create_topic("lonely", 0.0)
    (lonely,) = tracked.stats(0.0)["topics"]
    assert lonely["e2e_processing_latency"] == off  # nsqd: no channel, nothing to merge


@pytest.mark.parametrize("bad", [(0.0,), (1.01,), (-1.0,), ("0.5",), (True,), "0.5"])
def test_percentiles_outside_zero_to_one_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        NSQDOptions(e2e_processing_latency_percentiles=bad)  # type: ignore[arg-type]
    assert NSQDOptions(
        e2e_processing_latency_percentiles=[0.5, 1]
    ).e2e_processing_latency_percentiles == (1.0, 0.5)

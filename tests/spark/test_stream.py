"""Streaming read and write against embedded nsqd: exact sets, FIN after commit, restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from .helpers import channel_stats, drain, message_count, publish, wait_for

pytestmark = pytest.mark.spark


def _source(spark: Any, servers: list[Any], topic: str, channel: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd", ",".join(s.tcp_address for s in servers))
        .option("nsqd_http", ",".join(s.http_address for s in servers))
        .option("topic", topic)
        .option("channel", channel)
    )
    options.setdefault("wait_timeout", "0.5")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _publish_to_channel(servers: list[Any], topic: str, channel: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` once ``channel`` exists (a warm-up message, consumed), so that the
    channel gets every one of them."""
    publish(servers, topic, [b"warmup"])
    drain(servers, topic, channel, idle=0.3)
    publish(servers, topic, bodies)


def _in_flight(servers: list[Any], topic: str, channel: str) -> int:
    return sum(int(channel_stats(s, topic, channel).get("in_flight_count", 0)) for s in servers)


def _depth(servers: list[Any], topic: str, channel: str) -> int:
    return sum(int(channel_stats(s, topic, channel).get("depth", 0)) for s in servers)


def test_available_now_reads_exactly_the_published_set(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    topic, channel = "stream_exact", "spark"
    bodies = [b"msg-%05d" % i for i in range(3000)]
    _publish_to_channel(nsqd_pair, topic, channel, bodies)

    df = _source(
        spark,
        nsqd_pair,
        topic,
        channel,
        max_in_flight="800",
        max_messages_per_trigger="700",
        partitions="3",
    )
    query = (
        df.writeStream.format("memory")
        .queryName("exact")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    rows = spark.sql("select id, body, timestamp, attempts, topic, channel, nsqd from exact")
    got = rows.collect()
    assert sorted(bytes(r.body) for r in got) == sorted(bodies)
    assert len({(r.nsqd, r.id) for r in got}) == len(bodies)
    assert {r.topic for r in got} == {topic} and {r.channel for r in got} == {channel}
    assert {r.nsqd for r in got} == {s.tcp_address for s in nsqd_pair}
    assert all(r.attempts == 1 and len(r.id) == 16 for r in got)
    assert all(abs(r.timestamp.timestamp() - time.time()) < 600 for r in got)
    # batches were bounded by max_messages_per_trigger
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == len(bodies) and max(sizes) <= 700 and len(sizes) >= 5
    # everything was FIN'd, the last batch included, once the query ended
    assert _in_flight(nsqd_pair, topic, channel) == 0
    assert _depth(nsqd_pair, topic, channel) == 0
    # the lag in the query's progress, as each batch was taken: the channel's depth falls
    lags = [json.loads(p["sources"][0]["latestOffset"]) for p in query.recentProgress]
    depths = [lag["depth"] for lag in lags if lag]
    assert depths == sorted(depths, reverse=True) and depths[-1] < depths[0]
    assert set(lags[-1]["nsqd"]) == {s.tcp_address for s in nsqd_pair}
    assert lags[-1]["requeued_since_start"] == 0 == lags[-1]["taken_back_before_commit"]


def test_idle_stream_fins_its_last_batch_and_touches_held_messages(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    """msg_timeout=1s while each batch takes 2.5s: TOUCH keeps them (the batch's own, and the
    ones fetched ahead for the next); FIN follows the commit even when no more data comes (the
    query keeps running, idle). Two batches: each 2.5 s of waiting is the test's cost."""
    from pyspark.sql import DataFrame

    topic, channel = "stream_idle", "spark"
    bodies = [b"idle-%03d" % i for i in range(40)]
    _publish_to_channel(nsqd_pair[:1], topic, channel, bodies)
    seen: list[tuple[str, int]] = []

    def slow(batch: DataFrame, batch_id: int) -> None:
        seen.extend((r.id, r.attempts) for r in batch.select("id", "attempts").collect())
        time.sleep(2.5)

    df = _source(
        spark,
        nsqd_pair[:1],
        topic,
        channel,
        max_in_flight="40",
        max_messages_per_trigger="25",
        msg_timeout="1",
    )
    query = (
        df.writeStream.foreachBatch(slow)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(seen) >= len(bodies), 90, "all messages to be processed")
        # idle now: the last batch's messages must be FIN'd while the query keeps running
        wait_for(lambda: _in_flight(nsqd_pair[:1], topic, channel) == 0, 20, "FIN of last batch")
        assert query.isActive
    finally:
        query.stop()
    assert sorted(i for i, _ in seen) == sorted({i for i, _ in seen})  # no redelivery
    assert all(attempts == 1 for _, attempts in seen)
    stats = channel_stats(nsqd_pair[0], topic, channel)
    assert stats["timeout_count"] == 0 and stats["depth"] == 0


def test_restart_after_a_batch_that_was_not_committed(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    """The query dies after batch 2 was processed, before its commit; the restarted query reads
    every message not committed (nsqd redelivers them) and none that was committed."""
    from pyspark.sql import DataFrame

    topic, channel = "stream_restart", "spark"
    bodies = [b"r-%04d" % i for i in range(1000)]
    _publish_to_channel(nsqd_pair, topic, channel, bodies)
    checkpoint = str(tmp_path / "ckpt")
    first: dict[int, list[bytes]] = {}

    def crash_on_batch_2(batch: DataFrame, batch_id: int) -> None:
        first[batch_id] = [bytes(r.body) for r in batch.select("body").collect()]
        if batch_id == 2:
            raise RuntimeError("simulated crash between the batch and its commit")

    # Spark kills the source's process when a query ends: nothing is REQ'd, nsqd takes the
    # messages back after msg_timeout (short here; a TOUCH thread keeps held ones alive).
    options = {"max_in_flight": "200", "max_messages_per_trigger": "150", "msg_timeout": "2"}
    query = (
        _source(spark, nsqd_pair, topic, channel, **options, wait_timeout="0.5")
        .writeStream.foreachBatch(crash_on_batch_2)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    with pytest.raises(Exception, match="simulated crash"):
        query.awaitTermination(120)
    assert sorted(first) == [0, 1, 2]
    committed = set(first[0]) | set(first[1])
    assert len(committed) == 300
    # The dead query's batch 2 (and what it fetched ahead) comes back once nsqd times it out:
    # wait for that, or a restarted query that reads the rest quickly (availableNow) may end
    # before the redeliveries arrive and miss them (a race in the test, not a loss).
    wait_for(lambda: _in_flight(nsqd_pair, topic, channel) == 0, 30, "held messages taken back")

    second: list[bytes] = []

    def record(batch: DataFrame, batch_id: int) -> None:
        second.extend(bytes(r.body) for r in batch.select("body").collect())

    query = (
        _source(spark, nsqd_pair, topic, channel, **options, wait_timeout="3")
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert not committed & set(second), "a committed message was read again"
    assert committed | set(second) == set(bodies), "a message was lost"
    assert set(first[2]) <= set(second), "the uncommitted batch was not redelivered"
    assert len(second) == len(set(second))
    assert _in_flight(nsqd_pair, topic, channel) == 0


def test_restart_after_commit_but_before_fin_reads_nothing_again(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    """Stopped after its last batch was committed but before the next trigger (which would FIN
    it): nsqd redelivers the messages, and the restarted source drops them as committed."""
    from pyspark.sql import DataFrame

    topic, channel = "stream_stopped", "spark"
    bodies = [b"s-%03d" % i for i in range(100)]
    _publish_to_channel(nsqd_pair[:1], topic, channel, bodies)
    checkpoint = str(tmp_path / "ckpt")
    runs: list[list[bytes]] = [[], []]

    def record(run: int) -> Any:
        def sink(batch: DataFrame, batch_id: int) -> None:
            runs[run].extend(bytes(r.body) for r in batch.select("body").collect())

        return sink

    query = (
        _source(
            spark, nsqd_pair[:1], topic, channel, max_in_flight="100", linger="1", msg_timeout="2"
        )
        .writeStream.foreachBatch(record(0))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 hour")  # no second trigger: the batch stays unFIN'd
        .start()
    )
    wait_for(lambda: query.lastProgress is not None, 60, "the first batch")
    assert sorted(runs[0]) == bodies
    query.stop()  # Spark kills the source's process: nsqd takes the batch back after 2s
    wait_for(lambda: _depth(nsqd_pair[:1], topic, channel) == 100, 15, "msg_timeout")

    query = (
        _source(spark, nsqd_pair[:1], topic, channel)
        .writeStream.foreachBatch(record(1))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert runs[1] == []
    assert _depth(nsqd_pair[:1], topic, channel) == 0
    assert _in_flight(nsqd_pair[:1], topic, channel) == 0


def test_streaming_write_publishes_every_micro_batch(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    topic = "stream_write"
    source_dir = tmp_path / "in"
    source_dir.mkdir()
    expected = []
    for part in range(3):
        lines = [{"key": f"k{part}", "n": i} for i in range(400)]
        expected += [json.dumps(x, separators=(",", ":")).encode() for x in lines]
        (source_dir / f"part{part}.json").write_text("\n".join(json.dumps(x) for x in lines))
    df = (
        spark.readStream.schema("key string, n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source_dir))
    )
    query = (
        df.writeStream.format("nsq")
        .option("nsqd", ",".join(s.tcp_address for s in nsqd_pair))
        .option("topic", topic)
        .option("serialization", "json")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 3
    assert message_count(nsqd_pair, topic) == 1200
    assert sorted(drain(nsqd_pair, topic, "check")) == sorted(expected)


def test_two_queries_on_one_channel_share_the_work(
    spark: Any, nsqd_pair: list[Any], tmp_path: Path
) -> None:
    """Reads scale out the NSQ way: two streaming queries (each its own consumers, as separate
    Spark applications would be) on the same channel split its messages; together they read
    every one, and here each exactly once."""
    from pyspark.sql import DataFrame

    topic, channel = "stream_shared", "spark"
    bodies = [b"sh-%04d" % i for i in range(1200)]
    _publish_to_channel(nsqd_pair, topic, channel, bodies)
    sinks: list[list[bytes]] = [[], []]

    def sink(index: int) -> Any:
        def record(batch: DataFrame, batch_id: int) -> None:
            sinks[index].extend(bytes(r.body) for r in batch.select("body").collect())
            time.sleep(0.1)  # some work per batch, so that neither drains it all alone

        return record

    queries = [
        _source(
            spark,
            nsqd_pair,
            topic,
            channel,
            max_in_flight="150",
            wait_timeout="1",
        )
        .writeStream.foreachBatch(sink(index))
        .option("checkpointLocation", str(tmp_path / f"ckpt{index}"))
        .trigger(availableNow=True)
        .start()
        for index in range(2)
    ]
    for query in queries:
        assert query.awaitTermination(120)
        assert query.exception() is None
    assert all(sinks), f"a query read nothing: {[len(s) for s in sinks]}"
    assert set(sinks[0]) | set(sinks[1]) == set(bodies), "a message was lost"
    assert len(sinks[0]) + len(sinks[1]) == len(bodies)
    assert _in_flight(nsqd_pair, topic, channel) == 0
    assert _depth(nsqd_pair, topic, channel) == 0

"""The source's consumer on its own (no Spark): what a micro-batch relies on."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from transports.spark import NSQOptionError, ReadOptions
from transports.spark._source import SourceConsumer

from .helpers import channel_stats, create_channel, hold_and_crash, publish, wait_for

pytestmark = pytest.mark.spark


def _consumer(**options: str) -> SourceConsumer:
    return SourceConsumer(ReadOptions.parse({"channel": "c", **options}))


def test_dead_nsqd_in_the_list_does_not_stop_the_others(nsqd_pair: list[Any]) -> None:
    live = nsqd_pair[0]
    create_channel(live, "mixed", "c")
    publish([live], "mixed", [b"%d" % i for i in range(300)])
    consumer = _consumer(topic="mixed", nsqd=f"127.0.0.1:1,{live.tcp_address}")
    consumer.start()
    try:
        got: list[Any] = []
        while len(got) < 300:
            batch = consumer.take(300 - len(got), 2.0)
            assert batch, "the live nsqd stopped delivering"
            got += batch
        assert consumer.connected() == [live.tcp_address]
        assert consumer.finish(got) == 300
    finally:
        consumer.close()


def test_held_messages_survive_many_msg_timeouts_and_fin_after(nsqd_pair: list[Any]) -> None:
    """Held for 3.5 s with a 1 s msg_timeout: TOUCH keeps them; FIN then clears the channel."""
    server = nsqd_pair[1]
    create_channel(server, "held", "c")
    publish([server], "held", [b"h%d" % i for i in range(50)])
    consumer = _consumer(topic="held", nsqd=server.tcp_address, max_in_flight="50", msg_timeout="1")
    consumer.start()
    try:
        held = consumer.take(50, 2.0, 0.2)
        assert len(held) == 50
        time.sleep(3.5)
        stats = channel_stats(server, "held", "c")
        assert stats["timeout_count"] == 0 and stats["in_flight_count"] == 50
        assert consumer.touches >= 2 * 50
        assert consumer.finish(held) == 50
        wait_for(lambda: channel_stats(server, "held", "c")["in_flight_count"] == 0, 5, "FIN")
        assert channel_stats(server, "held", "c")["depth"] == 0
    finally:
        consumer.close()


def test_max_in_flight_above_max_rdy_count_runs_several_consumers(
    nsqd_pair: list[Any],
) -> None:
    """nsqd lets one connection hold max_rdy_count (2500) messages; a batch of 6000 from one
    nsqd takes three consumers (three connections), all held at once."""
    server = nsqd_pair[0]
    create_channel(server, "wide", "c")
    publish([server], "wide", [b"w%d" % i for i in range(6000)])
    consumer = _consumer(topic="wide", nsqd=server.tcp_address, max_in_flight="6000")
    consumer.start()
    try:
        assert consumer.consumer_count == 3
        got: list[Any] = []
        while len(got) < 6000:
            batch = consumer.take(6000 - len(got), 2.0, 0.5)
            assert batch
            got += batch
        assert len({m.id for m in got}) == 6000
        assert channel_stats(server, "wide", "c")["in_flight_count"] == 6000
        assert consumer.finish(got) == 6000
        wait_for(lambda: channel_stats(server, "wide", "c")["in_flight_count"] == 0, 5, "FIN")
    finally:
        consumer.close()


def test_missing_nsqd_is_a_clear_error() -> None:
    consumer = _consumer(topic="t", nsqd="127.0.0.1:1", connect_timeout="0.5")
    with pytest.raises(Exception, match=r"could not subscribe to 't'/'c' on any nsqd"):
        consumer.start()
    consumer.close()


def test_prefetched_messages_held_too_long_go_back_to_nsqd() -> None:
    """Messages fetched ahead wait for the next trigger; past half of nsqd's max_msg_timeout
    (TOUCH cannot keep them much longer) they are requeued and read fresh, never handed out
    stale."""
    from transports.embedded import EmbeddedNSQD, ServerThread

    with ServerThread(EmbeddedNSQD(msg_timeout=1.0, max_msg_timeout=2.0)) as server:
        create_channel(server, "ahead", "c")
        publish([server], "ahead", [b"a%d" % i for i in range(20)])
        consumer = _consumer(
            topic="ahead", nsqd=server.tcp_address, max_in_flight="20", msg_timeout="1"
        )
        consumer.start()
        try:
            first = consumer.take(10, 2.0, 0.3, prefetch=10)
            assert len(first) == 10 and consumer.finish(first) == 10
            time.sleep(1.3)  # the 10 fetched ahead pass max_msg_timeout / 2 = 1 s
            second = consumer.take(10, 2.0, 0.3)
            assert len(second) == 10 and all(m.attempts == 2 for m in second)
            assert consumer.finish(second) == 10
            wait_for(lambda: channel_stats(server, "ahead", "c")["in_flight_count"] == 0, 5, "FIN")
            stats = channel_stats(server, "ahead", "c")
            assert stats["depth"] == 0 and stats["requeue_count"] == 10
        finally:
            consumer.close()


def test_collector_threshold_raised_while_a_source_runs_and_put_back(
    nsqd_pair: list[Any],
) -> None:
    """A source holds whole batches (two tracked objects per message): while one runs, the
    collector's first threshold is at least gc_threshold, and the last source to close puts
    the thresholds back; gc_threshold=0 leaves the collector alone."""
    server = nsqd_pair[0]
    create_channel(server, "gcsrc", "c")
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        first = _consumer(topic="gcsrc", nsqd=server.tcp_address)
        second = _consumer(topic="gcsrc", nsqd=server.tcp_address, gc_threshold="20000")
        untouched = _consumer(topic="gcsrc", nsqd=server.tcp_address, gc_threshold="0")
        untouched.start()
        assert gc.get_threshold() == (700, 10, 10)
        first.start()
        assert gc.get_threshold() == (50_000, 10, 10)
        second.start()  # the first one's setting holds until both are closed
        assert gc.get_threshold() == (50_000, 10, 10)
        first.close()
        assert gc.get_threshold() == (50_000, 10, 10)
        first.close()  # closing twice releases once
        second.close()
        assert gc.get_threshold() == (700, 10, 10)
        untouched.close()
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(NSQOptionError, match="gc_threshold"):
            ReadOptions.parse({"topic": "t", "channel": "c", "nsqd": "a:1", "gc_threshold": "-1"})
    finally:
        gc.set_threshold(*before)


def test_a_message_that_cannot_fit_in_a_task_is_refused_before_anything_is_read() -> None:
    """nsqd accepts messages of up to 2 MiB (--max-msg-size) but a task may carry 1 MiB: the
    first trigger fails with what to change, and no message was taken from the channel."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from transports.embedded import EmbeddedNSQD, ServerThread
    from transports.spark import NSQStreamReader

    with ServerThread(EmbeddedNSQD(max_msg_size=2 << 20)) as server:
        create_channel(server, "huge", "c")
        publish([server], "huge", [b"h%d" % i for i in range(10)])
        options = {
            "topic": "huge",
            "channel": "c",
            "nsqd": server.tcp_address,
            "nsqd_http": server.http_address,
        }
        reader = NSQStreamReader(
            ReadOptions.parse({**options, "max_partition_bytes": str(1 << 20)})
        )
        try:
            with pytest.raises(NSQOptionError, match=r"accepts messages of up to 2097152 bytes"):
                reader.latestOffset({"batch": 0}, ReadAllAvailable())
        finally:
            reader.stop()
        stats = channel_stats(server, "huge", "c")
        assert stats["depth"] == 10 and stats["in_flight_count"] == 0
        # with room for such a message, the same reader reads
        reader = NSQStreamReader(
            ReadOptions.parse({**options, "max_partition_bytes": str(3 << 20)})
        )
        try:
            end = reader.latestOffset({"batch": 0}, ReadAllAvailable())
            assert end["count"] == 10
        finally:
            reader.stop()


@pytest.mark.parametrize("fail", [False, True])
def test_a_batch_nsqd_took_back_before_its_commit_is_reported_or_fails(
    fail: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """nsqd keeps a message max_msg_timeout (2 s here) at most, TOUCH or not: a batch whose
    commit comes later was timed out and will be delivered again. The commit counts it (in
    the log and the lag), or, with failOnDataLoss, fails the query."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from transports.embedded import EmbeddedNSQD, ServerThread
    from transports.spark import NSQDataLossError, NSQStreamReader

    with ServerThread(EmbeddedNSQD(msg_timeout=1.0, max_msg_timeout=2.0)) as server:
        create_channel(server, "late", "c")
        publish([server], "late", [b"l%d" % i for i in range(20)])
        options = {
            "topic": "late",
            "channel": "c",
            "nsqd": server.tcp_address,
            "nsqd_http": server.http_address,
            "msg_timeout": "1",
            "touch_interval": "0.3",
            "failOnDataLoss": str(fail).lower(),
        }
        reader = NSQStreamReader(ReadOptions.parse(options))
        try:
            end = reader.latestOffset({"batch": 0}, ReadAllAvailable())
            assert end["count"] == 20
            wait_for(
                lambda: channel_stats(server, "late", "c")["timeout_count"] == 20, 10, "timeout"
            )
            if fail:
                with pytest.raises(NSQDataLossError, match="20 of 20 messages"):
                    reader.latestOffset(end, ReadAllAvailable())
                return
            with caplog.at_level("WARNING", logger="nsq_sansio.spark.reader"):
                again = reader.latestOffset(end, ReadAllAvailable())
            assert "20 of 20 messages of committed batches" in caplog.text
            assert again["count"] == 20  # delivered again: read twice
            lag = reader.reportLatestOffset()
            assert lag is not None and lag["taken_back_before_commit"] == 20
            assert lag["timed_out_since_start"] == 20
        finally:
            reader.stop()


def test_available_now_reads_what_the_channel_held_at_its_start(nsqd_pair: list[Any]) -> None:
    """A consumer died holding 100 of the 300 messages: nsqd gives them back only after their
    2 s timeout. availableNow (driven as Spark does) reads the 200 queued at once, waits for
    those 100 (the channel's /stats counted them at the start), then stops at once, without
    waiting wait_timeout."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from transports.spark import NSQStreamReader

    server = nsqd_pair[1]
    bodies = [b"held-%04d" % i for i in range(300)]
    create_channel(server, "heldback", "c")
    publish([server], "heldback", bodies)
    hold_and_crash(server.tcp_address, "heldback", "c", 100, msg_timeout=2.0)
    assert channel_stats(server, "heldback", "c")["in_flight_count"] == 100
    options = {
        "topic": "heldback",
        "channel": "c",
        "nsqd": server.tcp_address,
        "nsqd_http": server.http_address,
        "wait_timeout": "60",
    }
    reader = NSQStreamReader(ReadOptions.parse(options))
    reader.prepareForTriggerAvailableNow()
    offset: dict[str, Any] = {"batch": 0}
    read: list[bytes] = []
    started = time.monotonic()
    try:
        while True:
            end = reader.latestOffset(offset, ReadAllAvailable())
            if end == offset:
                break
            for part in reader.partitions(offset, end):
                read += part.batch.column("body").to_pylist()  # type: ignore[attr-defined]
            offset = end
    finally:
        reader.stop()
    assert sorted(read) == bodies
    assert time.monotonic() - started < 30, "waited wait_timeout after the last message"
    stats = channel_stats(server, "heldback", "c")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["timeout_count"] == 100

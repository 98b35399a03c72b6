"""Batch write: every row arrives, spread over the nsqd given, in MPUB batches."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from .helpers import drain, message_count

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("arrow", ["true", "false"])
def test_batch_write_100k_rows_arrives_complete(
    spark: Any, nsqd_pair: list[Any], arrow: str
) -> None:
    from pyspark.sql import functions as F

    topic = f"write100k_{arrow}"
    rows = 100_000
    df = spark.range(rows, numPartitions=4).select(
        F.format_string("event-%06d", F.col("id")).cast("binary").alias("body")
    )
    (
        df.write.format("nsq")
        .mode("append")
        .option("nsqd", ",".join(s.tcp_address for s in nsqd_pair))
        .option("topic", topic)
        .option("batch_size", "700")
        .option("batch_bytes", "16384")
        .option("arrow", arrow)
        .save()
    )
    assert message_count(nsqd_pair, topic) == rows
    # both nsqd took a share (partitions start on different nodes)
    assert all(message_count([s], topic) > 0 for s in nsqd_pair)
    bodies = drain(nsqd_pair, topic, "check")
    assert len(bodies) == rows
    assert set(bodies) == {b"event-%06d" % i for i in range(rows)}


def test_string_body_and_json_serialization(spark: Any, nsqd_pair: list[Any]) -> None:
    import json

    nsqd = nsqd_pair[0].tcp_address
    df = spark.createDataFrame([("héllo",), ("wörld",)], "body string")
    df.write.format("nsq").mode("append").option("nsqd", nsqd).option("topic", "strs").save()
    assert sorted(drain([nsqd_pair[0]], "strs", "c")) == sorted(
        ["héllo".encode(), "wörld".encode()]
    )

    rows = spark.createDataFrame(
        [(1, "a", b"\x00\x01"), (2, "b", None)], "key int, name string, raw binary"
    )
    (
        rows.write.format("nsq")
        .mode("append")
        .option("nsqd", nsqd)
        .option("topic", "jsons")
        .option("serialization", "json")
        .save()
    )
    decoded = sorted((json.loads(b) for b in drain([nsqd_pair[0]], "jsons", "c")), key=str)
    assert {"key": 1, "name": "a", "raw": "AAE="} in decoded
    assert {"key": 2, "name": "b", "raw": None} in decoded


def test_refused_publish_fails_the_job_with_the_nsqd_error(
    spark: Any, nsqd_pair: list[Any]
) -> None:
    """A body above nsqd's max_msg_size is refused (E_BAD_MESSAGE): the job fails with it."""
    nsqd = nsqd_pair[0].tcp_address
    big = spark.createDataFrame([(b"x" * (1024 * 1024 + 10),)], "body binary")
    with pytest.raises(Exception) as excinfo:
        big.write.format("nsq").mode("append").option("nsqd", nsqd).option(
            "topic", "toobig"
        ).option("batch_bytes", str(4 << 20)).save()
    text = str(excinfo.value)
    assert "E_BAD_MESSAGE" in text and "failed publishing" in text
    assert message_count(nsqd_pair, "toobig") == 0


def test_null_body_fails_instead_of_dropping(spark: Any, nsqd_pair: list[Any]) -> None:
    nsqd = nsqd_pair[0].tcp_address
    df = spark.createDataFrame([(b"ok",), (None,)], "body binary")
    with pytest.raises(Exception) as excinfo:
        df.coalesce(1).write.format("nsq").mode("append").option("nsqd", nsqd).option(
            "topic", "nulls"
        ).save()
    assert "null 'body'" in str(excinfo.value)


def test_write_fails_over_to_the_nsqd_that_answers(spark: Any, nsqd_pair: list[Any]) -> None:
    """One address of the list refuses connections: every partition publishes to the other."""
    from pyspark.sql import functions as F

    live = nsqd_pair[1]
    df = spark.range(5000, numPartitions=4).select(
        F.format_string("f-%d", "id").cast("binary").alias("body")
    )
    (
        df.write.format("nsq")
        .mode("append")
        .option("nsqd", f"127.0.0.1:1,{live.tcp_address}")
        .option("topic", "failover")
        .option("connect_timeout", "0.5")
        .save()
    )
    assert message_count([live], "failover") == 5000
    assert len(set(drain([live], "failover", "c"))) == 5000


def test_commit_reports_what_each_partition_published(
    nsqd_pair: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The driver-side commit/abort (run here directly, with what real partition writes to
    the embedded nsqd returned) report per-partition counts; a failed partition shows up."""
    from transports.spark import NSQCommitMessage, WriteOptions
    from transports.spark.writer import NSQArrowWriter, _Publisher

    options = WriteOptions.parse(
        {"topic": "reported", "nsqd": nsqd_pair[0].tcp_address, "batch_size": "100"}
    )
    results = [
        _Publisher(options, options.nsqd, pid).publish_all(b"m%d" % i for i in range(count))
        for pid, count in ((0, 250), (1, 1000))
    ]
    assert results == [NSQCommitMessage(0, 250, 3), NSQCommitMessage(1, 1000, 10)]
    assert message_count([nsqd_pair[0]], "reported") == 1250
    writer = NSQArrowWriter(options, options.nsqd)
    with caplog.at_level("INFO", logger="nsq_sansio.spark.writer"):
        writer.commit(list(results))
        writer.abort([results[0], None])
    assert writer.published == {0: 250, 1: 1000}
    text = caplog.text
    assert "commit: 1250 messages published to 'reported' by 2 partitions {0: 250, 1: 1000}" in text
    assert "abort: 250 messages" in text and "1 partitions failed" in text

"""Bad options and bad schemas fail on the driver with a message that says what to do."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from transports.spark import NSQOptionError, ReadOptions, WriteOptions

pytestmark = pytest.mark.spark

# Nothing listens here: these tests must fail before any connection is tried.
NSQD = "127.0.0.1:1"


def _write(df: Any, **options: str) -> None:
    writer = df.write.format("nsq").mode("append")
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _error_text(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    return str(excinfo.value)


def test_batch_read_points_at_read_stream(spark: Any) -> None:
    with pytest.raises(Exception) as excinfo:
        spark.read.format("nsq").option("topic", "t").option("nsqd", NSQD).load().collect()
    text = _error_text(excinfo)
    assert "readStream" in text and "queue" in text


def test_write_needs_a_body_column(spark: Any) -> None:
    df = spark.createDataFrame([(1, "a")], "key int, value string")
    with pytest.raises(Exception) as excinfo:
        _write(df, topic="t", nsqd=NSQD)
    text = _error_text(excinfo)
    assert "needs a column 'body'" in text and "serialization" in text


def test_write_rejects_other_columns_unless_json(spark: Any) -> None:
    df = spark.createDataFrame([(b"x", "k")], "body binary, key string")
    with pytest.raises(Exception) as excinfo:
        _write(df, topic="t", nsqd=NSQD)
    text = _error_text(excinfo)
    assert "['key']" in text and "select('body')" in text


def test_write_rejects_a_body_of_the_wrong_type(spark: Any) -> None:
    df = spark.createDataFrame([(1,)], "body int")
    with pytest.raises(Exception) as excinfo:
        _write(df, topic="t", nsqd=NSQD)
    assert "must be binary or string, not int" in _error_text(excinfo)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"nsqd": NSQD}, "needs .option('topic'"),
        ({"topic": "t"}, "option('nsqd'"),
        ({"topic": "bad topic!", "nsqd": NSQD}, "option topic="),
        ({"topic": "t", "nsqd": NSQD, "batch_size": "0"}, "batch_size=0 is out of range"),
        ({"topic": "t", "nsqd": NSQD, "batch_bytes": "lots"}, "batch_bytes='lots'"),
        ({"topic": "t", "nsqd": NSQD, "serialization": "avro"}, "serialization='avro'"),
        ({"topic": "t", "nsqd": NSQD, "colour": "red"}, "unknown option(s) for nsq sink: colour"),
        ({"topic": "t", "nsqd": "nohostport"}, "needs a port"),
    ],
)
def test_bad_write_options(spark: Any, options: dict[str, str], expected: str) -> None:
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception) as excinfo:
        _write(df, **options)
    assert expected in _error_text(excinfo)


def test_overwrite_is_refused(spark: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception) as excinfo:
        df.write.format("nsq").mode("overwrite").option("topic", "t").option("nsqd", NSQD).save()
    assert "mode('append')" in _error_text(excinfo)


def test_unreachable_nsqd_fails_the_job(spark: Any) -> None:
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception) as excinfo:
        _write(df, topic="t", nsqd=NSQD, timeout="2", connect_timeout="0.5")
    text = _error_text(excinfo)
    assert "partition" in text and "failed publishing" in text


def test_read_stream_needs_a_channel(spark: Any, tmp_path: Any) -> None:
    df = spark.readStream.format("nsq").option("topic", "t").option("nsqd", NSQD).load()
    query = df.writeStream.format("memory").queryName("nochannel").start()
    with pytest.raises(Exception) as excinfo:
        query.awaitTermination(60)
    assert "option('channel'" in _error_text(excinfo)


def test_read_options_of_the_kafka_source_and_the_byte_cap() -> None:
    base = {"topic": "t", "channel": "c", "nsqd": "a:1,b:2", "max_in_flight": "500"}
    read = ReadOptions.parse({**base, "maxRecordsPerTrigger": "200", "failOnDataLoss": "true"})
    assert read.max_messages_per_trigger == 200 and read.fail_on_data_loss
    assert read.max_partition_bytes == 8 << 20 and not ReadOptions.parse(base).fail_on_data_loss
    with pytest.raises(NSQOptionError, match="max_messages_per_trigger and maxrecordspertrigger"):
        ReadOptions.parse({**base, "maxRecordsPerTrigger": "2", "max_messages_per_trigger": "2"})
    with pytest.raises(NSQOptionError, match=r"max_partition_bytes=\d+ is out of range"):
        ReadOptions.parse({**base, "max_partition_bytes": str(64 << 20)})
    with pytest.raises(NSQOptionError, match="one per nsqd, in the same order"):
        ReadOptions.parse({**base, "nsqd_http": "a:4151"})
    assert ReadOptions.parse({**base, "nsqd_http": "a:3,b:4"}).nsqd_http == ("a:3", "b:4")


def test_option_parsing_unit() -> None:
    options = WriteOptions.parse({"Topic": "t", "NSQD": "a:1, b:2", "Batch_Size": "10"})
    assert options.nsqd == ("a:1", "b:2") and options.batch_size == 10
    read = ReadOptions.parse({"topic": "t", "channel": "c", "nsqd": "a:1", "max_in_flight": "5"})
    assert read.max_messages_per_trigger == 5
    with pytest.raises(NSQOptionError, match="exceeds max_in_flight"):
        ReadOptions.parse(
            {
                "topic": "t",
                "channel": "c",
                "nsqd": "a:1",
                "max_in_flight": "5",
                "max_messages_per_trigger": "6",
            }
        )

"""Secrets given as options (the AUTH secret, a TLS key's password) never show: not in the
options' repr, not in Spark's plans or the query's progress, not in the data source's logs or
errors."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from transports.spark import NSQStreamReader, ReadOptions, WriteOptions

from .helpers import create_channel, publish

pytestmark = pytest.mark.spark

AUTH = "auth-PLANTED-s3cr3t-4d1f"
PASSWORD = "keypass-PLANTED-9b2e"


def test_option_reprs_and_errors_hide_secrets() -> None:
    read = ReadOptions.parse(
        {
            "topic": "t",
            "channel": "c",
            "nsqd": "127.0.0.1:4150",
            "auth_secret": AUTH,
            "tls_key_password": PASSWORD,
        }
    )
    write = WriteOptions.parse({"topic": "t", "nsqd": "127.0.0.1:4150", "auth_secret": AUTH})
    texts = [repr(read), str(read), repr(write), repr(NSQStreamReader(read))]
    assert all(AUTH not in t and PASSWORD not in t for t in texts), texts
    assert "auth_secret" in texts[0] and "***" in texts[0]
    assert read.config().auth_secret == AUTH.encode()  # still there for the connection


def test_plans_progress_and_logs_hide_secrets(
    spark: Any,
    nsqd_pair: list[Any],
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    server = nsqd_pair[0]
    create_channel(server, "secrets", "c")
    publish([server], "secrets", [b"s%d" % i for i in range(50)])
    secrets = {"auth_secret": AUTH, "tls_key_password": PASSWORD}
    df = (
        spark.readStream.format("nsq")
        .option("nsqd", server.tcp_address)
        .option("topic", "secrets")
        .option("channel", "c")
        .options(**secrets)
        .load()
    )
    df.explain(True)
    plans = [df._jdf.queryExecution().toString(), capfd.readouterr().out]

    # a real read, with the AUTH secret sent (nsqd without auth accepts it), logged at DEBUG
    query = (
        spark.readStream.format("nsq")
        .option("nsqd", server.tcp_address)
        .option("nsqd_http", server.http_address)
        .option("topic", "secrets")
        .option("channel", "c")
        .option("auth_secret", AUTH)
        .load()
        .writeStream.format("memory")
        .queryName("secrets")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(60) and query.exception() is None
    assert spark.table("secrets").count() == 50
    query.explain(True)
    plans += [capfd.readouterr().out, repr(query.recentProgress)]
    with caplog.at_level(logging.DEBUG):
        options = ReadOptions.parse(
            {
                "topic": "secrets",
                "channel": "c2",
                "nsqd": server.tcp_address,
                "nsqd_http": server.http_address,
                "auth_secret": AUTH,
            }
        )
        reader = NSQStreamReader(options)
        try:
            reader.latestOffset({"batch": 0}, ReadAllAvailable())
            logging.getLogger("nsq_sansio.spark.reader").debug("reader %r", reader)
        finally:
            reader.stop()
    # a write that fails: its error
    with pytest.raises(Exception) as excinfo:
        (
            spark.createDataFrame([(b"x",)], "body binary")
            .write.format("nsq")
            .mode("append")
            .options(nsqd="127.0.0.1:1", topic="t", connect_timeout="0.5", timeout="1")
            .options(**secrets)
            .save()
        )
    texts = [*plans, caplog.text, str(excinfo.value), capfd.readouterr().err]
    assert "auth_secret" in plans[0]  # the option is in the plan, its value is not
    assert "reader NSQStreamReader(" in caplog.text
    for text in texts:
        assert AUTH not in text and PASSWORD not in text, text

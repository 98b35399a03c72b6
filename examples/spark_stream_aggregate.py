"""Structured Streaming: click events from NSQ, counted per page and 1-minute window, to Parquet.

Events are JSON bodies like ``{"page": "/home", "user": "u1", "ts": "2026-01-01T10:00:05Z"}``.
Windows are written (append mode) once the watermark has passed them; messages are FIN'd once
the micro-batch that read them is committed.

    python examples/spark_stream_aggregate.py --lookupd http://127.0.0.1:4161 \\
        --topic events --channel spark-agg --out /data/page_counts --checkpoint /data/ckpt
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

EVENT_SCHEMA = "page string, user string, ts timestamp"


def build_query(
    spark: Any,
    *,
    topic: str,
    channel: str,
    out: str,
    checkpoint: str,
    nsqd: str | None = None,
    nsqd_http: str | None = None,
    lookupd: str | None = None,
    available_now: bool = False,
) -> Any:
    """Start the streaming job; returns the StreamingQuery."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("nsq").option("topic", topic).option("channel", channel)
    reader = reader.option("nsqd", nsqd) if nsqd else reader.option("lookupd", lookupd)
    if nsqd_http:  # where /stats is (availableNow reads what the channel held at the start)
        reader = reader.option("nsqd_http", nsqd_http)
    events = (
        reader.option("max_in_flight", "5000")
        .load()
        .select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("page").isNotNull() & F.col("ts").isNotNull())  # drop malformed events
    )
    counts = (
        events.withWatermark("ts", "30 seconds")
        .groupBy(F.window("ts", "1 minute").alias("window"), "page")
        .agg(F.count("*").alias("clicks"), F.approx_count_distinct("user").alias("users"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "clicks",
            "users",
        )
    )
    writer = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="10 seconds")
    )
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nsqd", help="comma-separated nsqd TCP addresses")
    parser.add_argument("--nsqd-http", help="their HTTP addresses (default: TCP port + 1)")
    parser.add_argument("--lookupd", help="comma-separated nsqlookupd HTTP addresses")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--channel", default="spark-agg")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--available-now", action="store_true")
    args = parser.parse_args()
    if not (args.nsqd or args.lookupd):
        parser.error("give --nsqd or --lookupd")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from transports.spark import register

    spark = SparkSession.builder.appName("nsq-page-counts").getOrCreate()  # spark-submit's master
    register(spark)
    query = build_query(
        spark,
        topic=args.topic,
        channel=args.channel,
        out=args.out,
        checkpoint=args.checkpoint,
        nsqd=args.nsqd,
        nsqd_http=args.nsqd_http,
        lookupd=args.lookupd,
        available_now=args.available_now,
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()

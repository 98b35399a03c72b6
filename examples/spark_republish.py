"""Batch job: republish a Parquet dataset into an NSQ topic, one JSON message per row.

    python examples/spark_republish.py --parquet /data/page_counts --nsqd h1:4150,h2:4150 \\
        --topic page_counts
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def republish(
    spark: Any, parquet: str, topic: str, *, nsqd: str | None = None, lookupd: str | None = None
) -> int:
    """Publish every row of the dataset as JSON; returns how many rows were published."""
    df = spark.read.parquet(parquet)
    writer = (
        df.write.format("nsq")
        .mode("append")
        .option("topic", topic)
        .option("serialization", "json")  # every column, as a JSON object per message
        .option("batch_size", "2000")
    )
    writer = writer.option("nsqd", nsqd) if nsqd else writer.option("lookupd", lookupd)
    writer.save()  # fails with nsqd's error if any partition could not publish
    return int(df.count())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--nsqd")
    parser.add_argument("--lookupd")
    args = parser.parse_args()
    if not (args.nsqd or args.lookupd):
        parser.error("give --nsqd or --lookupd")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from transports.spark import register

    spark = SparkSession.builder.appName("nsq-republish").getOrCreate()
    register(spark)
    count = republish(spark, args.parquet, args.topic, nsqd=args.nsqd, lookupd=args.lookupd)
    print(f"published {count} rows to {args.topic!r}")


if __name__ == "__main__":
    main()

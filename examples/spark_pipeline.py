"""The whole pipeline on one machine, against an embedded nsqd (needs the spark extra).

1. publish 2,000 click events (JSON) to the topic ``events``;
2. Structured Streaming (availableNow): NSQ -> clicks per page and minute -> Parquet;
3. batch: the Parquet dataset -> the topic ``page_counts`` (one JSON message per row);
4. read ``page_counts`` back and print it.

    python examples/spark_pipeline.py
"""

from __future__ import annotations

import datetime
import json
import os
import random
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spark_republish import republish
from spark_stream_aggregate import build_query

PAGES = ["/", "/docs", "/pricing", "/blog", "/signup"]


def events(count: int, start: datetime.datetime) -> list[bytes]:
    rng = random.Random(7)
    out = []
    for i in range(count):
        ts = start + datetime.timedelta(seconds=i * 300 / count)  # 5 minutes of clicks
        stamp = ts.isoformat(timespec="milliseconds")
        event = {"page": rng.choice(PAGES), "user": f"u{rng.randrange(200)}", "ts": stamp}
        out.append(json.dumps(event).encode())
    # a late tick moves the watermark past the last window, so every window is written
    late = start + datetime.timedelta(minutes=7)
    tick = {"page": "/", "user": "tick", "ts": late.isoformat(timespec="milliseconds")}
    out.append(json.dumps(tick).encode())
    return out


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from transports.embedded.nsqd import EmbeddedNSQD
    from transports.embedded.thread import ServerThread
    from transports.spark import register
    from transports.sync import Consumer, Producer

    work = Path(tempfile.mkdtemp(prefix="nsq-pipeline-"))
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    with ServerThread(EmbeddedNSQD()) as nsqd:
        address = nsqd.tcp_address
        # create the channel first: a channel gets the messages published after it exists
        for path in ("topic/create?topic=events", "channel/create?topic=events&channel=spark-agg"):
            request = urllib.request.Request(f"http://{nsqd.http_address}/{path}", method="POST")
            urllib.request.urlopen(request, timeout=5).close()
        start = datetime.datetime(2026, 1, 1, 10, 0, tzinfo=datetime.timezone.utc)
        with Producer(address) as producer:
            bodies = events(2000, start)
            for i in range(0, len(bodies), 500):
                producer.multi_publish("events", bodies[i : i + 500])
        print(f"published {len(bodies)} events")

        query = build_query(
            spark,
            topic="events",
            channel="spark-agg",
            nsqd=address,
            nsqd_http=nsqd.http_address,
            out=str(work / "page_counts"),
            checkpoint=str(work / "checkpoint"),
            available_now=True,
        )
        query.awaitTermination()
        counts = spark.read.parquet(str(work / "page_counts"))
        counts.orderBy("window_start", "page").show(40, truncate=False)

        published = republish(spark, str(work / "page_counts"), "page_counts", nsqd=address)
        got = []
        with Consumer("page_counts", "print", nsqd=[address], max_in_flight=100) as check:
            while len(got) < published:
                message = check.get(timeout=5.0)
                if message is None:
                    break
                got.append(message.body)
                message.finish()
        print(f"republished {published} rows; read back {len(got)}, e.g.:")
        for body in got[:3]:
            print("  ", body.decode())
    spark.stop()


if __name__ == "__main__":
    main()

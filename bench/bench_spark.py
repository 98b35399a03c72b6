"""Spark data source throughput: batch write of 100-byte rows, then a streaming read of them.

The embedded nsqd runs in its own process (so it does not share the GIL with the driver);
Spark runs ``local[N]``. Prints rows/s for the batch write with the Arrow writer and the
row writer, and for a streaming read (``availableNow``) of what was written.

    python bench/bench_spark.py [--rows 1000000] [--read-rows 200000] [--partitions 4]
                                [--master local[2]] [--nsqd host:port,host:port]

``--nsqd`` points it at running nsqd (real ones, for a ratio); then no broker is started and
the read part uses a fresh channel created before the write.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _broker(tcp: int, http: int, ready: Any) -> None:
    from transports.embedded.nsqd import EmbeddedNSQD
    from transports.embedded.thread import ServerThread

    server = EmbeddedNSQD(
        tcp_address=f"127.0.0.1:{tcp}", http_address=f"127.0.0.1:{http}", mem_queue_size=2_000_000
    )
    with ServerThread(server):
        ready.set()
        while True:
            time.sleep(3600)


def _depth(http: str, topic: str, channel: str) -> int:
    url = f"http://{http}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=10) as response:
        document = json.load(response)
    for entry in document.get("topics", []):
        for chan in entry.get("channels", []):
            if chan["channel_name"] == channel:
                return int(chan["depth"])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--read-rows", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--nsqd", default=None, help="comma-separated nsqd TCP addresses")
    parser.add_argument("--only", choices=["write", "read"], default=None)
    parser.add_argument("--max-in-flight", type=int, default=20_000)
    parser.add_argument("--linger", type=float, default=0.2)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    processes: list[Any] = []  # spawned broker processes
    if args.nsqd:
        nsqd = args.nsqd
        http = None
    else:
        tcp_port, http_port = _free_port(), _free_port()
        ready = mp.get_context("spawn").Event()
        process = mp.get_context("spawn").Process(
            target=_broker, args=(tcp_port, http_port, ready), daemon=True
        )
        process.start()
        processes.append(process)
        if not ready.wait(30):
            raise SystemExit("the embedded nsqd did not start")
        nsqd = f"127.0.0.1:{tcp_port}"
        http = f"127.0.0.1:{http_port}"

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from transports.spark import register
    from transports.sync import Consumer

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    print(f"Spark {spark.version}, master {args.master}, nsqd {nsqd}")

    # The read channel must exist before the write so that it receives the messages.
    read_topic = "bench_read"
    first = nsqd.split(",")[0]
    with Consumer(read_topic, "spark", nsqd=[first], max_in_flight=1) as consumer:
        while not any(c.connected for c in consumer.stats().connections):
            time.sleep(0.05)

    def frame(rows: int) -> Any:
        return spark.range(rows, numPartitions=args.partitions).select(
            F.lpad(F.col("id").cast("string"), 100, "x").cast("binary").alias("body")
        )

    # warm-up: starts the Python workers
    frame(1000).write.format("nsq").mode("append").option("nsqd", nsqd).option(
        "topic", "bench_warmup"
    ).save()

    for arrow in ("true", "false") if args.only != "read" else ():
        df = frame(args.rows)
        started = time.perf_counter()
        df.write.format("nsq").mode("append").option("nsqd", nsqd).option(
            "topic", f"bench_write_{arrow}"
        ).option("arrow", arrow).option("batch_size", "5000").save()
        elapsed = time.perf_counter() - started
        kind = "Arrow writer" if arrow == "true" else "row writer  "
        print(
            f"batch write, {kind}: {args.rows:>9,} rows of 100 B in {elapsed:6.2f}s "
            f"= {args.rows / elapsed:>10,.0f} rows/s"
        )

    if args.only == "write":
        spark.stop()
        for process in processes:
            process.terminate()
        return
    frame(args.read_rows).write.format("nsq").mode("append").option("nsqd", first).option(
        "topic", read_topic
    ).option("batch_size", "5000").save()
    if http is not None:
        assert _depth(http, read_topic, "spark") == args.read_rows
    query = (
        spark.readStream.format("nsq")
        .option("nsqd", first)
        .option("topic", read_topic)
        .option("channel", "spark")
        .option("max_in_flight", str(args.max_in_flight))
        .option("max_messages_per_trigger", str(args.max_in_flight))
        .option("linger", str(args.linger))
        .option("wait_timeout", "1")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
    )
    started = time.perf_counter()
    running = query.start()
    running.awaitTermination()
    elapsed = time.perf_counter() - started
    progress = [p for p in running.recentProgress if p["numInputRows"]]
    read = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    print(
        f"streaming read (availableNow, noop sink): {read:>9,} rows in {elapsed:6.2f}s "
        f"= {read / elapsed:>10,.0f} rows/s (includes query start and the final idle wait)"
    )
    print(
        f"  {len(progress)} micro-batches of up to {args.max_in_flight:,}; inside them "
        f"{read / busy:,.0f} rows/s ({busy:.2f}s of trigger execution)"
    )
    keys = sorted({k for p in progress for k in p["durationMs"]})
    for k in keys:
        print(f"  {k:>20}: {sum(p['durationMs'].get(k, 0) for p in progress) / 1000:6.2f}s")
    spark.stop()
    for process in processes:
        process.terminate()


if __name__ == "__main__":
    main()

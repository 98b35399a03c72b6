"""Spark data source throughput: batch write of 100-byte rows, then a streaming read of them.

Spark runs ``local[N]``. Prints rows/s for the batch write with the Arrow writer and the row
writer, and for a streaming read (``availableNow``, noop sink) of what was written, with
Spark's own split of the micro-batches' time (latestOffset = reading from nsqd, addBatch =
shipping the Arrow batches to the executors and reading them there, walCommit/commitOffsets =
the checkpoint).

    python bench/bench_spark.py --real               # a real nsqd 1.3.0 (../shared/reference)
    python bench/bench_spark.py --nsqd host:4150     # an nsqd already running
    python bench/bench_spark.py                      # the embedded nsqd, in its own process

    [--rows 1000000] [--read-rows 1000000] [--max-in-flight 100000] [--linger 1.0]
    [--read-partitions 1] [--partitions 4] [--master local[2]] [--only write|read]
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
    parser.add_argument("--read-rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--nsqd", default=None, help="comma-separated nsqd TCP addresses")
    parser.add_argument(
        "--real", action="store_true", help="start a real nsqd (transports.testing.real_nsq)"
    )
    parser.add_argument(
        "--nsqd-arg",
        action="append",
        default=[],
        help="extra flag for the real nsqd, e.g. --nsqd-arg=--max-rdy-count=100000",
    )
    parser.add_argument("--only", choices=["write", "read"], default=None)
    parser.add_argument("--max-in-flight", type=int, default=100_000)
    parser.add_argument(
        "--per-trigger", type=int, default=None, help="max_messages_per_trigger (max-in-flight)"
    )
    parser.add_argument("--linger", type=float, default=1.0)
    parser.add_argument("--read-partitions", type=int, default=1)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    processes: list[Any] = []  # spawned broker processes
    real: Any = None
    if args.real:
        from transports.testing.real_nsq import RealNSQD, find_binaries

        if find_binaries() is None:
            raise SystemExit("no real nsqd binaries (see transports/testing/real_nsq.py)")
        # Everything in memory: the benchmark measures the client, not nsqd's disk queue.
        real = RealNSQD(["--mem-queue-size=5000000", *args.nsqd_arg]).start()
        args.nsqd = real.tcp_address
    if args.nsqd:
        nsqd = args.nsqd
        http = None if real is None else real.http_address
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
        if real is not None:
            real.close()
        return
    frame(args.read_rows).write.format("nsq").mode("append").option("nsqd", first).option(
        "topic", read_topic
    ).option("batch_size", "5000").save()
    if http is not None:
        assert _depth(http, read_topic, "spark") == args.read_rows
    per_trigger = args.per_trigger or args.max_in_flight
    query = (
        spark.readStream.format("nsq")
        .option("nsqd", first)
        .option("topic", read_topic)
        .option("channel", "spark")
        .option("max_in_flight", str(args.max_in_flight))
        .option("max_messages_per_trigger", str(per_trigger))
        .option("linger", str(args.linger))
        .option("partitions", str(args.read_partitions))
        .option("wait_timeout", "1")
        .option("msg_timeout", "60")
        .load()
        .writeStream.format("noop")
        .trigger(availableNow=True)
    )
    if os.environ.get("BENCH_MARK"):  # MARK: lets an external CPU sampler split the phases
        Path(os.environ["BENCH_MARK"]).touch()
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
        f"  {len(progress)} micro-batches of up to {per_trigger:,}; inside them "
        f"{read / busy:,.0f} rows/s ({busy:.2f}s of trigger execution)"
    )
    keys = sorted({k for p in progress for k in p["durationMs"]})
    for k in keys:
        print(f"  {k:>20}: {sum(p['durationMs'].get(k, 0) for p in progress) / 1000:6.2f}s")
    spark.stop()
    for process in processes:
        process.terminate()
    if real is not None:
        real.close()


if __name__ == "__main__":
    main()

"""Spark data source throughput: batch write of 100-byte rows, then a streaming read of them.

Spark runs ``local[N]``. Prints rows/s for the batch write with the Arrow writer and the row
writer, and for streaming reads (``availableNow``, noop sink) of freshly written rows: an
untimed warm-up read first (the first streaming query runs on a cold JVM, about twice Spark's
CPU per row), then ``--repeat`` timed reads, each with Spark's own split of the micro-batches'
time (latestOffset = reading from nsqd and FIN of the previous batch, addBatch = shipping the
Arrow batches to the executors and reading them there, walCommit/commitOffsets = the
checkpoint) and the CPU seconds each process used (the source's driver process is the one
shown as ``?``: it has exited when the read ends). ``--reference`` then measures, on the same
nsqd, Go's ``bench_reader``, the blocking consumer (push, and pull ``fetch(2500)``) and the
source's reader driven by a plain loop instead of Spark.

    python bench/bench_spark.py --real --only read --reference   # the read, and references
    python bench/bench_spark.py --real               # a real nsqd 1.3.0 (transports.testing)
    python bench/bench_spark.py --nsqd host:4150     # an nsqd already running
    python bench/bench_spark.py                      # the embedded nsqd, in its own process

    [--rows 1000000] [--read-rows 1000000] [--max-in-flight 100000] [--per-trigger N]
    [--linger 1.0] [--read-partitions N] [--repeat 2] [--warmup-rows 200000]
    [--partitions 4] [--master local[2]] [--only write|read] [--nsqd-arg=--max-rdy-count=...]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
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


def _tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of ``root`` and every process below it, by pid, with a
    short name: the JVM, Spark's Python workers (the source's driver process among them), nsqd."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        stats[int(entry)] = (_process_name(argv), (int(fields[11]) + int(fields[12])) / tick)
    found: dict[int, tuple[str, float]] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            found[pid] = stats[pid]
        todo += children.get(pid, [])
    return found


def _process_name(argv: list[bytes]) -> str:
    text = [a.decode(errors="replace") for a in argv if a]
    if not text:
        return "?"
    if "python_streaming_source_runner" in text[-1]:
        return "source (driver)"
    if "java" in text[0]:
        return "JVM"
    if "nsqd" in text[0]:
        return "nsqd"
    if any(arg.startswith("pyspark.") for arg in text):  # -m pyspark.daemon <module>
        return f"python {text[-1].rsplit('.', 1)[-1]}"
    return os.path.basename(text[-1] if text[0].endswith("python") else text[0])


def _cpu_report(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> str:
    """CPU seconds each process group used between two :func:`_tree_cpu` snapshots."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        name = before.get(pid, (name, 0.0))[0]  # a process that just ended has no cmdline
        if pid == os.getpid():
            name = "bench (py4j client)"
        used[name] = used.get(name, 0.0) + seconds - before.get(pid, (name, 0.0))[1]
    return ", ".join(f"{name} {s:.2f}" for name, s in sorted(used.items(), key=lambda x: -x[1]))


def _fill(nsqd: str, http: str, topic: str, rows: int) -> None:
    """``rows`` 100-byte messages in ``topic``'s channel "ref" (created first)."""
    from transports.sync import Producer

    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel=ref"):
        request = urllib.request.Request(f"http://{http}/{path}", method="POST")
        urllib.request.urlopen(request, timeout=10).close()
    body = b"x" * 100
    with Producer(nsqd=[nsqd]) as producer:
        for start in range(0, rows, 5000):
            producer.multi_publish(topic, [body] * min(5000, rows - start))
    deadline = time.monotonic() + 30  # nsqd copies the topic's messages to its channels
    while _depth(http, topic, "ref") < rows and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _depth(http, topic, "ref") == rows


def _references(nsqd: str, http: str | None, rows: int, max_in_flight: int) -> None:
    """The same nsqd without Spark, each on ``rows`` fresh messages: Go's bench_reader, the
    blocking consumer (push mode, and pull mode fetching 2500 at a time), and the source's own
    reader driven by a loop instead of Spark (batches of ``max_in_flight``, each FIN'd when
    the next is taken)."""
    from transports.sync import Consumer
    from transports.testing.real_nsq import tool

    if http is None:
        print("references: need nsqd's HTTP address (--real)")
        return

    def report(name: str, count: int, seconds: float) -> None:
        print(
            f"reference, {name}: {count:>9,} msgs in {seconds:6.2f}s = {count / seconds:>10,.0f}/s"
        )

    exe = tool("bench_reader")
    if exe is not None:
        _fill(nsqd, http, "bench_ref_go", rows)
        started = time.perf_counter()
        proc = subprocess.Popen(
            [
                str(exe),
                f"--nsqd-tcp-address={nsqd}",
                "--topic=bench_ref_go",
                "--channel=ref",
                "--size=100",
                "--rdy=2500",
                "--runfor=120s",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while _depth(http, "bench_ref_go", "ref") > 0:
                time.sleep(0.005)
            report(
                "Go bench_reader (rdy 2500; until the depth is 0)",
                rows,
                time.perf_counter() - started,
            )
        finally:
            proc.kill()
            proc.wait()

    _fill(nsqd, http, "bench_ref_push", rows)
    started = time.perf_counter()
    with Consumer("bench_ref_push", "ref", nsqd=[nsqd], max_in_flight=2500) as consumer:
        count = 0
        for message in consumer:
            message.finish()
            count += 1
            if count == rows:
                break
        report("blocking consumer, push (max_in_flight 2500)", count, time.perf_counter() - started)

    _fill(nsqd, http, "bench_ref_pull", rows)
    started = time.perf_counter()
    with Consumer("bench_ref_pull", "ref", nsqd=[nsqd], max_in_flight=2500, pull=True) as consumer:
        count = 0
        while count < rows:
            got = consumer.fetch(2500, timeout=5.0)
            if not got:
                break
            for message in got:
                message.finish()
            count += len(got)
        report("blocking consumer, pull fetch(2500)", count, time.perf_counter() - started)

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from transports.spark._options import ReadOptions
    from transports.spark.reader import NSQStreamReader

    _fill(nsqd, http, "bench_ref_source", rows)
    options = ReadOptions.parse(
        {
            "nsqd": nsqd,
            "topic": "bench_ref_source",
            "channel": "ref",
            "max_in_flight": str(max_in_flight),
            "wait_timeout": "0.2",
        }
    )
    source = NSQStreamReader(options)
    started = time.perf_counter()
    offset: dict[str, Any] = {"batch": 0}
    count = 0
    try:
        while True:
            end = source.latestOffset(offset, ReadAllAvailable())
            if end == offset:
                break
            count += sum(p.batch.num_rows for p in source.partitions(offset, end))  # type: ignore[attr-defined]
            offset = end
        report(
            f"the source without Spark (batches of {max_in_flight:,}, Arrow built; "
            "final 0.2 s wait included)",
            count,
            time.perf_counter() - started,
        )
    finally:
        source.stop()


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
    parser.add_argument("--linger", type=float, default=1.0, help="linger (100,000 fill in ~0.3 s)")
    parser.add_argument(
        "--read-partitions", type=int, default=None, help="partitions (the source's default)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="timed streaming reads")
    parser.add_argument(
        "--warmup-rows", type=int, default=200_000, help="untimed streaming read first (0: none)"
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="then Go's bench_reader and the blocking consumer alone on the same nsqd",
    )
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

    read_topic = "bench_read"
    first = nsqd.split(",")[0]

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
    per_trigger = args.per_trigger or args.max_in_flight

    def stream_read(topic: str, rows: int, label: str) -> None:
        """Publish ``rows`` to ``topic`` (channel "spark" made first), read them back with a
        streaming query and print its numbers."""
        with Consumer(topic, "spark", nsqd=[first], max_in_flight=1) as consumer:
            while not any(c.connected for c in consumer.stats().connections):
                time.sleep(0.05)
        frame(rows).write.format("nsq").mode("append").option("nsqd", first).option(
            "topic", topic
        ).option("batch_size", "5000").save()
        if http is not None:
            assert _depth(http, topic, "spark") == rows
        reader = (
            spark.readStream.format("nsq")
            .option("nsqd", first)
            .option("topic", topic)
            .option("channel", "spark")
            .option("max_in_flight", str(args.max_in_flight))
            .option("max_messages_per_trigger", str(per_trigger))
            .option("wait_timeout", "1")
            .option("msg_timeout", "60")
        )
        if http is not None:  # availableNow reads what /stats shows, then stops
            reader = reader.option("nsqd_http", http)
        if args.linger is not None:
            reader = reader.option("linger", str(args.linger))
        if args.read_partitions is not None:
            reader = reader.option("partitions", str(args.read_partitions))
        query = reader.load().writeStream.format("noop").trigger(availableNow=True)
        if os.environ.get("BENCH_MARK"):  # MARK: lets an external CPU sampler split the phases
            Path(os.environ["BENCH_MARK"]).touch()
        cpu_before = _tree_cpu(os.getpid())
        cpu_after = dict(cpu_before)
        done = threading.Event()

        def merge() -> None:  # a process that just exited has no name any more: keep it
            for pid, (name, seconds) in _tree_cpu(os.getpid()).items():
                cpu_after[pid] = (cpu_after.get(pid, (name, 0.0))[0], seconds)

        def sample() -> None:  # the source's process exits with the query: sample it alive
            while not done.wait(0.1):
                merge()

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.perf_counter()
        running = query.start()
        running.awaitTermination()
        elapsed = time.perf_counter() - started
        done.set()
        sampler.join()
        merge()
        progress = [p for p in running.recentProgress if p["numInputRows"]]
        read = sum(p["numInputRows"] for p in progress)
        busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        if http is not None:
            assert _depth(http, topic, "spark") == 0, "the read left messages in the channel"
        print(
            f"streaming read, {label} (availableNow, noop sink): {read:>9,} rows in "
            f"{elapsed:6.2f}s = {read / elapsed:>10,.0f} rows/s overall (query start included"
            + ("" if http is not None else ", and the final 1 s idle wait")
            + ")"
        )
        print(
            f"  {len(progress)} micro-batches of up to {per_trigger:,}; inside them "
            f"{read / busy:,.0f} rows/s ({busy:.2f}s of trigger execution)"
        )
        keys = sorted({k for p in progress for k in p["durationMs"]} - {"triggerExecution"})
        print(
            "  "
            + ", ".join(
                f"{k} {sum(p['durationMs'].get(k, 0) for p in progress) / 1000:.2f}s" for k in keys
            )
        )
        print(f"  CPU seconds during the read: {_cpu_report(cpu_before, cpu_after)}")

    if args.warmup_rows:
        # The first streaming query runs on a cold JVM (JIT): about twice Spark's CPU per row.
        stream_read("bench_read_warmup", args.warmup_rows, "warm-up")
    for run in range(args.repeat):
        stream_read(f"{read_topic}_{run}", args.read_rows, f"run {run + 1}")
    if args.reference:
        _references(first, http, args.read_rows, args.max_in_flight)
    spark.stop()
    for process in processes:
        process.terminate()
    if real is not None:
        real.close()


if __name__ == "__main__":
    main()

"""``nsq-sansio demo --spark``: the data pipeline as a job, on the embedded broker.

NSQ -> Structured Streaming aggregation -> Parquet -> NSQ, with the demo's progress display
and a closing table that accounts for every message (needs the ``spark`` extra and a JVM):

1. **publish**: click events (JSON ``{"seq", "page", "user", "ts"}``, 5 minutes of event
   time) to topic ``clicks`` over two embedded nsqd, plus a few malformed bodies;
2. **stream**: ``readStream.format("nsq")`` (``trigger(availableNow=True)``) parses the events,
   drops malformed ones, counts clicks and distinct users per page and 1-minute window and
   appends the closed windows to Parquet; messages are FIN'd once Spark committed their
   micro-batch. NSQ does not keep messages in order (an nsqd hands out its memory queue and
   its disk queue side by side, several nsqd interleave), so the watermark's delay (10
   minutes) covers the clicks' whole span: none can arrive late. Once every click is read, one
   *tick* event, later than that, is published and the query runs again from its checkpoint:
   the tick moves the watermark past every window, which is then written (published with the
   clicks, the tick could be read first and make every click late);
3. **republish**: a batch job writes the Parquet rows to topic ``page_counts`` as JSON
   (``write.format("nsq")``);
4. **verify**: a consumer reads ``page_counts`` back.

Accounting: every event published is FIN'd by the stream (nothing left on the channel); the
clicks per (window, page) in Parquet equal what was published, cell by cell (so their sum is
every well-formed click); the malformed ones and the tick are the rest; every Parquet row is
read back from NSQ exactly once. Exit 0 only if all of that holds.

Under ``spark-submit`` the session takes the master given there (``--master
spark://host:7077``) instead of ``local[2]``; the embedded nsqd listen on loopback and the
Parquet folder is a local temporary one, so the executors must run on this machine. Run as a
file, this module is the demo (``spark-submit --master ... transports/cli/demo/spark.py -n
20000``).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from transports.cli.progress import ProgressDisplay, Stage

if TYPE_CHECKING:
    from transports.sync.admin import NSQDAdmin

__all__ = ["SparkDemoOptions", "SparkDemoResult", "format_spark_report", "run_spark_demo"]

TOPIC = "clicks"
CHANNEL = "spark-agg"
OUT_TOPIC = "page_counts"
OUT_CHANNEL = "verify"
PAGES = ("/", "/docs", "/pricing", "/blog", "/signup")
START = datetime.datetime(2026, 1, 1, 10, 0, tzinfo=datetime.timezone.utc)
SPAN_SECONDS = 300  # the clicks' event time covers 5 minutes
WINDOW_SECONDS = 60
#: The watermark's delay: longer than the clicks' span, since NSQ does not keep their order.
WATERMARK_SECONDS = 600
#: One malformed body per this many clicks (dropped by the job, and counted as such).
MALFORMED_EVERY = 1000
EVENT_SCHEMA = "seq long, page string, user string, ts timestamp"
REPORT_WIDTH = 79

_LOG4J2 = """\
status = error
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


@dataclass(frozen=True, slots=True)
class SparkDemoOptions:
    messages: int = 20_000  # clicks
    max_in_flight: int = 5000
    timeout: float = 600.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.messages < 1:
            raise ValueError(f"--messages must be >= 1, got {self.messages}")
        if self.max_in_flight < 1:
            raise ValueError("--max-in-flight must be >= 1")
        if self.timeout <= 0:
            raise ValueError("--timeout must be > 0")


# --- the workload ----------------------------------------------------------------------------


def click(seq: int, count: int) -> dict[str, Any]:
    """Click ``seq`` of ``count``: page, user and event time derived from the sequence."""
    ts = START + datetime.timedelta(seconds=seq * SPAN_SECONDS / count)
    return {
        "seq": seq,
        "page": PAGES[(seq * 7 + seq // 13) % len(PAGES)],
        "user": f"u{(seq * 2654435761 >> 7) % 200}",
        "ts": ts.isoformat(timespec="milliseconds"),
    }


def events(count: int) -> tuple[list[bytes], int]:
    """The bodies to publish (clicks, malformed ones, the tick last) and how many are
    malformed."""
    bodies: list[bytes] = []
    malformed = 0
    for seq in range(count):
        bodies.append(json.dumps(click(seq, count)).encode())
        if seq % MALFORMED_EVERY == MALFORMED_EVERY // 2:
            bodies.append(b"{not json")
            malformed += 1
    late = START + datetime.timedelta(seconds=SPAN_SECONDS + WATERMARK_SECONDS + 60)
    tick = {"seq": -1, "page": "/", "user": "tick", "ts": late.isoformat(timespec="milliseconds")}
    bodies.append(json.dumps(tick).encode())
    return bodies, malformed


Cell = tuple[int, str]  # (window start in epoch seconds, page)


def expected_cells(count: int) -> Counter[Cell]:
    """Clicks per (window start, page) that the job must write."""
    cells: Counter[Cell] = Counter()
    for seq in range(count):
        event = click(seq, count)
        ts = datetime.datetime.fromisoformat(event["ts"]).timestamp()
        cells[(int(ts - ts % WINDOW_SECONDS), event["page"])] += 1
    return cells


def epoch(value: datetime.datetime | str) -> int:
    """Seconds since the epoch of a timestamp from Spark: a datetime (naive ones are local
    time, as pyspark hands them out) or its ISO 8601 text (``Z`` accepted)."""
    if isinstance(value, str):
        text = value[:-1] + "+00:00" if value.endswith("Z") else value
        value = datetime.datetime.fromisoformat(text)
    return int(value.timestamp())


# --- result ----------------------------------------------------------------------------------


@dataclass(slots=True)
class SparkDemoResult:
    options: SparkDemoOptions
    published: int = 0
    clicks: int = 0
    malformed: int = 0
    #: messages the stream FIN'd (from nsqd's channel counts) and what is left on the channel
    streamed: int = 0
    left_on_channel: int = 0
    cells_expected: Counter[Cell] = field(default_factory=Counter)
    cells_written: Counter[Cell] = field(default_factory=Counter)
    parquet_rows: int = 0
    duplicate_rows: int = 0
    republished: int = 0
    read_back: int = 0
    read_back_matching: int = 0
    read_back_duplicates: int = 0
    read_back_unexpected: int = 0
    elapsed: dict[str, float] = field(default_factory=dict)
    master: str = "local[2]"
    timed_out: bool = False
    error: str | None = None

    @property
    def clicks_written(self) -> int:
        return sum(self.cells_written.values())

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.error:
            out.append(self.error)
        if self.timed_out:
            out.append(f"timed out after {self.options.timeout:g}s")
        if self.published != self.clicks + self.malformed + 1:
            out.append(f"published {self.published:,} of {self.clicks + self.malformed + 1:,}")
        if self.streamed != self.published or self.left_on_channel:
            out.append(
                f"stream FIN'd {self.streamed:,} of {self.published:,} messages,"
                f" {self.left_on_channel:,} left on the channel"
            )
        if self.cells_written != self.cells_expected:
            wrong = sum(
                1
                for cell in self.cells_expected.keys() | self.cells_written.keys()
                if self.cells_expected[cell] != self.cells_written[cell]
            )
            out.append(
                f"{wrong:,} (window, page) cells differ from what was published"
                f" ({self.clicks_written:,} clicks written, {self.clicks:,} published)"
            )
        if self.duplicate_rows:
            out.append(f"{self.duplicate_rows:,} duplicate Parquet rows")
        if self.republished != self.parquet_rows:
            out.append(f"republished {self.republished:,} of {self.parquet_rows:,} rows")
        missing = self.parquet_rows - self.read_back_matching
        if missing or self.read_back_duplicates or self.read_back_unexpected:
            out.append(
                f"read back: {missing:,} rows missing, {self.read_back_duplicates:,} duplicates,"
                f" {self.read_back_unexpected:,} unexpected"
            )
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


def format_spark_report(result: SparkDemoResult) -> str:
    r = result
    master = f"Spark {r.master}" if len(r.master) <= 30 else "Spark"
    rows = [
        ("events published to clicks", f"{r.published:,}"),
        ("  clicks", f"{r.clicks:,}"),
        ("  malformed (dropped by the job)", f"{r.malformed:,}"),
        ("  watermark tick (window left open)", "1"),
        ("FIN'd by the stream (after commit)", f"{r.streamed:,}"),
        ("left on the channel", f"{r.left_on_channel:,}"),
        ("clicks in Parquet windows", f"{r.clicks_written:,}"),
        ("(window, page) cells as published", f"{_matching_cells(r):,}/{len(r.cells_expected):,}"),
        ("Parquet rows", f"{r.parquet_rows:,}"),
        ("republished to page_counts", f"{r.republished:,}"),
        ("read back, matching a row", f"{r.read_back_matching:,}"),
        ("read back, duplicates", f"{r.read_back_duplicates:,}"),
    ]
    width = max(len(label) for label, _ in rows)
    values = max(len(value) for _, value in rows)
    timing = ", ".join(f"{stage} {seconds:.1f}s" for stage, seconds in r.elapsed.items())
    lines = [
        f"nsq-sansio demo --spark: {r.clicks:,} clicks, NSQ -> Structured Streaming -> Parquet",
        f"-> NSQ, on 2 embedded nsqd, {master}",
        *textwrap.wrap(timing, REPORT_WIDTH),
        "",
        *(f"{label.ljust(width)}  {value.rjust(values)}" for label, value in rows),
        "",
    ]
    problems = r.problems()
    if problems:
        lines += textwrap.wrap("FAILED: " + "; ".join(problems), REPORT_WIDTH)
    else:
        lines.append("OK: every event aggregated, dropped as malformed or the tick; every row")
        lines.append("read back from NSQ once")
    return "\n".join(lines)


def _matching_cells(r: SparkDemoResult) -> int:
    return sum(1 for cell, n in r.cells_expected.items() if r.cells_written[cell] == n)


# --- running ---------------------------------------------------------------------------------


def _channel_backlog(nsqds: list[NSQDAdmin], topic: str, channel: str) -> int:
    """Messages ``topic/channel`` has not finished over every nsqd: its lag (in the topic,
    queued, in flight or deferred)."""
    total = 0
    for admin in nsqds:
        found = admin.stats(topic, channel, include_clients=False).channel(topic, channel)
        total += found.lag if found is not None else 0
    return total


def _topic_messages(nsqds: list[NSQDAdmin], topic: str) -> int:
    """Messages published to ``topic`` over every nsqd."""
    total = 0
    for admin in nsqds:
        found = admin.stats(topic, include_clients=False).topic(topic)
        total += found.message_count if found is not None else 0
    return total


def under_spark_submit() -> bool:
    """True when spark-submit started this process: then its ``--master`` (and its other
    settings) reach the session through the JVM that launched Python, and must not be
    overridden here."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


@contextlib.contextmanager
def local_spark(workdir: str) -> Iterator[Any]:
    """A quiet SparkSession: ``local[2]``, or spark-submit's master when it started us."""
    submitted = under_spark_submit()
    if not submitted:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise RuntimeError(
            "--spark needs pyspark and pyarrow: python -m pip install 'nsq-sansio[cli,spark]'"
        ) from None
    log_config = os.path.join(workdir, "log4j2.properties")
    with open(log_config, "w") as f:
        f.write(_LOG4J2)
    java_options = f"-Dlog4j2.configurationFile=file:{log_config}"
    builder = (
        SparkSession.builder.appName("nsq-sansio-demo")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", os.path.join(workdir, "warehouse"))
    )
    if not submitted:  # spark-submit's JVM is running already: its own settings hold
        builder = (
            builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.driver.extraJavaOptions", java_options)
            .config("spark.local.dir", os.path.join(workdir, "local"))
        )
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


def _polling(fn: Callable[[], Any], poll: Callable[[], None]) -> Any:
    """Run ``fn`` here (Spark jobs belong on the thread that registered the data source)
    while ``poll`` runs every 0.2 s on a helper thread."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(0.2):
            with contextlib.suppress(OSError, ValueError):  # progress only
                poll()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        return fn()
    finally:
        done.set()
        thread.join()


def _aggregation(spark: Any, nsqd: str, nsqd_http: str, options: SparkDemoOptions) -> Any:
    """The streaming job: clicks per page and 1-minute window (10-minute watermark), the closed
    windows appended to Parquet, read with ``availableNow`` (its DataStreamWriter)."""
    from pyspark.sql import functions as F

    events_df = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd)
        .option("nsqd_http", nsqd_http)
        .option("topic", TOPIC)
        .option("channel", CHANNEL)
        .option("max_in_flight", str(options.max_in_flight))
        .option("max_messages_per_trigger", str(options.max_in_flight))
        .load()
        .select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("page").isNotNull() & F.col("ts").isNotNull())
    )
    counts = (
        events_df.withWatermark("ts", f"{WATERMARK_SECONDS} seconds")
        .groupBy(F.window("ts", f"{WINDOW_SECONDS} seconds").alias("window"), "page")
        .agg(F.count("*").alias("clicks"), F.approx_count_distinct("user").alias("users"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page",
            "clicks",
            "users",
        )
    )
    return counts.writeStream.format("parquet").outputMode("append").trigger(availableNow=True)


def run_spark_demo(
    options: SparkDemoOptions, *, spark: Any = None, stream: TextIO | None = None
) -> SparkDemoResult:
    """Run the pipeline (in ``spark`` when given, else a local[2] session started here)."""
    result = SparkDemoResult(options)
    workdir = tempfile.mkdtemp(prefix="nsq-sansio-spark-demo-")
    try:
        with contextlib.ExitStack() as stack:
            if spark is None:
                if stream is not None or options.progress:
                    where = "spark-submit's master" if under_spark_submit() else "local[2]"
                    print(f"starting Spark ({where})...", file=stream or sys.stderr, flush=True)
                spark = stack.enter_context(local_spark(workdir))
            result.master = str(spark.sparkContext.master)
            from transports.spark import register

            register(spark)
            _run(spark, options, result, workdir, stream)
    except TimeoutError:
        result.timed_out = True
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _run(
    spark: Any,
    options: SparkDemoOptions,
    result: SparkDemoResult,
    workdir: str,
    stream: TextIO | None,
) -> None:
    from transports.embedded import Cluster, ServerThread
    from transports.sync import Consumer, Producer
    from transports.sync.admin import NSQDAdmin

    deadline = time.monotonic() + options.timeout
    display = ProgressDisplay(stream, enabled=options.progress)
    bodies, malformed = events(options.messages)
    result.clicks, result.malformed = options.messages, malformed
    result.cells_expected = expected_cells(options.messages)
    total = len(bodies)
    stages: dict[str, Stage] = {}

    def show(name: str, done: int, of: int | None, final: bool = False) -> None:
        stages[name] = Stage(name, done, of)
        display.update(list(stages.values()), final=final)

    with ServerThread(Cluster(nsqd_count=2)) as cluster, contextlib.ExitStack() as stack:
        http = [stack.enter_context(NSQDAdmin(n.http_url, timeout=5.0)) for n in cluster.nsqds]
        nsqd = ",".join(cluster.nsqd_tcp_addresses)
        nsqd_http = ",".join(n.http_address for n in cluster.nsqds)
        for admin in http:  # channels first: they get every message published after
            for topic, channel in ((TOPIC, CHANNEL), (OUT_TOPIC, OUT_CHANNEL)):
                admin.create_topic(topic)
                admin.create_channel(topic, channel)

        # 1. publish the clicks (and the malformed bodies); the tick comes later
        started = time.monotonic()
        with Producer(cluster.nsqd_tcp_addresses) as producer:
            futures = []
            for i in range(0, total - 1, 500):
                batch = bodies[i : min(i + 500, total - 1)]
                futures.append((producer.multi_publish_async(TOPIC, batch), len(batch)))
            for future, count in futures:
                future.result()
                result.published += count
                show("publish", result.published, total)
        result.elapsed["publish"] = time.monotonic() - started

        # 2. stream: NSQ -> aggregation -> Parquet. availableNow reads what the channel holds
        # (every click); then the tick is published and the query runs again from its
        # checkpoint: the tick moves the watermark past the last window, which is written.
        started = time.monotonic()
        parquet = os.path.join(workdir, "page_counts")
        checkpoint = os.path.join(workdir, "checkpoint")

        def streamed() -> int:
            return result.published - _channel_backlog(http, TOPIC, CHANNEL)

        def run_query() -> None:
            query = _aggregation(spark, nsqd, nsqd_http, options).start(
                parquet, checkpointLocation=checkpoint
            )
            try:
                while not query.awaitTermination(0.2):
                    if time.monotonic() > deadline:
                        raise TimeoutError
                    show("stream", streamed(), total)
            finally:
                if query.isActive:
                    query.stop()
            if query.exception() is not None:
                raise RuntimeError(f"the streaming query failed: {query.exception()}")

        run_query()
        with Producer(cluster.nsqd_tcp_addresses) as producer:
            producer.publish(TOPIC, bodies[-1])  # the tick, after every click was read
        result.published += 1
        show("publish", result.published, total)
        run_query()
        # the source FINs the last batch at the end of availableNow; nsqd may count it a
        # moment later
        settle = time.monotonic() + 5.0
        while streamed() < total and time.monotonic() < settle:
            time.sleep(0.05)
        result.streamed = streamed()
        result.left_on_channel = total - result.streamed
        show("stream", result.streamed, total)
        result.elapsed["stream"] = time.monotonic() - started

        rows = spark.read.parquet(parquet).collect()
        result.parquet_rows = len(rows)
        expected_rows: dict[Cell, dict[str, Any]] = {}
        for row in rows:
            cell = (epoch(row["window_start"]), row["page"])
            if cell in expected_rows:
                result.duplicate_rows += 1
            result.cells_written[cell] += row["clicks"]
            expected_rows[cell] = {"clicks": row["clicks"], "users": row["users"]}

        # 3. republish: Parquet -> NSQ (JSON rows)
        started = time.monotonic()
        out_total = result.parquet_rows

        def republish() -> None:
            (
                spark.read.parquet(parquet)
                .write.format("nsq")
                .mode("append")
                .option("nsqd", nsqd)
                .option("topic", OUT_TOPIC)
                .option("serialization", "json")
                .option("batch_size", "2000")
                .save()
            )

        _polling(republish, lambda: show("republish", _topic_messages(http, OUT_TOPIC), out_total))
        result.republished = _topic_messages(http, OUT_TOPIC)
        show("republish", result.republished, out_total)
        result.elapsed["republish"] = time.monotonic() - started

        # 4. verify: read page_counts back
        started = time.monotonic()
        seen: set[Cell] = set()
        with Consumer(
            OUT_TOPIC, OUT_CHANNEL, nsqd=cluster.nsqd_tcp_addresses, max_in_flight=500, pull=True
        ) as consumer:
            while result.read_back < out_total and time.monotonic() < deadline:
                # ask for what is still due: the fetch returns as soon as it came
                due = min(500, out_total - result.read_back)
                for msg in consumer.fetch(due, timeout=0.5):
                    result.read_back += 1
                    record = json.loads(msg.body)
                    cell = (epoch(record["window_start"]), record["page"])
                    wanted = expected_rows.get(cell)
                    if cell in seen:
                        result.read_back_duplicates += 1
                    elif wanted is not None and wanted["clicks"] == record["clicks"]:
                        seen.add(cell)
                        result.read_back_matching += 1
                    else:
                        result.read_back_unexpected += 1
                    msg.finish()
                show("verify", result.read_back, out_total)
            # anything beyond the rows (a duplicate publish) would arrive now
            for msg in consumer.fetch(500, timeout=0.5):
                result.read_back += 1
                result.read_back_duplicates += 1
                msg.finish()
            consumer.drain(timeout=5.0)
        show("verify", result.read_back, out_total, final=True)
        result.elapsed["verify"] = time.monotonic() - started
        if result.read_back < out_total and time.monotonic() >= deadline:
            raise TimeoutError


if __name__ == "__main__":  # spark-submit runs this file: `nsq-sansio demo --spark ARGS`
    import runpy

    sys.argv = ["nsq-sansio", "demo", "--spark", *sys.argv[1:]]
    runpy.run_module("transports.cli", run_name="__main__")

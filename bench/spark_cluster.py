"""The "nsq" format on a Spark standalone cluster on this machine, against a real nsqd 1.3.0.

Starts a master and two workers (one core each) from pyspark's own ``sbin/spark-daemon.sh`` on
loopback, and a real nsqd (``transports.testing.real_nsq``), then runs, each as a
``spark-submit`` application:

1. **rates**, on the cluster and then on ``local[2]`` (same script, same nsqd, same sizes):
   batch write of ``--rows`` 100-byte rows; a streaming read of them (``availableNow``, noop
   sink, micro-batches of 100,000); one micro-batch of 100,000 messages of 1.5 KB with
   ``partitions=1`` (150 MB: the tasks are cut by bytes, ``max_partition_bytes``); and the
   *executor read* prototype: each task subscribes on an executor and FINs what it fetched at
   once, with no commit protocol (the ceiling of reading on the executors, for comparison).
2. **kill**: a streaming read into Parquet (micro-batches of 20,000) during which a worker and
   its executor are killed with kill -9; the query must still end with every message in the
   Parquet output exactly once and the channel empty.
3. **demo**: ``nsq-sansio demo --spark`` through ``spark-submit --master spark://...``.

    python bench/spark_cluster.py                       # everything (several minutes)
    python bench/spark_cluster.py --rows 200000 --skip-demo

Needs Java (17 here), pyspark with pyarrow, and the real NSQ binaries (found as
``transports/testing/real_nsq.py`` says; NSQ_BIN_DIR names their folder). Everything
listens on 127.0.0.1 and lives in a temporary folder, removed at the end (``--keep`` keeps
it, with the master's, workers' and applications' logs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULT = "RESULT "  # the line a job prints its results on (JSON)


# --- inside spark-submit ------------------------------------------------------------------------


def _session(name: str) -> Any:
    from pyspark.sql import SparkSession

    from transports.spark import register

    spark = SparkSession.builder.appName(name).getOrCreate()  # the master is spark-submit's
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _create_channel(http: str, topic: str, channel: str) -> None:
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel={channel}"):
        request = urllib.request.Request(f"http://{http}/{path}", method="POST")
        urllib.request.urlopen(request, timeout=10).close()


def _depth(http: str, topic: str, channel: str) -> tuple[int, int]:
    """(depth, in flight) of the channel."""
    url = f"http://{http}/stats?format=json&topic={topic}&channel={channel}"
    with urllib.request.urlopen(url, timeout=10) as response:
        document = json.load(response)
    for entry in document.get("topics") or []:
        for found in entry.get("channels") or []:
            if found["channel_name"] == channel:
                return int(found["depth"]), int(found["in_flight_count"])
    return 0, 0


def _write(spark: Any, nsqd: str, topic: str, rows: int, size: int) -> float:
    """Batch write ``rows`` bodies of ``size`` bytes; rows/s."""
    from pyspark.sql import functions as F

    frame = spark.range(rows, numPartitions=4).select(
        F.lpad(F.col("id").cast("string"), size, "x").cast("binary").alias("body")
    )
    started = time.perf_counter()
    frame.write.format("nsq").mode("append").option("nsqd", nsqd).option("topic", topic).option(
        "batch_size", "5000"
    ).save()
    return rows / (time.perf_counter() - started)


def _read(spark: Any, args: Any, topic: str, **options: str) -> dict[str, Any]:
    """availableNow read of ``topic``'s channel "spark" into the noop sink."""
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd", args.nsqd)
        .option("nsqd_http", args.nsqd_http)
        .option("topic", topic)
        .option("channel", "spark")
        .option("msg_timeout", "60")
        .option("wait_timeout", "1")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    started = time.perf_counter()
    query = reader.load().writeStream.format("noop").trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return {
        "rows": rows,
        "batches": [p["numInputRows"] for p in progress],
        "rows_per_s": rows / elapsed,
        "rows_per_s_in_batches": rows / busy if busy else 0.0,
        "left": _depth(args.nsqd_http, topic, "spark"),
    }


def _executor_read(spark: Any, args: Any, topic: str, rows: int, tasks: int) -> dict[str, Any]:
    """The prototype: ``tasks`` tasks each subscribe on an executor, fetch their share and FIN
    it at once (no commit protocol: an upper bound for reading on the executors)."""
    nsqd, share = args.nsqd, -(-rows // tasks)

    def read(partition: Any) -> Any:
        from transports.sync import Consumer

        for _ in partition:
            pass
        taken = 0
        with Consumer(topic, "spark", nsqd=[nsqd], pull=True, max_in_flight=2500) as consumer:
            while taken < share:
                got = consumer.fetch(min(2500, share - taken), timeout=3.0)
                if not got:
                    break
                yield from ((m.id, m.body) for m in got)  # rows into Spark
                consumer.finish_many(got)
                taken += len(got)

    started = time.perf_counter()
    # An RDD (pyspark's pickled batches into the JVM): mapInArrow would need pandas.
    got = spark.sparkContext.parallelize(range(tasks), tasks).mapPartitions(read).count()
    elapsed = time.perf_counter() - started
    return {"rows": got, "rows_per_s": got / elapsed, "tasks": tasks}


def job_rates(args: Any) -> None:
    spark = _session("nsq-bench-rates")
    master = spark.sparkContext.master
    tag = "cluster" if master.startswith("spark://") else "local"
    out: dict[str, Any] = {"master": master}
    _write(spark, args.nsqd, "warmup", 1000, 100)  # starts the Python workers

    small = f"rate_{tag}_100"
    _create_channel(args.nsqd_http, small, "spark")
    out["write_100B_rows_per_s"] = _write(spark, args.nsqd, small, args.rows, 100)
    out["read_100B"] = _read(
        spark, args, small, max_in_flight="100000", linger="1", max_messages_per_trigger="100000"
    )

    big = f"rate_{tag}_1500"
    _create_channel(args.nsqd_http, big, "spark")
    out["write_1500B_rows_per_s"] = _write(spark, args.nsqd, big, 100_000, 1500)
    out["read_1500B_one_batch"] = _read(
        spark, args, big, max_in_flight="100000", linger="2", max_messages_per_trigger="100000"
    )

    proto = f"rate_{tag}_executors"
    _create_channel(args.nsqd_http, proto, "spark")
    _write(spark, args.nsqd, proto, args.rows, 100)
    tasks = int(spark.sparkContext.defaultParallelism)
    out["executor_read_100B"] = _executor_read(spark, args, proto, args.rows, tasks)
    print(RESULT + json.dumps(out), flush=True)
    spark.stop()


def job_kill(args: Any) -> None:
    """A streaming read into Parquet; the orchestrator kills a worker meanwhile. Then the
    output is read back (through Spark: the file sink's log says which files count)."""
    from pyspark.sql import functions as F

    spark = _session("nsq-bench-kill")
    query = (
        spark.readStream.format("nsq")
        .option("nsqd", args.nsqd)
        .option("nsqd_http", args.nsqd_http)
        .option("topic", args.topic)
        .option("channel", "spark")
        .option("max_in_flight", "20000")
        .option("partitions", "4")
        .option("msg_timeout", "60")
        .load()
        .select("body")
        .writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.out + "-checkpoint")
        .trigger(availableNow=True)
        .start()
    )
    print("STARTED", flush=True)
    query.awaitTermination()
    error = None if query.exception() is None else str(query.exception())
    table = spark.read.parquet(args.out)
    counts = table.agg(
        F.count("*").alias("rows"),
        F.countDistinct("body").alias("distinct"),
        F.min("body").alias("low"),
        F.max("body").alias("high"),
    ).first()
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    out = {
        "error": error,
        "rows": counts["rows"],
        "distinct": counts["distinct"],
        "low": bytes(counts["low"] or b"").decode(),
        "high": bytes(counts["high"] or b"").decode(),
        "batches": len(batches),
    }
    print(RESULT + json.dumps(out), flush=True)
    spark.stop()


# --- the orchestrator ----------------------------------------------------------------------------


class Standalone:
    """A master and workers started with pyspark's sbin/spark-daemon.sh, on 127.0.0.1."""

    def __init__(self, workdir: Path, workers: int = 2) -> None:
        import pyspark

        from transports.testing.real_nsq import free_port

        self.home = Path(pyspark.__file__).parent
        self.workdir = workdir
        self.port = free_port()
        self.ui_port = free_port()
        self.workers = workers
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_LOG_DIR": str(workdir / "logs"),
            "SPARK_PID_DIR": str(workdir / "pids"),
            "SPARK_WORKER_DIR": str(workdir / "work"),
            "SPARK_LOCAL_DIRS": str(workdir / "local"),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _daemon(self, *args: str) -> None:
        subprocess.run(
            [str(self.home / "sbin" / "spark-daemon.sh"), *args],
            env=self.env,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start(self) -> None:
        master = "org.apache.spark.deploy.master.Master"
        self._daemon(
            "start", master, "1", "--host", "127.0.0.1", "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for index in range(1, self.workers + 1):
            self.start_worker(index)
        self.wait_workers(self.workers)

    def start_worker(self, index: int) -> None:
        self._daemon(
            "start", "org.apache.spark.deploy.worker.Worker", str(index), "--host", "127.0.0.1",
            "--cores", "1", "--memory", "1536m", "--webui-port", "0", self.url,
        )  # fmt: skip

    def wait_workers(self, count: int) -> None:
        deadline = time.monotonic() + 120
        while self.alive_workers() < count:
            if time.monotonic() > deadline:
                raise TimeoutError("the workers did not register with the master")
            time.sleep(0.5)

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                state = json.load(r)
        except OSError:
            return 0
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def worker_pid(self, index: int) -> int:
        pid_dir = self.workdir / "pids"
        (found,) = pid_dir.glob(f"*Worker-{index}.pid")
        return int(found.read_text().strip())

    def kill_worker(self, index: int) -> list[int]:
        """kill -9 the worker and every process below it (its executors): a host lost."""
        root = self.worker_pid(index)
        victims = [root, *_descendants(root)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return victims

    def stop(self) -> None:
        for index in range(1, self.workers + 1):
            self._stop("org.apache.spark.deploy.worker.Worker", index)
        self._stop("org.apache.spark.deploy.master.Master", 1)

    def _stop(self, name: str, index: int) -> None:
        subprocess.run(
            [str(self.home / "sbin" / "spark-daemon.sh"), "stop", name, str(index)],
            env=self.env,
            check=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _submit(
    master: str, workdir: Path, job: list[str], *, background: bool = False
) -> subprocess.Popen[str] | subprocess.CompletedProcess[str]:
    import pyspark

    pythonpath = os.pathsep.join([str(ROOT), *[p for p in sys.path if p]])
    log4j = workdir / "log4j2.properties"
    if not log4j.exists():
        log4j.write_text(
            "rootLogger.level = error\nrootLogger.appenderRef.stderr.ref = console\n"
            "appender.console.type = Console\nappender.console.name = console\n"
            "appender.console.target = SYSTEM_ERR\nappender.console.layout.type = PatternLayout\n"
            "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        )
    command = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--master", master,
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", f"spark.pyspark.driver.python={sys.executable}",
        "--conf", f"spark.executorEnv.PYTHONPATH={pythonpath}",
        "--conf", "spark.executor.memory=1g",
        "--conf", "spark.ui.enabled=false",
        "--conf", "spark.sql.shuffle.partitions=2",
        "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:{log4j}",
        "--conf", f"spark.local.dir={workdir / 'local'}",
        str(Path(__file__).resolve()),
        *job,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": pythonpath, "SPARK_LOCAL_IP": "127.0.0.1"}
    if background:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def _result(stdout: str, stderr: str = "") -> dict[str, Any]:
    for line in stdout.splitlines():
        if line.startswith(RESULT):
            return dict(json.loads(line[len(RESULT) :]))
    raise RuntimeError(f"the job printed no result:\n{stdout[-3000:]}\n{stderr[-3000:]}")


def _print_rates(found: dict[str, Any]) -> None:
    master = found["master"]
    small, big, proto = (
        found["read_100B"],
        found["read_1500B_one_batch"],
        found["executor_read_100B"],
    )
    print(f"  {master}:")
    print(
        f"    batch write, 100 B rows:              {found['write_100B_rows_per_s']:>10,.0f} rows/s"
    )
    print(
        f"    streaming read, 100 B (batches of 100,000): {small['rows_per_s']:>10,.0f} rows/s"
        f" end to end, {small['rows_per_s_in_batches']:,.0f} inside the batches; "
        f"{small['rows']:,} rows, left on the channel (depth, in flight) {small['left']}"
    )
    print(
        f"    one micro-batch of 100,000 x 1.5 KB, partitions=1: {big['rows_per_s']:>10,.0f} "
        f"rows/s; batches {big['batches']}, left {big['left']}"
    )
    print(
        f"    executor read prototype, 100 B ({proto['tasks']} tasks, FIN at once): "
        f"{proto['rows_per_s']:>10,.0f} rows/s ({proto['rows']:,} rows)"
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000, help="100-byte rows for the rates")
    parser.add_argument("--kill-rows", type=int, default=300_000)
    parser.add_argument("--skip-demo", action="store_true")
    parser.add_argument("--skip-local", action="store_true", help="no local[2] comparison")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--job", choices=["rates", "kill"], help=argparse.SUPPRESS)
    parser.add_argument("--nsqd", help=argparse.SUPPRESS)
    parser.add_argument("--nsqd-http", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job == "rates":
        return job_rates(args)
    if args.job == "kill":
        return job_kill(args)

    from transports.sync import Producer
    from transports.testing.real_nsq import RealNSQD, find_binaries

    if find_binaries() is None:
        raise SystemExit("no real nsqd binaries (see transports/testing/real_nsq.py)")
    workdir = Path(tempfile.mkdtemp(prefix="nsq-spark-cluster-"))
    cluster = Standalone(workdir)
    failures: list[str] = []
    with RealNSQD() as nsqd:  # its defaults: --mem-queue-size=10000, --max-rdy-count=2500
        common = ["--nsqd", nsqd.tcp_address, "--nsqd-http", nsqd.http_address]
        try:
            started = time.monotonic()
            cluster.start()
            print(f"standalone {cluster.url}: 2 workers alive in {time.monotonic() - started:.0f}s")
            print(f"nsqd 1.3.0 at {nsqd.tcp_address} (HTTP {nsqd.http_address})")

            # 1. rates, cluster then local[2]
            print(f"rates ({args.rows:,} rows of 100 B; 100,000 of 1.5 KB):")
            for master in [cluster.url] + ([] if args.skip_local else ["local[2]"]):
                done = _submit(
                    master, workdir, ["--job", "rates", "--rows", str(args.rows), *common]
                )
                assert isinstance(done, subprocess.CompletedProcess)
                try:
                    _print_rates(_result(done.stdout, done.stderr))
                except RuntimeError as exc:
                    failures.append(f"rates on {master}: {exc}")
                    print(f"  {master}: FAILED\n{exc}")

            # 2. kill -9 of a worker during a streaming read
            topic = "killed"
            _create_channel(nsqd.http_address, topic, "spark")
            bodies = [b"k-%07d" % i for i in range(args.kill_rows)]
            with Producer(nsqd.tcp_address) as producer:
                for start in range(0, len(bodies), 5000):
                    producer.multi_publish(topic, bodies[start : start + 5000])
            while _depth(nsqd.http_address, topic, "spark")[0] < len(bodies):
                time.sleep(0.1)
            out = str(workdir / "killed")
            job = ["--job", "kill", "--topic", topic, "--out", out, *common]
            process = _submit(cluster.url, workdir, job, background=True)
            assert isinstance(process, subprocess.Popen) and process.stdout is not None
            process.stdout.readline()  # STARTED
            while _depth(nsqd.http_address, topic, "spark")[0] > len(bodies) - 60_000:
                if process.poll() is not None:
                    raise RuntimeError("the streaming job ended before the kill")
                time.sleep(0.05)
            victims = cluster.kill_worker(1)
            depth = _depth(nsqd.http_address, topic, "spark")
            print(
                f"kill: worker 1 and its executor (pids {victims}) killed with kill -9 at "
                f"channel depth {depth[0]:,} of {len(bodies):,}"
            )
            output, _ = process.communicate(timeout=1800)
            found = _result(output)
            left = _depth(nsqd.http_address, topic, "spark")
            ok = (
                found["error"] is None
                and found["rows"] == found["distinct"] == len(bodies)
                and (found["low"], found["high"]) == (bodies[0].decode(), bodies[-1].decode())
                and left == (0, 0)
            )
            print(
                f"kill: {found['rows']:,} rows in Parquet, {found['distinct']:,} distinct, of "
                f"{len(bodies):,} published ({found['batches']} micro-batches); channel "
                f"(depth, in flight) {left}; alive workers {cluster.alive_workers()}: "
                + ("OK, nothing lost" if ok else f"FAILED {found}")
            )
            if not ok:
                failures.append("kill")
            cluster.start_worker(1)  # the cluster whole again for the demo
            cluster.wait_workers(2)

            # 3. the demo through spark-submit
            if not args.skip_demo:
                sys.path.insert(0, str(ROOT / "bench"))
                from bench_spark_demo import _cli_run

                ok, tail = _cli_run(20_000, cluster.url)
                print("demo --spark via spark-submit on the cluster: " + ("OK" if ok else "FAILED"))
                print("  " + tail.replace("\n", "\n  "))
                if not ok:
                    failures.append("demo")
        finally:
            cluster.stop()
            if args.keep:
                print(f"work folder kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if failures:
        raise SystemExit(f"FAILED: {', '.join(failures)}")
    print("all OK")


if __name__ == "__main__":
    main()

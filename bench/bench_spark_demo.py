"""``nsq-sansio demo --spark`` several times in a row: every run must account for every message.

Each run is the README's command in a fresh process (a new JVM: what a user runs), or, with
``--in-process``, one SparkSession shared by the runs (faster: the JVM starts once). Prints
each run's verdict and time; exits 1 if any run failed.

    python bench/bench_spark_demo.py                 # 5 runs of `nsq-sansio demo --spark`
    python bench/bench_spark_demo.py --runs 5 -n 20000 --in-process
    python bench/bench_spark_demo.py --submit spark://127.0.0.1:7077   # through spark-submit
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cli_run(messages: int, submit: str | None) -> tuple[bool, str]:
    """One run in a fresh process; ``(ok, the report's last lines)``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    args = ["--spark", "-n", str(messages), "--no-progress"]
    if submit is None:
        command = [sys.executable, "-m", "transports.cli", "demo", *args]
    else:
        import pyspark

        spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
        script = ROOT / "transports" / "cli" / "demo" / "spark.py"
        command = [
            str(spark_submit),
            "--master",
            submit,
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            "--conf",
            f"spark.pyspark.driver.python={sys.executable}",
            "--conf",
            f"spark.executorEnv.PYTHONPATH={env['PYTHONPATH']}",
            str(script),
            *args[1:],
        ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = done.stdout.strip().splitlines()
    tail = "\n".join(lines[:2] + lines[-2:]) if lines else done.stderr[-2000:]
    return done.returncode == 0, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("-n", "--messages", type=int, default=20_000, help="clicks per run")
    parser.add_argument("--in-process", action="store_true", help="one SparkSession for all")
    parser.add_argument("--submit", default=None, help="run through spark-submit --master URL")
    args = parser.parse_args()

    verdicts: list[bool] = []
    if args.in_process:
        from transports.cli.demo.spark import (
            SparkDemoOptions,
            format_spark_report,
            local_spark,
            run_spark_demo,
        )

        with tempfile.TemporaryDirectory() as workdir, local_spark(workdir) as spark:
            for run in range(1, args.runs + 1):
                started = time.monotonic()
                result = run_spark_demo(
                    SparkDemoOptions(messages=args.messages, progress=False), spark=spark
                )
                verdicts.append(result.ok)
                status = "OK" if result.ok else "FAILED: " + format_spark_report(result)
                print(f"run {run}: {time.monotonic() - started:5.1f}s {status}", flush=True)
    else:
        for run in range(1, args.runs + 1):
            started = time.monotonic()
            ok, tail = _cli_run(args.messages, args.submit)
            verdicts.append(ok)
            print(f"run {run}: {time.monotonic() - started:5.1f}s {'OK' if ok else 'FAILED'}")
            print("  " + tail.replace("\n", "\n  "), flush=True)
    print(f"{sum(verdicts)} of {len(verdicts)} runs accounted for every message")
    raise SystemExit(0 if all(verdicts) else 1)


if __name__ == "__main__":
    main()

"""``nsq-sansio demo --spark``: the pipeline job (NSQ -> Structured Streaming aggregation ->
Parquet -> NSQ) on the embedded broker accounts for every message. One run, in this
module's shared SparkSession (the JVM start is the floor). --max-in-flight 1300 cuts the
2,503 events into two or three micro-batches: several, as in a real run, but each one of
the stateful aggregation costs a second or more (its state store, its Parquet files)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from transports.cli.demo import demo_main
from transports.cli.demo.spark import MALFORMED_EVERY, expected_cells

pytestmark = pytest.mark.timeout(300)


def test_demo_spark_accounts_for_every_message(
    spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code = demo_main(["--spark", "-n", "2500", "--max-in-flight", "1300"], spark=spark)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    rows = {
        m.group(1).strip(): m.group(2)
        for m in re.finditer(r"^(\S.*?|  \S.*?)\s{2,}([\d,/]+)$", out, re.MULTILINE)
    }
    malformed = len([s for s in range(2500) if s % MALFORMED_EVERY == MALFORMED_EVERY // 2])
    cells = expected_cells(2500)
    assert rows["events published to clicks"] == f"{2500 + malformed + 1:,}"
    assert rows["clicks"] == "2,500"
    assert rows["malformed (dropped by the job)"] == str(malformed)
    assert rows["FIN'd by the stream (after commit)"] == f"{2500 + malformed + 1:,}"
    assert rows["left on the channel"] == "0"
    assert rows["clicks in Parquet windows"] == "2,500"
    assert rows["(window, page) cells as published"] == f"{len(cells)}/{len(cells)}"
    assert rows["Parquet rows"] == rows["republished to page_counts"] == str(len(cells))
    assert rows["read back, matching a row"] == str(len(cells))
    assert rows["read back, duplicates"] == "0"
    assert "OK: every event aggregated" in out
    assert "Spark local[2]" in out  # the session's own master, named in the header
    assert all(len(line) < 80 for line in out.splitlines())
    # progress went to stderr (not a terminal here: one line per stage per period)
    stages = {m.group(1) for m in re.finditer(r"^\[\s*\d+:\d\d\] (\w+) ", err, re.MULTILINE)}
    assert {"publish", "stream", "republish", "verify"} <= stages

"""Against the real nsqd, at its default queue sizes: a source killed right after Spark
committed its batch (before the FINs went out) is restarted on a backlog beyond nsqd's
``--mem-queue-size``; the committed batch comes back partly in nsqd's memory queue and partly
at the end of its disk queue, far behind, and is still never read again. The source runs
without Spark here (the calls Spark makes, in the same order), so the test needs no JVM."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

from .helpers import channel_stats, crash_after, create_channel, publish, wait_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(find_binaries() is None, reason=MISSING_BINARIES),
]

TOPIC, CHANNEL = "restart_real", "spark"


@pytest.fixture
def real_nsqd() -> Iterator[Any]:
    with RealNSQD() as real:  # nsqd's defaults: --mem-queue-size=10000
        yield real


def _options(real: Any, **extra: str) -> dict[str, str]:
    return {
        "nsqd": real.tcp_address,
        "nsqd_http": real.http_address,
        "topic": TOPIC,
        "channel": CHANNEL,
        "msg_timeout": "2",
        "linger": "0.3",
        **extra,
    }


def test_a_committed_batch_behind_the_disk_backlog_is_never_read_again(
    real_nsqd: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from transports.spark import NSQStreamReader, ReadOptions
    from transports.spark import reader as reader_module

    create_channel(real_nsqd, TOPIC, CHANNEL)
    bodies = [b"m-%05d" % i for i in range(60_000)]
    publish([real_nsqd], TOPIC, bodies)
    wait_for(lambda: channel_stats(real_nsqd, TOPIC, CHANNEL)["depth"] == 60_000, 30, "copy")

    # Run 1 (another process): batch 1 of 12,000, then 12,000 more fetched ahead for batch 2;
    # Spark commits batch 1; the process dies before the next trigger would FIN it.
    first = crash_after(
        f"""
import json, time
from pyspark.sql.streaming.datasource import ReadAllAvailable
from transports.spark import NSQStreamReader, ReadOptions
options = {_options(real_nsqd, max_in_flight="24000", max_messages_per_trigger="12000")!r}
reader = NSQStreamReader(ReadOptions.parse(options))
end = reader.latestOffset({{"batch": 0}}, ReadAllAvailable())
ids = [i for p in reader.partitions({{"batch": 0}}, end) for i in p.batch.column("id").to_pylist()]
print(json.dumps({{"offset": end, "ids": ids}}), flush=True)
time.sleep(600)
""",
        before_kill=lambda: wait_for(
            lambda: channel_stats(real_nsqd, TOPIC, CHANNEL)["in_flight_count"] == 24_000,
            30,
            "the fetch ahead",
        ),
    )
    committed = set(first["ids"])
    assert len(committed) == 12_000
    # In 2 s nsqd times the 24,000 out: into its memory queue while there is room, the rest at
    # the end of its disk queue, behind what is queued there (over 20,000 now).
    assert channel_stats(real_nsqd, TOPIC, CHANNEL)["backend_depth"] > 20_000

    # Run 2: Spark restarts from the committed batch; availableNow, batches of 3,000. The
    # patience used only when /stats cannot be read is made short: it must not matter.
    monkeypatch.setattr(reader_module, "REDELIVERY_PATIENCE", 0.5)
    reader = NSQStreamReader(
        ReadOptions.parse(_options(real_nsqd, max_in_flight="3000", wait_timeout="5"))
    )
    reader.prepareForTriggerAvailableNow()
    offset, read = first["offset"], []
    with caplog.at_level(logging.WARNING, logger="nsq_sansio.spark.reader"):
        try:
            while True:
                end = reader.latestOffset(offset, ReadAllAvailable())
                if end == offset:
                    break
                for part in reader.partitions(offset, end):
                    read += part.batch.column("id").to_pylist()  # type: ignore[attr-defined]
                offset = end
        finally:
            reader.stop()
    assert not committed & set(read), f"{len(committed & set(read))} committed messages again"
    assert len(read) == len(set(read)) == 48_000
    assert "12000 of its messages came again and were dropped, 0 messages" in caplog.text
    # the run's end closed the connections: the last batch's FINs were out before (Spark
    # kills the source's process right after)
    stats = channel_stats(real_nsqd, TOPIC, CHANNEL)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert stats["timeout_count"] == 24_000

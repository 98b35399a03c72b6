"""Discovery through nsqlookupd: the sink publishes over every nsqd it lists, the source
subscribes on every nsqd that has the topic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from .helpers import create_channel, message_count

pytestmark = pytest.mark.spark


def test_write_and_read_through_lookupd(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from transports.embedded.cluster import Cluster
    from transports.embedded.thread import ServerThread

    topic, channel = "via_lookupd", "spark"
    thread = ServerThread(Cluster(nsqd_count=2))
    cluster = thread.start()
    try:
        assert cluster.lookupd is not None
        lookupd = cluster.lookupd.http_url
        for server in cluster.nsqds:
            create_channel(server, topic, channel)
        thread.portal.call(cluster.wait_registered, topic)

        rows = 2000
        (
            spark.range(rows, numPartitions=4)
            .select(F.format_string("l-%05d", "id").cast("binary").alias("body"))
            .write.format("nsq")
            .mode("append")
            .option("lookupd", lookupd)
            .option("topic", topic)
            .option("batch_size", "100")
            .save()
        )
        assert message_count(cluster.nsqds, topic) == rows
        assert all(message_count([s], topic) > 0 for s in cluster.nsqds)

        query = (
            spark.readStream.format("nsq")
            .option("lookupd", lookupd)
            .option("topic", topic)
            .option("channel", channel)
            .option("wait_timeout", "0.5")
            .load()
            .writeStream.format("memory")
            .queryName("via_lookupd")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        got = spark.table("via_lookupd").select("body", "nsqd").collect()
        assert sorted(bytes(r.body) for r in got) == [b"l-%05d" % i for i in range(rows)]
        assert {r.nsqd for r in got} == {s.tcp_address for s in cluster.nsqds}
    finally:
        thread.stop()

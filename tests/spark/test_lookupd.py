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


def test_the_sinks_lookupd_answer_is_read_up_to_4_mib() -> None:
    """A lookupd (or whatever answers in its place) sending an endless answer: the sink reads
    4 MiB of it and fails with that, instead of taking it all into memory."""
    import http.server
    import threading

    from nsq_sansio.errors import NSQError
    from transports.spark.writer import lookup_nodes

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            chunk = b" " * 65536
            try:
                for _ in range(1024):  # 64 MiB, unless the client stops reading
                    self.wfile.write(chunk)
            except OSError:
                pass

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(NSQError, match="answer over 4194304 bytes"):
            lookup_nodes([address], timeout=5.0)
    finally:
        server.shutdown()
        server.server_close()

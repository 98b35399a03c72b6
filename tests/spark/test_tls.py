"""TLS for the sink and the source, with the transports' option names: a private CA, and a
client certificate that nsqd requires."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from .helpers import wait_for

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tls_nsqd() -> Iterator[dict[str, Any]]:
    """Two embedded nsqd that refuse plaintext: ``open`` (server certificate only) and
    ``strict`` (--tls-client-auth-policy=require-verify). Each certificate is self-signed, so
    it is also the CA the other side trusts."""
    from transports.demo import self_signed_certificate
    from transports.embedded import EmbeddedNSQD, ServerThread

    with ExitStack() as stack:
        cert, key = stack.enter_context(self_signed_certificate())
        client_cert, client_key = stack.enter_context(self_signed_certificate())
        tls = {"tls_cert": cert, "tls_key": key, "tls_required": True}
        open_nsqd = ServerThread(EmbeddedNSQD(**tls))
        strict = ServerThread(
            EmbeddedNSQD(
                **tls, tls_root_ca_file=client_cert, tls_client_auth_policy="require-verify"
            )
        )
        stack.enter_context(open_nsqd)
        stack.enter_context(strict)
        yield {
            "open": open_nsqd,
            "strict": strict,
            "ca": cert,
            "client_cert": client_cert,
            "client_key": client_key,
        }


def _message_count(runner: Any, topic: str) -> int:
    """The topic's message count, read on the broker's loop (its HTTP port wants TLS too)."""
    server = runner.server

    def read() -> int:
        for entry in server.core.stats(server.now(), topic=topic)["topics"]:
            if entry["topic_name"] == topic:
                return int(entry["message_count"])
        return 0

    return int(runner.call(read))


def _create_channel(runner: Any, topic: str, **tls: str) -> None:
    """Subscribe once over TLS: the channel then gets every message published after."""
    from transports.sync import Consumer

    with Consumer(topic, "spark", nsqd=[runner.server.tcp_address], **tls) as consumer:
        wait_for(lambda: any(c.connected for c in consumer.stats().connections), 10, "SUB")


def _write(spark: Any, nsqd: str, topic: str, rows: int, **options: str) -> None:
    from pyspark.sql import functions as F

    writer = (
        spark.range(rows, numPartitions=2)
        .select(F.format_string(f"{topic}-%04d", "id").cast("binary").alias("body"))
        .write.format("nsq")
        .mode("append")
        .option("nsqd", nsqd)
        .option("topic", topic)
        .option("connect_timeout", "2")
    )
    for key, value in options.items():
        writer = writer.option(key, value)
    writer.save()


def _read_all(spark: Any, nsqd: str, topic: str, path: Path, **options: str) -> list[bytes]:
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd)
        .option("topic", topic)
        .option("channel", "spark")
        .option("wait_timeout", "0.5")
        .option("connect_timeout", "1")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.format("memory")
        .queryName(topic)
        .option("checkpointLocation", str(path / topic))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return sorted(bytes(r.body) for r in spark.table(topic).collect())


def test_write_and_read_over_tls_with_a_private_ca(
    spark: Any, tls_nsqd: dict[str, Any], tmp_path: Path
) -> None:
    runner = tls_nsqd["open"]
    address = runner.server.tcp_address
    topic = "tls_ca"
    _create_channel(runner, topic, tls_ca_file=tls_nsqd["ca"])
    _write(spark, address, topic, 500, tls_ca_file=tls_nsqd["ca"])
    assert _message_count(runner, topic) == 500
    got = _read_all(spark, address, topic, tmp_path, tls_ca_file=tls_nsqd["ca"])
    assert got == [b"tls_ca-%04d" % i for i in range(500)]

    # tls_v1 with the system trust store does not know the private CA: the job fails, loudly.
    with pytest.raises(Exception, match="failed publishing"):
        _write(spark, address, "tls_untrusted", 10, tls_v1="true", timeout="1")
    assert _message_count(runner, "tls_untrusted") == 0


def test_client_certificate_required_by_nsqd(
    spark: Any, tls_nsqd: dict[str, Any], tmp_path: Path
) -> None:
    runner = tls_nsqd["strict"]
    address = runner.server.tcp_address
    topic = "tls_client"
    certified = {
        "tls_ca_file": tls_nsqd["ca"],
        "tls_cert_file": tls_nsqd["client_cert"],
        "tls_key_file": tls_nsqd["client_key"],
    }
    _create_channel(runner, topic, **certified)
    _write(spark, address, topic, 300, **certified)
    assert _message_count(runner, topic) == 300

    # Without the client certificate nsqd closes the handshake: the write fails, nothing is
    # published, and the source says it could not subscribe.
    with pytest.raises(Exception, match="failed publishing"):
        _write(spark, address, topic, 10, tls_ca_file=tls_nsqd["ca"], timeout="1")
    assert _message_count(runner, topic) == 300
    with pytest.raises(Exception, match="could not subscribe"):
        _read_all(spark, address, topic, tmp_path / "denied", tls_ca_file=tls_nsqd["ca"])

    got = _read_all(spark, address, topic, tmp_path, **certified)
    assert got == [b"tls_client-%04d" % i for i in range(300)]

"""OpenTelemetry metrics of instrumented clients and of nsqd, against the embedded broker: the
values are what was sent and answered, on every runtime, and every figure the Prometheus
export has has its OpenTelemetry instrument (the table of docs/otel.md, checked both ways)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.brokers import unique
from support.runtimes import Runtime

from transports import otel
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync.admin import NSQDAdmin

from .conftest import Telemetry, point

pytestmark = pytest.mark.timeout(60)

DOC = Path(__file__).resolve().parents[2] / "docs" / "otel.md"


@pytest.mark.anyio
async def test_client_metrics_are_what_was_published_and_answered(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    host, port = nsqd.tcp_address.rsplit(":", 1)
    server = {"server.address": host, "server.port": int(port)}
    channel = {"messaging.destination.name": topic, "messaging.consumer.group.name": "billing"}
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, **telemetry.providers)
        await p.multi_publish(topic, [b"m%d" % i for i in range(4)])
        await p.publish(topic, b"last")
        await p.deferred_publish(topic, b"later", 0.01)
        found = telemetry.metrics()
        assert point(found["nsq.producer.publishes"], **{"messaging.system": "nsq"}) == 3
        assert point(found["nsq.producer.failures"]) == 0
        assert point(found["nsq.producer.pending"]) == 0
        assert point(found["nsq.producer.connections"], **server) == 1
        assert point(found["nsq.producer.reconnects"], **server) == 0
        io = found["nsq.producer.io"]
        assert point(io, **server, **{"network.io.direction": "transmit"}) > 6 * 4
        assert point(io, **server, **{"network.io.direction": "receive"}) > 0
        sent = found["messaging.client.sent.messages"]
        for operation, count in (("multi_publish", 4), ("publish", 1), ("deferred_publish", 1)):
            by = {"messaging.operation.name": operation, "messaging.destination.name": topic}
            assert point(sent, **by, **{"messaging.operation.type": "send"}) == count
            assert point(found["messaging.client.operation.duration"], **by) == 1  # one call

    async with runtime.consumer(topic, "billing", nsqd=nsqd.tcp_address, max_in_flight=7) as c:
        otel.instrument(c.client, **telemetry.providers)
        finished = requeued = 0
        with anyio.fail_after(15):
            while finished < 6:
                msg = await c.get(10.0)
                assert msg is not None
                if msg.body == b"m1" and msg.attempts == 1:
                    if runtime.blocking:
                        msg.requeue(0, backoff=False)  # never blocks
                    else:
                        await msg.requeue(0, backoff=False)
                    requeued += 1
                else:
                    await c.finish(msg)
                    finished += 1
        found = telemetry.metrics()
    link = {**channel, **server}
    assert point(found["messaging.client.consumed.messages"], **channel) == 7
    consumed = found["messaging.client.consumed.messages"][0][0]
    assert consumed["messaging.operation.name"] == "receive"
    assert consumed["messaging.system"] == "nsq"
    assert point(found["nsq.consumer.messages.finished"], **channel) == 6
    assert point(found["nsq.consumer.messages.requeued"], **channel) == requeued == 1
    assert point(found["nsq.consumer.messages.given_up"], **channel) == 0
    assert point(found["nsq.consumer.messages.taken_back"], **channel) == 0
    assert point(found["nsq.consumer.in_flight"], **link) == 0
    assert point(found["nsq.consumer.rdy"], **link) == 7
    assert point(found["nsq.consumer.max_in_flight"], **channel) == 7
    assert point(found["nsq.consumer.backoff_level"], **channel) == 0
    assert point(found["nsq.consumer.connections"], **channel) == 1
    assert point(found["nsq.consumer.reconnects"], **channel) == 0
    assert point(found["nsq.consumer.connection_errors"], **channel) == 0
    assert point(found["nsq.consumer.io"], **link, **{"network.io.direction": "receive"}) > 0
    assert point(found["nsq.consumer.io"], **link, **{"network.io.direction": "transmit"}) > 0


def test_one_collection_reads_each_client_once(nsqd: EmbeddedNSQD, telemetry: Telemetry) -> None:
    """Every instrument of one collection sees the same snapshot: stats() is called once
    per client per collection, not once per instrument."""
    from transports.sync import Consumer, Producer

    with Producer(nsqd.tcp_address) as producer, Consumer("calls", "c", nsqd=nsqd.tcp_address) as c:
        otel.instrument(producer, **telemetry.providers)
        otel.instrument(c, **telemetry.providers)
        calls = {"consumer": 0, "producer": 0}
        consumer_stats, producer_stats = c.stats, producer.stats

        def counted_consumer() -> Any:
            calls["consumer"] += 1
            return consumer_stats()

        def counted_producer() -> Any:
            calls["producer"] += 1
            return producer_stats()

        c.stats = counted_consumer  # type: ignore[method-assign]
        producer.stats = counted_producer  # type: ignore[method-assign]
        for collection in (1, 2, 3):
            found = telemetry.metrics()
            assert calls == {"consumer": collection, "producer": collection}
        assert len(found) >= 19


def test_nsqd_metrics_from_its_stats(nsqd: EmbeddedNSQD, telemetry: Telemetry) -> None:
    from transports.sync import Producer

    topic = unique()
    with NSQDAdmin(nsqd.http_address) as admin:
        admin.create_topic(topic)
        admin.create_channel(topic, "ledger")
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(topic, [b"a", b"b", b"c"])
    host, port = nsqd.http_address.rsplit(":", 1)
    node = {"server.address": host, "server.port": int(port)}
    instrumented = otel.instrument_nsqd(
        [nsqd.http_address, "127.0.0.1:1"], meter_provider=telemetry.meter_provider, timeout=2.0
    )
    try:
        found = telemetry.metrics()
    finally:
        instrumented.close()
    assert point(found["nsq.nsqd.up"], **node) == 1
    assert point(found["nsq.nsqd.up"], **{"server.port": 1}) == 0  # nothing listens there
    of_topic = {**node, "messaging.destination.name": topic}
    of_channel = {**of_topic, "messaging.consumer.group.name": "ledger"}
    assert point(found["nsq.topic.messages"], **of_topic) == 3
    assert point(found["nsq.topic.depth"], **of_topic) == 0  # moved into the channel
    assert point(found["nsq.topic.paused"], **of_topic) == 0
    assert point(found["nsq.channel.depth"], **of_channel) == 3
    assert point(found["nsq.channel.lag"], **of_channel) == 3
    assert point(found["nsq.channel.messages"], **of_channel) == 3
    assert point(found["nsq.channel.in_flight"], **of_channel) == 0
    assert point(found["nsq.channel.clients"], **of_channel) == 0
    # closed: the next collection observes nothing of these nsqd
    assert "nsq.nsqd.up" not in telemetry.metrics()


def test_nsqd_end_to_end_latency_per_quantile(telemetry: Telemetry) -> None:
    """nsqd run with end-to-end latency percentiles: one point per quantile for the channel
    and the topic, in seconds, within what the messages took; none before a message was
    FIN'd (nsqd reports zeros then, which are no latency)."""
    from transports.sync import Consumer, Producer

    embedded = EmbeddedNSQD(e2e_processing_latency_percentiles=(0.5, 0.99))
    with ServerThread(embedded) as nsqd:
        topic = unique()
        with NSQDAdmin(nsqd.http_address) as admin:
            admin.create_topic(topic)
            admin.create_channel(topic, "c")
        with otel.instrument_nsqd([nsqd.http_address], meter_provider=telemetry.meter_provider):
            before = telemetry.metrics()
            started = time.monotonic()
            with Producer(nsqd.tcp_address) as producer:
                producer.multi_publish(topic, [b"1", b"2", b"3"])
            with Consumer(topic, "c", nsqd=[nsqd.tcp_address]) as consumer:
                for count, msg in enumerate(consumer, 1):
                    msg.finish()
                    if count == 3:
                        break
            longest = time.monotonic() - started
            found = telemetry.metrics()
    assert "nsq.channel.e2e_latency" not in before
    of_topic = {"messaging.destination.name": topic}
    of_channel = {**of_topic, "messaging.consumer.group.name": "c"}
    for quantile in ("0.5", "0.99"):
        latency = {"messaging.nsq.latency.quantile": quantile}
        channel = point(found["nsq.channel.e2e_latency"], **of_channel, **latency)
        assert 0 < channel <= longest
        whole_topic = [
            v
            for a, v in found["nsq.topic.e2e_latency"]
            if a.get("messaging.destination.name") == topic
            and "messaging.consumer.group.name" not in a
            and a.get("messaging.nsq.latency.quantile") == quantile
        ]
        assert len(whole_topic) == 1 and 0 < whole_topic[0] <= longest


def _documented() -> list[tuple[str, str]]:
    """The (Prometheus, OpenTelemetry) pairs of docs/otel.md's table."""
    pairs = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`nsq_"):
            prometheus = re.findall(r"`([a-z0-9_]+)`", cells[0])
            opentelemetry = re.findall(r"`([a-z0-9_.]+)`", cells[1])
            assert prometheus and opentelemetry, line
            pairs += [(p, o) for p in prometheus for o in opentelemetry]
    return pairs


def test_every_prometheus_figure_has_its_documented_instrument(
    nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    pytest.importorskip("prometheus_client")
    from transports import metrics
    from transports.sync import Consumer, HTTPProducer, Producer

    families = [*metrics.ClientCollector().describe(), *metrics.NSQDCollector([]).describe()]
    # as a scrape names them (a counter's samples end in _total)
    prometheus = {f"{m.name}_total" if m.type == "counter" else m.name for m in families}
    pairs = _documented()
    assert {p for p, _ in pairs} == prometheus  # every series is in the table, no other

    # and every instrument the table names is one we export (a collection with a bit of
    # everything: a publish, a consumer, a fetch, a handler call, nsqd)
    topic = unique()
    with Producer(nsqd.tcp_address) as producer:
        otel.instrument(producer, **telemetry.providers)
        producer.multi_publish(topic, [b"1", b"2"])
    with HTTPProducer(f"http://{nsqd.http_address}") as http:
        otel.instrument(http, **telemetry.providers)
        http.publish(topic, b"3")
    with Consumer(topic, "all", nsqd=nsqd.tcp_address) as consumer:
        otel.instrument(consumer, **telemetry.providers)
        seen = []

        def handler(msg: Any) -> None:
            seen.append(msg)
            if len(seen) == 3:
                consumer.start_drain()

        consumer.run(handler, concurrency=1)
        with (
            otel.instrument_nsqd([nsqd.http_address], meter_provider=telemetry.meter_provider),
            Consumer(topic, "pulled", nsqd=nsqd.tcp_address, pull=True) as pulled,
        ):
            otel.instrument(pulled, **telemetry.providers)
            pulled.fetch(1, timeout=0.5)
            exported = set(telemetry.metrics())
    # nsqd's end-to-end latencies only exist when nsqd measures them (not without
    # --e2e-processing-latency-percentile, as here; test_nsqd_end_to_end_latency_per_quantile)
    unmeasured = {"nsq.topic.e2e_latency", "nsq.channel.e2e_latency"}
    missing = {o for _, o in pairs} - exported - unmeasured
    assert not missing, missing
    assert "messaging.process.duration" in exported

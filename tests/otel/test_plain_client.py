"""What a plain NSQ client sees of a message published with the trace context in its body:
go-nsq's ``nsq_tail`` (NSQ v1.3.0) reading from the real nsqd v1.3.0 prints the envelope, byte
for byte as docs/otel.md shows it, then the body; this library's consumer, instrumented, reads
the same message as it was published."""

from __future__ import annotations

import subprocess

import pytest
from support.brokers import require_real_binaries

from transports import otel
from transports.sync import Consumer, Producer
from transports.testing.real_nsq import RealNSQD, tool

from .conftest import Telemetry

pytestmark = pytest.mark.timeout(60)


def test_nsq_tail_from_the_real_nsqd_prints_the_envelope_then_the_body(
    telemetry: Telemetry,
) -> None:
    require_real_binaries()
    nsq_tail = tool("nsq_tail")
    assert nsq_tail is not None
    with RealNSQD() as nsqd:
        nsqd.post("/topic/create?topic=orders")
        for channel in ("tail", "instrumented"):  # each gets its copy of the message
            nsqd.post(f"/channel/create?topic=orders&channel={channel}")
        with Producer(nsqd.tcp_address) as producer:
            otel.instrument(producer, propagate=True, **telemetry.providers)
            producer.publish("orders", b'{"id": 1}')
        address = f"--nsqd-tcp-address={nsqd.tcp_address}"
        tailed = subprocess.run(
            [str(nsq_tail), address, "--topic=orders", "--channel=tail", "-n=1"],
            capture_output=True,
            timeout=30,
            check=True,
        )
        with Consumer("orders", "instrumented", nsqd=[nsqd.tcp_address]) as consumer:
            otel.instrument(consumer, propagate=True, **telemetry.providers)
            for msg in consumer:
                body = msg.body
                msg.finish()
                break
    [publish] = telemetry.spans("publish orders")
    ids = publish.context
    traceparent = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{int(ids.trace_flags):02x}"
    # 4 marker bytes, 2 length bytes (69), the header line, the body; nsq_tail adds a newline
    expected = b"\x1eTC1\x00\x45traceparent: " + traceparent.encode() + b'\n{"id": 1}'
    assert len(expected) - len(b'{"id": 1}') == 75
    assert tailed.stdout == expected + b"\n"
    assert body == b'{"id": 1}'

"""Spans of instrumented clients on asyncio, trio and blocking, against the embedded broker:
names, kinds and attributes as the messaging conventions say, parents and links through the
body envelope, and what a consumer without the envelope (or a message without one) sees."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from support.brokers import unique
from support.runtimes import ConsumerDriver, Runtime

from transports import otel
from transports.embedded import EmbeddedNSQD
from transports.otel.envelope import MARKER

from .conftest import Telemetry

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _by_message_id(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    found = {}
    for span in spans:
        message_id = span.attributes["messaging.message.id"]
        assert message_id not in found, message_id
        found[message_id] = span
    return found


def _linked(span: ReadableSpan) -> list[tuple[int, int]]:
    return [(link.context.trace_id, link.context.span_id) for link in span.links]


def _ids(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


async def _take(consumer: ConsumerDriver, count: int) -> list[Any]:
    """The next ``count`` messages by iteration, each finished."""
    taken: list[Any] = []
    with anyio.fail_after(15):
        async for msg in consumer.messages():
            taken.append(msg)
            await consumer.finish(msg)
            if len(taken) == count:
                break
    return taken


async def _publish(
    runtime: Runtime, nsqd: EmbeddedNSQD, topic: str, telemetry: Telemetry | None
) -> None:
    """``one`` (PUB), then ``two`` and ``three`` (MPUB); instrumented with propagation when
    ``telemetry`` is given."""
    async with runtime.producer(nsqd.tcp_address) as p:
        if telemetry is not None:
            otel.instrument(p.client, propagate=True, **telemetry.providers)
        await p.publish(topic, b"one")
        await p.multi_publish(topic, [b"two", b"three"])


async def test_publish_receive_and_settle_spans_are_linked_through_the_envelope(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    await _publish(runtime, nsqd, topic, telemetry)
    async with runtime.consumer(topic, "archive", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        got = await _take(c, 3)
    # user code saw the bodies as they were published: the envelope came off before
    assert [m.body for m in got] == [b"one", b"two", b"three"]

    [pub] = telemetry.spans(f"publish {topic}")
    [mpub] = telemetry.spans(f"multi_publish {topic}")
    host, port = nsqd.tcp_address.rsplit(":", 1)
    for span, operation in ((pub, "publish"), (mpub, "multi_publish")):
        assert span.kind is SpanKind.PRODUCER  # its context is the messages' creation context
        assert span.parent is None
        assert span.attributes["messaging.system"] == "nsq"
        assert span.attributes["messaging.destination.name"] == topic
        assert span.attributes["messaging.operation.name"] == operation
        assert span.attributes["messaging.operation.type"] == "send"
        assert span.attributes["server.address"] == host
        assert span.attributes["server.port"] == int(port)
        assert span.status.status_code is StatusCode.UNSET
    assert "messaging.batch.message_count" not in pub.attributes  # a single-message API
    assert mpub.attributes["messaging.batch.message_count"] == 2

    receives = _by_message_id(telemetry.spans(f"receive {topic}"))
    finishes = _by_message_id(telemetry.spans(f"finish {topic}"))
    for msg, creator in zip(got, (pub, mpub, mpub), strict=True):
        message_id = msg.id.decode()
        receive = receives[message_id]
        assert receive.kind is SpanKind.CLIENT
        assert receive.parent is None  # nothing was current: linked, not parented
        assert _linked(receive) == [_ids(creator)]
        assert receive.attributes["messaging.operation.name"] == "receive"
        assert receive.attributes["messaging.operation.type"] == "receive"
        assert receive.attributes["messaging.consumer.group.name"] == "archive"
        assert receive.attributes["messaging.destination.name"] == topic
        assert receive.attributes["messaging.nsq.message.attempts"] == 1
        assert receive.attributes["server.address"] == host
        settle = finishes[message_id]
        assert settle.kind is SpanKind.CLIENT
        assert settle.attributes["messaging.operation.type"] == "settle"
        assert settle.attributes["messaging.operation.name"] == "finish"
        # no span was current when it was finished: a child of the span that handed it over
        assert settle.parent is not None and settle.parent.span_id == receive.context.span_id
        assert _linked(settle) == [_ids(creator)]


async def test_run_makes_a_process_span_per_handler_call_child_of_the_producer(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    await _publish(runtime, nsqd, topic, telemetry)
    user = telemetry.tracer_provider.get_tracer("user code")
    handled: list[bytes] = []
    async with runtime.consumer(topic, "work", nsqd=nsqd.tcp_address, max_in_flight=1) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)

        def handler(msg: Any) -> None:
            with user.start_as_current_span("user work"):
                handled.append(msg.body)
                if len(handled) == 3:
                    c.client.start_drain()
                if msg.body == b"two":
                    raise ValueError("cannot handle two")

        await c.run(handler, 1)
    assert handled == [b"one", b"two", b"three"]

    [pub] = telemetry.spans(f"publish {topic}")
    [mpub] = telemetry.spans(f"multi_publish {topic}")
    processes = telemetry.spans(f"process {topic}")
    works = telemetry.spans("user work")
    assert len(processes) == len(works) == 3
    settles = _by_message_id(
        telemetry.spans(f"finish {topic}") + telemetry.spans(f"requeue {topic}")
    )
    for process, work, creator in zip(processes, works, (pub, mpub, mpub), strict=True):
        assert process.kind is SpanKind.CONSUMER
        assert process.attributes["messaging.operation.type"] == "process"
        # nothing was current where run() was called: a child of the creation context...
        assert process.parent is not None and process.context.trace_id == creator.context.trace_id
        assert process.parent.span_id == creator.context.span_id
        assert _linked(process) == [_ids(creator)]  # ...and linked to it
        # the handler's own spans are children of the process span
        assert work.parent is not None and work.parent.span_id == process.context.span_id
        # run()'s FIN or REQ after the handler returned or raised: a child of the process span
        settle = settles[process.attributes["messaging.message.id"]]
        assert settle.parent is not None and settle.parent.span_id == process.context.span_id
    failed = processes[1]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"
    assert [e.name for e in failed.events] == ["exception"]
    assert settles[failed.attributes["messaging.message.id"]].name == f"requeue {topic}"
    assert {s.name for s in settles.values()} == {f"finish {topic}", f"requeue {topic}"}
    assert processes[0].status.status_code is StatusCode.UNSET

    durations = telemetry.metrics()["messaging.process.duration"]
    assert sum(count for _, count in durations) == 3
    assert [count for attrs, count in durations if attrs.get("error.type") == "ValueError"] == [1]


async def test_run_inside_a_span_makes_process_spans_its_children_linked_to_the_producer(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    await _publish(runtime, nsqd, topic, telemetry)
    tracer = telemetry.tracer_provider.get_tracer("user code")
    seen: list[bytes] = []
    async with runtime.consumer(topic, "work", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)

        def handler(msg: Any) -> None:
            seen.append(msg.body)
            if len(seen) == 3:
                c.client.start_drain()

        with tracer.start_as_current_span("worker"):
            await c.run(handler, 2)
    [worker] = telemetry.spans("worker")
    creators = {s.context.span_id for s in telemetry.spans() if s.kind is SpanKind.PRODUCER}
    processes = telemetry.spans(f"process {topic}")
    assert sorted(seen) == [b"one", b"three", b"two"] and len(processes) == 3
    for process in processes:
        assert process.parent is not None and process.parent.span_id == worker.context.span_id
        [link] = process.links
        assert link.context.span_id in creators


async def test_fetch_makes_one_receive_span_per_call_with_a_link_per_message(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    await _publish(runtime, nsqd, topic, telemetry)
    async with runtime.consumer(
        topic, "batch", nsqd=nsqd.tcp_address, pull=True, max_in_flight=10
    ) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        fetched: list[Any] = []
        with anyio.fail_after(15):
            while len(fetched) < 3:
                fetched += await c.fetch(3, timeout=2.0)
        if runtime.blocking:
            answered = await anyio.to_thread.run_sync(c.client.finish_many, fetched)
        else:
            answered = await c.client.finish_many(fetched)
    assert answered == 3
    assert sorted(m.body for m in fetched) == [b"one", b"three", b"two"]

    creators = {
        "publish": telemetry.spans(f"publish {topic}")[0],
        "mpub": telemetry.spans(f"multi_publish {topic}")[0],
    }
    fetches = [s for s in telemetry.spans(f"fetch {topic}") if s.links]
    assert sum(s.attributes["messaging.batch.message_count"] for s in fetches) == 3
    links = {}
    for span in fetches:
        assert span.kind is SpanKind.CLIENT
        assert span.attributes["messaging.operation.type"] == "receive"
        assert span.attributes["messaging.operation.name"] == "fetch"
        assert span.end_time >= span.start_time
        for link in span.links:
            links[link.attributes["messaging.message.id"]] = link.context.span_id
    for msg in fetched:
        creator = creators["publish"] if msg.body == b"one" else creators["mpub"]
        assert links[msg.id.decode()] == creator.context.span_id

    [settle] = telemetry.spans(f"finish {topic}")  # one for the batch
    assert settle.attributes["messaging.batch.message_count"] == 3
    assert settle.attributes["messaging.operation.type"] == "settle"
    assert settle.parent is not None and settle.parent.span_id in {
        s.context.span_id for s in fetches
    }
    assert len(settle.links) == 3
    durations = telemetry.metrics()["messaging.client.operation.duration"]
    fetch_calls = [n for a, n in durations if a["messaging.operation.name"] == "fetch"]
    assert sum(fetch_calls) == len(telemetry.spans(f"fetch {topic}"))


async def test_process_block_around_iteration(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """``otel.process(msg)`` in an iteration loop: a process span a child of the producer's,
    current in the block (the FIN inside is its child)."""
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        await p.publish(topic, b"payload")
    async with runtime.consumer(topic, "loop", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        msg = await c.get(10.0)
        assert msg is not None and msg.body == b"payload"
        with otel.process(msg) as span:
            assert span.is_recording()
            await c.finish(msg)
    [pub] = telemetry.spans(f"publish {topic}")
    [process] = telemetry.spans(f"process {topic}")
    [settle] = telemetry.spans(f"finish {topic}")
    assert process.parent is not None and process.parent.span_id == pub.context.span_id
    assert settle.parent is not None and settle.parent.span_id == process.context.span_id


async def test_a_consumer_without_telemetry_sees_the_documented_envelope(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        await p.publish(topic, b'{"order": 17}')
    async with runtime.consumer(topic, "plain", nsqd=nsqd.tcp_address) as c:
        [body] = await c.bodies(1, timeout=10)
    [pub] = telemetry.spans(f"publish {topic}")
    ids = pub.context
    traceparent = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{int(ids.trace_flags):02x}"
    header = f"traceparent: {traceparent}\n".encode()
    # exactly what docs/otel.md says a plain NSQ client reads
    assert body == b"\x1eTC1" + len(header).to_bytes(2, "big") + header + b'{"order": 17}'
    assert otel.unwrap(body) == ({"traceparent": traceparent}, b'{"order": 17}')


async def test_an_instrumented_consumer_passes_bodies_without_an_envelope_unchanged(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    plain = [b"plain text", b'{"json": true}', MARKER + b"\x00\x40not an envelope", MARKER]
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, plain)
    async with runtime.consumer(topic, "reader", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        got = await _take(c, len(plain))
    assert [m.body for m in got] == plain
    receives = telemetry.spans(f"receive {topic}")
    assert len(receives) == len(plain) and all(not s.links for s in receives)


async def test_without_propagation_nothing_is_added_to_bodies_and_publish_is_a_client_span(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, **telemetry.providers)
        await p.publish(topic, b"as is")
        await p.concurrently([("publish", (topic, b"also")), ("publish", (topic, b"too"))], 10)
    async with runtime.consumer(topic, "reader", nsqd=nsqd.tcp_address) as c:
        assert sorted(await c.bodies(3, timeout=10)) == [b"also", b"as is", b"too"]
    publishes = telemetry.spans(f"publish {topic}")
    assert len(publishes) == 3  # the concurrent ones too (futures on the blocking runtime)
    # its context is not any message's creation context: CLIENT, as the conventions say
    assert all(s.kind is SpanKind.CLIENT for s in publishes)


async def test_a_failed_publish_is_an_error_span_and_raises_as_before(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    from nsq_sansio.errors import InvalidName, LocalProtocolError

    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        with pytest.raises(InvalidName):
            await p.publish("bad topic!", b"x")
        with pytest.raises(LocalProtocolError):  # not hidden by the envelope
            await p.publish(unique(), b"")
    [span] = telemetry.spans("publish bad topic!")
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "nsq_sansio.errors.InvalidName"
    sent = telemetry.metrics()["messaging.client.sent.messages"]
    errors = sorted(a["error.type"] for a, _ in sent)
    assert errors == ["nsq_sansio.errors.InvalidName", "nsq_sansio.errors.LocalProtocolError"]


async def test_uninstrument_puts_everything_back(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        otel.uninstrument(p.client)
        assert not {"publish", "multi_publish"} & set(vars(p.client))
        await p.publish(topic, b"raw")
    async with runtime.consumer(topic, "reader", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        otel.uninstrument(c.client)
        assert not {"run", "fetch", "get", "finish_many"} & set(vars(c.client))
        assert await c.bodies(1, timeout=10) == [b"raw"]
    assert telemetry.spans() == []

"""Instrumenting (and uninstrumenting) a consumer that is already consuming, on asyncio, trio
and blocking alike: what docs/otel.md promises of when ``instrument()`` and ``uninstrument()``
take effect, against the embedded broker."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from support.brokers import unique
from support.runtimes import ConsumerDriver, Runtime, wait_until

from transports import otel
from transports.embedded import EmbeddedNSQD
from transports.otel.envelope import MARKER

from .conftest import Telemetry

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

BODIES = [b"one", b"two", b"three"]


async def _publish_with_context(runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry) -> str:
    """A fresh topic holding ``BODIES``, each in a trace context envelope."""
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        await p.multi_publish(topic, BODIES)
    return topic


def _message_ids(spans: list[Any]) -> list[str]:
    return [span.attributes["messaging.message.id"] for span in spans]


async def test_instrumenting_while_iterating_traces_the_later_messages(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """One loop over the consumer, instrumented after its first message: the next messages
    (already buffered when it was instrumented) get receive spans, their envelopes come off,
    and their FINs are children of those spans."""
    topic = await _publish_with_context(runtime, nsqd, telemetry)
    [mpub] = telemetry.spans(f"multi_publish {topic}")
    taken: list[Any] = []
    bodies: list[bytes] = []
    async with runtime.consumer(topic, "late", nsqd=nsqd.tcp_address) as c:
        with anyio.fail_after(15):
            async for msg in c.messages():
                taken.append(msg)
                bodies.append(msg.body)
                await c.finish(msg)
                if len(taken) == 1:
                    otel.instrument(c.client, propagate=True, **telemetry.providers)
                if len(taken) == len(BODIES):
                    break
        # the counters are the consumer's own, from its start: the first message is counted
        consumed = telemetry.metrics()["messaging.client.consumed.messages"]
        assert sum(value for _, value in consumed) == len(BODIES)
    # the first was handed over uninstrumented: its envelope stayed, as for any plain consumer
    assert bodies[0].startswith(MARKER) and bodies[0].endswith(b"one")
    assert bodies[1:] == [b"two", b"three"]
    receives = telemetry.spans(f"receive {topic}")
    assert _message_ids(receives) == [m.id.decode() for m in taken[1:]]
    for receive in receives:
        [link] = receive.links
        assert link.context.span_id == mpub.context.span_id
    finishes = telemetry.spans(f"finish {topic}")
    assert _message_ids(finishes) == _message_ids(receives)
    for finish, receive in zip(finishes, receives, strict=True):
        assert finish.parent is not None and finish.parent.span_id == receive.context.span_id


async def test_uninstrumenting_while_iterating_stops_at_the_next_message(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """One loop over an instrumented consumer, uninstrumented after its first message: the
    next messages get no span and keep their envelope, as a consumer never instrumented."""
    topic = await _publish_with_context(runtime, nsqd, telemetry)
    taken: list[Any] = []
    bodies: list[bytes] = []
    async with runtime.consumer(topic, "early", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)
        with anyio.fail_after(15):
            async for msg in c.messages():
                taken.append(msg)
                bodies.append(msg.body)
                await c.finish(msg)
                if len(taken) == 1:
                    otel.uninstrument(c.client)
                if len(taken) == len(BODIES):
                    break
    assert bodies[0] == b"one"
    assert all(b.startswith(MARKER) for b in bodies[1:]), bodies
    assert _message_ids(telemetry.spans(f"receive {topic}")) == [taken[0].id.decode()]
    assert _message_ids(telemetry.spans(f"finish {topic}")) == [taken[0].id.decode()]


def _waiting_for_a_message(c: ConsumerDriver, runtime: Runtime) -> bool:
    """The consumer has a caller waiting for its next message (nothing is buffered)."""
    if runtime.blocking:
        return bool(c.client._io.sleepers)
    return bool(c.client._waiters)


async def test_a_wait_for_the_next_message_begun_before_instrument_is_traced(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """``get()`` (blocking) or ``__anext__`` (asyncio, trio) already waiting when the consumer
    is instrumented: the message it returns is handed over instrumented."""
    topic = unique()
    got: list[Any] = []
    async with (
        runtime.producer(nsqd.tcp_address) as p,
        runtime.consumer(topic, "waiting", nsqd=nsqd.tcp_address) as c,
    ):
        otel.instrument(p.client, propagate=True, **telemetry.providers)
        await p.publish(topic, b"first")  # the topic and channel exist: the consumer is ready
        first = await c.get(10.0)
        assert first is not None and first.body.endswith(b"first")  # uninstrumented: enveloped
        await c.finish(first)

        async def wait() -> None:
            got.append(await c.get(15.0))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await wait_until(lambda: _waiting_for_a_message(c, runtime), what="a waiting get")
            otel.instrument(c.client, propagate=True, **telemetry.providers)
            await p.publish(topic, b"second")
        [msg] = got
        assert msg is not None and msg.body == b"second"
        await c.finish(msg)
    [receive] = telemetry.spans(f"receive {topic}")
    assert receive.attributes["messaging.message.id"] == msg.id.decode()


async def test_a_run_started_before_instrument_makes_no_process_spans(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """A ``run()`` call already running when the consumer is instrumented goes on without
    process spans (on every runtime, as docs/otel.md says); the FINs its later handler calls
    lead to are settle spans, since each answer asks for the instrumentation anew."""
    topic = await _publish_with_context(runtime, nsqd, telemetry)
    handled: list[Any] = []
    async with runtime.consumer(topic, "late-run", nsqd=nsqd.tcp_address) as c:

        def handler(msg: Any) -> None:
            handled.append(msg)
            if len(handled) == 1:
                otel.instrument(c.client, propagate=True, **telemetry.providers)
            if len(handled) == len(BODIES):
                c.client.start_drain()

        await c.run(handler, 1)
    assert len(handled) == len(BODIES)
    assert telemetry.spans(f"process {topic}") == []
    finishes = telemetry.spans(f"finish {topic}")
    assert _message_ids(finishes) == [m.id.decode() for m in handled]


async def test_uninstrumenting_while_run_runs_stops_its_process_spans(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """``uninstrument()`` during ``run()``: the handler call under way keeps its process span,
    the next ones get none, and their bodies keep their envelope."""
    topic = await _publish_with_context(runtime, nsqd, telemetry)
    handled: list[Any] = []
    bodies: list[bytes] = []
    async with runtime.consumer(topic, "early-run", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, propagate=True, **telemetry.providers)

        def handler(msg: Any) -> None:
            handled.append(msg)
            bodies.append(msg.body)
            if len(handled) == 1:
                otel.uninstrument(c.client)
            if len(handled) == len(BODIES):
                c.client.start_drain()

        await c.run(handler, 1)
    assert bodies[0] == b"one"
    assert all(b.startswith(MARKER) for b in bodies[1:]), bodies
    assert _message_ids(telemetry.spans(f"process {topic}")) == [handled[0].id.decode()]
    assert telemetry.spans(f"finish {topic}") == []  # run()'s FINs came after uninstrument()


async def test_instrumenting_again_while_iterating_switches_providers(
    runtime: Runtime, nsqd: EmbeddedNSQD, telemetry: Telemetry
) -> None:
    """Instrumenting again replaces what was set, for a loop already running too: the next
    messages' spans go to the new tracer provider only."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    other = InMemorySpanExporter()
    other_provider = TracerProvider()
    other_provider.add_span_processor(SimpleSpanProcessor(other))
    topic = await _publish_with_context(runtime, nsqd, telemetry)
    taken: list[Any] = []
    async with runtime.consumer(topic, "again", nsqd=nsqd.tcp_address) as c:
        otel.instrument(c.client, **telemetry.providers)
        with anyio.fail_after(15):
            async for msg in c.messages():
                taken.append(msg)
                if len(taken) == 1:
                    otel.instrument(
                        c.client,
                        tracer_provider=other_provider,
                        meter_provider=telemetry.meter_provider,
                    )
                await c.finish(msg)
                if len(taken) == len(BODIES):
                    break
    other_provider.shutdown()
    ids = [m.id.decode() for m in taken]
    assert _message_ids(telemetry.spans(f"receive {topic}")) == ids[:1]
    moved = [s for s in other.get_finished_spans() if s.name == f"receive {topic}"]
    assert _message_ids(moved) == ids[1:]

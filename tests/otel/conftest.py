"""OpenTelemetry tests: real clients over loopback sockets to the embedded broker, on every
runtime (``runtime``: asyncio, trio, blocking, as in tests/clients), spans and metrics read
back from the SDK's in-memory exporter and reader (``telemetry``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from support.brokers import assert_no_thread_left
from support.runtimes import RUNTIMES, Runtime

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from transports.testing.pytest_plugin import nsqd  # noqa: F401


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Runtime:
    return Runtime(str(request.param))


@pytest.fixture
def anyio_backend(runtime: Runtime) -> str:
    return runtime.anyio_backend


@pytest.fixture(autouse=True)
def no_thread_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    blocking = "runtime" in request.fixturenames and request.getfixturevalue("runtime").blocking
    yield
    if blocking:
        assert_no_thread_left()


#: A metric point as the tests read it: (attributes, value) where value is a counter's or
#: gauge's value, or a histogram's count.
Point = tuple[dict[str, Any], float]


@dataclass
class Telemetry:
    """An SDK tracer provider and meter provider of the test's own, and what they recorded."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    @property
    def providers(self) -> dict[str, Any]:
        """The keyword arguments of ``otel.instrument`` for these providers."""
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        """Finished spans in the order they ended (those named ``name``)."""
        found = list(self.exporter.get_finished_spans())
        return [s for s in found if name is None or s.name == name]

    def metrics(self) -> dict[str, list[Point]]:
        """One collection: every metric's points."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Point]] = {}
        if data is None:
            return found
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = found.setdefault(metric.name, [])
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # a histogram
                        points.append((dict(point.attributes or {}), value))
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Telemetry(tracer_provider, meter_provider, exporter, reader)
    meter_provider.shutdown()
    tracer_provider.shutdown()


def point(points: list[Point], **attributes: Any) -> float:
    """The value of the one point whose attributes include ``attributes``."""
    matching = [v for a, v in points if all(a.get(k) == w for k, w in attributes.items())]
    assert len(matching) == 1, (attributes, points)
    return matching[0]

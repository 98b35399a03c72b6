"""``instrument()``, ``uninstrument()``, ``process()`` and ``instrument_nsqd()``: the public calls
of ``transports.otel`` that need ``opentelemetry-api``."""

from __future__ import annotations

import ssl
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Span, TracerProvider

from nsq_sansio.http_client import DEFAULT_MAX_BODY_SIZE
from transports._common import TLSOptions

from ._metrics import ClientMetrics, NSQDMetrics
from ._tracing import PUBLISH_CALLS, ConsumerTelemetry, ProducerTelemetry

__all__ = ["NSQDInstrumentation", "instrument", "instrument_nsqd", "process", "uninstrument"]

#: The instrumentation scope's name (tracers and meters).
SCOPE = "transports.otel"
#: The semantic conventions the names and attributes follow.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

_Client = TypeVar("_Client")

try:
    _VERSION: str | None = metadata.version("nsq-sansio")
except metadata.PackageNotFoundError:  # run from a source tree
    _VERSION = None


@dataclass
class _Instrumented:
    """What :func:`instrument` did to one client, for :func:`uninstrument` to undo."""

    metrics: ClientMetrics
    wrapped: list[str] = field(default_factory=list)
    hook_owner: Any = None  # the object whose hook attribute was set
    hook_name: str = ""


_instrumented: weakref.WeakKeyDictionary[Any, _Instrumented] = weakref.WeakKeyDictionary()
_client_metrics: dict[int, tuple[MeterProvider, ClientMetrics]] = {}
_nsqd_metrics: dict[int, tuple[MeterProvider, NSQDMetrics]] = {}
_lock = threading.RLock()


def _meter_provider(provider: MeterProvider | None) -> MeterProvider:
    return otel_metrics.get_meter_provider() if provider is None else provider


def _metrics_for(provider: MeterProvider | None) -> ClientMetrics:
    """The client instruments of ``provider`` (the global one when None), made once."""
    provider = _meter_provider(provider)
    with _lock:
        found = _client_metrics.get(id(provider))
        if found is None or found[0] is not provider:
            meter = provider.get_meter(SCOPE, _VERSION, schema_url=SCHEMA_URL)
            found = (provider, ClientMetrics(meter))
            _client_metrics[id(provider)] = found
        return found[1]


def _consumer_hook(client: Any) -> tuple[Any, str] | None:
    """Where a consumer keeps its telemetry hook: ``(owner, attribute)``; None if ``client``
    is no consumer of this library."""
    if not (hasattr(client, "topic") and hasattr(client, "channel")):
        return None
    if hasattr(client, "_telemetry") and hasattr(client, "__anext__"):  # anyio (asyncio, trio)
        return client, "_telemetry"
    io = getattr(client, "_io", None)
    if io is not None and hasattr(io, "telemetry"):  # blocking: the IO side messages answer to
        return io, "telemetry"
    return None


def _current_hook(owner: Any, name: str) -> Callable[[], ConsumerTelemetry | None]:
    """What reads a consumer's telemetry hook as it is at the time of the call (a ``run()``
    under way asks it for each handler call); held weakly, as the consumer is."""
    owner_ref = weakref.ref(owner)

    def current() -> ConsumerTelemetry | None:
        found = getattr(owner_ref(), name, None)
        return found if isinstance(found, ConsumerTelemetry) else None

    return current


def instrument(
    client: _Client,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    propagate: bool = False,
) -> _Client:
    """Trace and measure ``client`` (a consumer or producer of ``transports.anyio``,
    ``transports.trio`` or ``transports.sync``, TCP or HTTP); returns it.

    ``tracer_provider`` / ``meter_provider``: OpenTelemetry's global ones when None.
    ``propagate``: a producer puts its publish span's trace context in an envelope in front
    of each body (see :mod:`transports.otel.envelope`); a consumer takes it off before user
    code sees the body, and links its spans to it. Instrumenting a client again replaces
    what was set before; :func:`uninstrument` undoes it.
    """
    uninstrument(client)
    tracer = (
        trace.get_tracer(SCOPE, _VERSION, schema_url=SCHEMA_URL)
        if tracer_provider is None
        else tracer_provider.get_tracer(SCOPE, _VERSION, schema_url=SCHEMA_URL)
    )
    metrics = _metrics_for(meter_provider)
    done = _Instrumented(metrics)
    wrappers: dict[str, Any] = {}
    hook = _consumer_hook(client)
    if hook is not None:
        owner, name = hook
        asynchronous = name == "_telemetry"
        telemetry = ConsumerTelemetry(
            client,
            tracer,
            metrics,
            propagate=propagate,
            run_is_async=asynchronous,
            current=_current_hook(owner, name),
        )
        c: Any = client
        wrappers["run"] = telemetry.wrap_run(c.run)
        wrappers["fetch"] = telemetry.wrap_fetch(c.fetch)
        if asynchronous:  # finish_many() awaits finish_many_nowait(): one wrapper for both
            wrappers["finish_many_nowait"] = telemetry.wrap_finish_many(c.finish_many_nowait)
        else:
            wrappers["finish_many"] = telemetry.wrap_finish_many(c.finish_many)
        setattr(owner, name, telemetry)
        done.hook_owner, done.hook_name = owner, name
        metrics.add_consumer(client)
    elif hasattr(client, "multi_publish"):
        producer = ProducerTelemetry(client, tracer, metrics, propagate=propagate)
        for name in PUBLISH_CALLS:
            call = getattr(client, name, None)
            if call is not None:
                wrappers[name] = producer.wrap(name, call)
        if callable(getattr(client, "stats", None)):  # HTTPProducer keeps no stats
            metrics.add_producer(client)
    else:
        raise TypeError(
            f"cannot instrument {type(client).__name__}: expected a Consumer, Producer or "
            "HTTPProducer of transports.anyio, transports.trio or transports.sync"
        )
    # On the instance: the class and every other client keep their own methods.
    for name, wrapper in wrappers.items():
        setattr(client, name, wrapper)
        done.wrapped.append(name)
    with _lock:
        _instrumented[client] = done
    return client


def uninstrument(client: Any) -> None:
    """Stop tracing and measuring ``client`` (nothing happens if it was not instrumented)."""
    with _lock:
        done = _instrumented.pop(client, None)
    if done is None:
        return
    for name in done.wrapped:
        vars(client).pop(name, None)
    if done.hook_owner is not None:
        setattr(done.hook_owner, done.hook_name, None)
    done.metrics.discard(client)


@contextmanager
def process(message: Any) -> Iterator[Span]:
    """A process span around handling ``message`` (one from iteration, ``get()`` or
    ``fetch()`` of an instrumented consumer): current while the block runs, a child of the
    span current at the start, else of the message's creation context; it records
    ``messaging.process.duration``, and an exception leaving the block marks it failed.
    For a message of a consumer that is not instrumented it does nothing."""
    owner = getattr(message, "_consumer", None)
    telemetry = getattr(owner, "_telemetry", None) or getattr(owner, "telemetry", None)
    if not isinstance(telemetry, ConsumerTelemetry):
        yield trace.INVALID_SPAN
        return
    with telemetry.processing(message) as span:
        yield span


class NSQDInstrumentation:
    """What :func:`instrument_nsqd` observes; :meth:`close` stops it and closes its
    connections to nsqd."""

    def __init__(self, metrics: NSQDMetrics, key: int) -> None:
        self._metrics = metrics
        self._key: int | None = key

    def close(self) -> None:
        """Stop observing these nsqd (the next collection has none of their figures) and close
        the connections to them; calling it again does nothing."""
        if self._key is not None:
            self._metrics.remove(self._key)
            self._key = None

    def __enter__(self) -> NSQDInstrumentation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def instrument_nsqd(
    http_addresses: Sequence[str],
    *,
    meter_provider: MeterProvider | None = None,
    timeout: float = 5.0,
    tls: TLSOptions | ssl.SSLContext | None = None,
    max_response_size: int = DEFAULT_MAX_BODY_SIZE,
) -> NSQDInstrumentation:
    """Observe the topics and channels of these nsqd (their HTTP addresses, any nsqd, embedded
    or real), read from each one's ``/stats`` once per collection; ``tls`` is for
    ``https://`` addresses. What the Prometheus ``NSQDCollector`` exports, as OpenTelemetry
    instruments."""
    provider = _meter_provider(meter_provider)
    with _lock:
        found = _nsqd_metrics.get(id(provider))
        if found is None or found[0] is not provider:
            meter = provider.get_meter(SCOPE, _VERSION, schema_url=SCHEMA_URL)
            found = (provider, NSQDMetrics(meter))
            _nsqd_metrics[id(provider)] = found
    metrics = found[1]
    key = metrics.add(http_addresses, timeout=timeout, tls=tls, max_response_size=max_response_size)
    return NSQDInstrumentation(metrics, key)

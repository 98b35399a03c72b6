"""OpenTelemetry traces and metrics for consumers, producers and nsqd (the ``otel`` extra).

One call per client, on every runtime (asyncio, trio, blocking)::

    from transports import otel

    otel.instrument(consumer)                    # spans + metrics, global providers
    otel.instrument(producer, propagate=True)    # and the trace context travels in the body
    otel.instrument_nsqd(["127.0.0.1:4151"])     # nsqd's topics and channels, from /stats

Metrics follow the messaging semantic conventions where they name the figure
(``messaging.client.sent.messages``, ``messaging.client.consumed.messages``,
``messaging.client.operation.duration``, ``messaging.process.duration``) and are NSQ's own
(``nsq.*``) for the rest of what the Prometheus export has; the counters are read from each
client's ``stats()`` when the SDK collects, so nothing is counted per message for them.
Spans: ``publish``/``multi_publish``/``deferred_publish``, ``receive``, ``fetch``, ``process``,
``finish``/``requeue`` (see ``docs/otel.md``).

Cost: nothing unless instrumented. The library never imports this package; a consumer that is
not instrumented pays one ``is None`` test per message and per answer, a producer nothing (an
instrumented client's calls are wrapped on that instance only).

NSQ has no message headers, so the trace context travels, when ``propagate=True``, in an
envelope in front of the body: :mod:`transports.otel.envelope` (which needs no OpenTelemetry,
so a plain consumer can take it off with :func:`unwrap`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .envelope import MARKER, unwrap, wrap

if TYPE_CHECKING:
    from ._instrument import (
        NSQDInstrumentation,
        instrument,
        instrument_nsqd,
        process,
        uninstrument,
    )

__all__ = [
    "MARKER",
    "NSQDInstrumentation",
    "instrument",
    "instrument_nsqd",
    "process",
    "uninstrument",
    "unwrap",
    "wrap",
]

_NEEDS_OPENTELEMETRY = {
    "NSQDInstrumentation",
    "instrument",
    "instrument_nsqd",
    "process",
    "uninstrument",
}


def __getattr__(name: str) -> Any:
    """The calls that need ``opentelemetry-api``, imported when first asked for: without it
    installed they raise ImportError naming the extra, and the envelope still works."""
    if name not in _NEEDS_OPENTELEMETRY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from . import _instrument
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == "opentelemetry":
            raise ImportError(
                f"transports.otel.{name} needs opentelemetry-api: "
                "python -m pip install 'nsq-sansio[otel]'"
            ) from exc
        raise
    return getattr(_instrument, name)

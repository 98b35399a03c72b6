"""Spans (and the per-operation metrics) of consumers and producers.

Consumers: the consumer calls :class:`ConsumerTelemetry` (its hook) for each message iteration
or ``get()`` hands to user code and for each ``finish()``/``requeue()``; ``run()``, ``fetch()``
and ``finish_many()`` are wrapped on the instrumented instance (one span per call, or per
handler call). Producers: the publish calls are wrapped on the instance. An uninstrumented
client runs none of this: its hook is None and its methods are the class's own.

Span structure (the messaging conventions' operation types and span kinds):

* ``publish`` / ``multi_publish`` / ``deferred_publish {topic}``: type ``send``, one span per
  call (an MPUB's ``messaging.batch.message_count`` is its size); kind PRODUCER when its
  context travels with the messages (``propagate=True``: it is their creation context),
  CLIENT otherwise.
* ``process {topic}``: type ``process``, kind CONSUMER, around each ``run()`` handler call
  (and :func:`process` blocks): a child of the span current where ``run()`` was called when
  there is one, else of the message's creation context; linked to the creation context.
* ``receive {topic}``: type ``receive``, kind CLIENT, one per message handed over by
  iteration or ``get()`` (the consumer asks its hook for each, so a loop or ``get()`` under
  way when the consumer is instrumented or uninstrumented follows from its next message);
  ``fetch {topic}``: type ``receive``, kind CLIENT, one per ``fetch()`` call over the time
  it took, ``messaging.batch.message_count`` and a link per message (each with its
  ``messaging.message.id``).
* ``finish`` / ``requeue {topic}``: type ``settle``, kind CLIENT, one per answer user code or
  ``run()`` made (one per ``finish_many()`` call); a child of the current span, or, when
  none is current, of the span that handed the message over.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate as otel_propagate
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Tracer
from opentelemetry.trace.status import Status, StatusCode

from transports._common.addresses import parse_address

from . import _semconv as sc
from ._metrics import ClientMetrics
from .envelope import prefix, unwrap

__all__ = ["ConsumerTelemetry", "MessageTrace", "ProducerTelemetry", "error_type"]

_log = logging.getLogger("nsq_sansio.otel")

Attributes = dict[str, "str | int"]


def error_type(error: BaseException) -> str:
    """``error.type``: the exception's class by its full name (``nsq_sansio.errors.BadTopic``;
    a builtin by its own name, ``TimeoutError``)."""
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


class MessageTrace:
    """What telemetry keeps on a message (its ``_trace``): the body user code sees (the
    delivery's, or what is left of it once its envelope came off), the context the message
    was created in (from the envelope), and the span that handed it to user code (receive,
    fetch or process)."""

    __slots__ = ("body", "creation", "span")

    def __init__(self, body: bytes, creation: Context | None, span: SpanContext | None) -> None:
        self.body = body
        self.creation = creation
        self.span = span

    @property
    def creation_span(self) -> SpanContext | None:
        """The creation context's span (the producer's publish span), when there is one."""
        if self.creation is None:
            return None
        found = trace.get_current_span(self.creation).get_span_context()
        return found if found.is_valid else None


def _current_span_valid(ctx: Context | None = None) -> bool:
    return trace.get_current_span(ctx).get_span_context().is_valid


def _context_of(span: SpanContext, base: Context | None = None) -> Context:
    return trace.set_span_in_context(NonRecordingSpan(span), base)


class ConsumerTelemetry:
    """The hook an instrumented consumer calls, and the wrappers of its calls."""

    def __init__(
        self,
        consumer: Any,
        tracer: Tracer,
        metrics: ClientMetrics,
        *,
        propagate: bool,
        run_is_async: bool,
        current: Callable[[], Any],
    ) -> None:
        self.topic: str = consumer.topic
        #: The consumer's telemetry hook as it is now (``self`` while this instrumentation is
        #: on; None, or another one, once uninstrumented or instrumented again).
        self.current = current
        self.channel: str = consumer.channel
        self.tracer = tracer
        self.metrics = metrics
        self.propagate = propagate
        self._run_is_async = run_is_async
        self._base: Attributes = {
            sc.MESSAGING_SYSTEM: sc.SYSTEM,
            sc.MESSAGING_DESTINATION_NAME: self.topic,
            sc.MESSAGING_CONSUMER_GROUP_NAME: self.channel,
        }
        client_id = getattr(getattr(consumer, "config", None), "client_id", None)
        if client_id:
            self._base[sc.MESSAGING_CLIENT_ID] = client_id
        self._names = {
            operation: f"{operation} {self.topic}"
            for operation in ("receive", "fetch", "process", "finish", "requeue")
        }

    # --- per message --------------------------------------------------------------------------

    def trace_of(self, message: Any) -> MessageTrace:
        """The message's trace state; the first time, its envelope is taken off its body (with
        ``propagate``) and the context it carried kept."""
        found: MessageTrace | None = message._trace
        if found is not None:
            return found
        body: bytes = message._delivery.body
        creation = None
        if self.propagate:
            fields, body = unwrap(body)
            if fields is not None:
                extracted = otel_propagate.extract(fields)
                if _current_span_valid(extracted):
                    creation = extracted
        found = MessageTrace(body, creation, None)
        message._trace = found
        return found

    def _attributes(self, message: Any, operation: str, kind: str) -> Attributes:
        address = message._delivery.address
        attributes = dict(self._base)
        attributes[sc.MESSAGING_OPERATION_NAME] = operation
        attributes[sc.MESSAGING_OPERATION_TYPE] = kind
        attributes[sc.MESSAGING_MESSAGE_ID] = message.id.decode("ascii", "replace")
        attributes[sc.NSQ_MESSAGE_ATTEMPTS] = message.attempts
        attributes[sc.SERVER_ADDRESS] = address.host
        attributes[sc.SERVER_PORT] = address.port
        return attributes

    def received(self, message: Any) -> None:
        """Iteration (or ``get()``) hands ``message`` to user code: a receive span, linked to
        where the message was created."""
        try:
            state = self.trace_of(message)
            creation = state.creation_span
            span = self.tracer.start_span(
                self._names["receive"],
                kind=SpanKind.CLIENT,
                attributes=self._attributes(message, "receive", sc.RECEIVE),
                links=[Link(creation)] if creation is not None else None,
            )
            span.end()
            state.span = span.get_span_context()
        except Exception:  # telemetry never breaks consuming
            _log.exception(
                "OpenTelemetry: a %s span failed (the operation itself went on)", "receive"
            )

    def settled(self, message: Any, operation: str) -> None:
        """``finish()`` or ``requeue()`` answered ``message``: a settle span."""
        try:
            state = self.trace_of(message)
            parent = None  # the current context
            if state.span is not None and not _current_span_valid():
                parent = _context_of(state.span)
            creation = state.creation_span
            span = self.tracer.start_span(
                self._names[operation],
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=self._attributes(message, operation, sc.SETTLE),
                links=[Link(creation)] if creation is not None else None,
            )
            span.end()
        except Exception:
            _log.exception(
                "OpenTelemetry: a %s span failed (the operation itself went on)", "settle"
            )

    @contextmanager
    def processing(self, message: Any, ambient: Context | None = None) -> Iterator[Span]:
        """A process span around user code handling ``message`` (current while it runs; see
        the module docstring for its parent). ``ambient``: the context to take as the one
        processing happens in (default: the current one)."""
        if ambient is None:
            ambient = otel_context.get_current()
        state = self.trace_of(message)
        creation = state.creation_span
        if _current_span_valid(ambient) or state.creation is None:
            parent = ambient
        else:
            parent = state.creation
        attributes = self._attributes(message, "process", sc.PROCESS)
        span = self.tracer.start_span(
            self._names["process"],
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=[Link(creation)] if creation is not None else None,
        )
        state.span = span.get_span_context()
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            yield span
        except BaseException as exc:
            error = exc
            raise
        finally:
            otel_context.detach(token)
            seconds = time.perf_counter() - started
            duration = {
                key: value
                for key, value in attributes.items()
                if key not in (sc.MESSAGING_MESSAGE_ID, sc.NSQ_MESSAGE_ATTEMPTS)
            }
            if error is not None:
                _fail(span, error)
                duration[sc.ERROR_TYPE] = error_type(error)
            span.end()
            self.metrics.process_duration.record(seconds, duration)

    # --- wrappers of the consumer's calls -----------------------------------------------------

    def wrap_run(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """``run(handler, ...)`` with each handler call in a process span, made by the
        consumer's instrumentation at the time of the call (none once uninstrumented; the new
        one once instrumented again). While ``run()`` runs no span is current in its workers
        (the context's other values stay), so the FIN/REQ it makes after a handler returns is
        a child of that handler's process span."""
        current = self.current
        if self._run_is_async:

            async def run_async(handler: Any, *args: Any, **kwargs: Any) -> Any:
                ambient = otel_context.get_current()
                if callable(handler):
                    original = handler

                    async def handler(message: Any) -> Any:
                        telemetry = current()
                        if telemetry is None:
                            return await original(message)
                        with telemetry.processing(message, ambient):
                            return await original(message)

                token = otel_context.attach(trace.set_span_in_context(trace.INVALID_SPAN))
                try:
                    return await run(handler, *args, **kwargs)
                finally:
                    otel_context.detach(token)

            return run_async

        def run_blocking(handler: Any, *args: Any, **kwargs: Any) -> Any:
            ambient = otel_context.get_current()
            if callable(handler):
                original = handler

                def handler(message: Any) -> Any:
                    telemetry = current()
                    if telemetry is None:
                        return original(message)
                    with telemetry.processing(message, ambient):
                        return original(message)

            return run(handler, *args, **kwargs)

        return run_blocking

    def wrap_fetch(self, fetch: Callable[..., Any]) -> Callable[..., Any]:
        """``fetch()``: one receive span over the call, with a link per message."""
        fetched = self.fetched
        if inspect.iscoroutinefunction(fetch):

            async def fetch_async(*args: Any, **kwargs: Any) -> Any:
                start = time.time_ns(), time.perf_counter()
                try:
                    messages = await fetch(*args, **kwargs)
                except BaseException as exc:
                    fetched([], start, exc)
                    raise
                fetched(messages, start, None)
                return messages

            return fetch_async

        def fetch_blocking(*args: Any, **kwargs: Any) -> Any:
            start = time.time_ns(), time.perf_counter()
            try:
                messages = fetch(*args, **kwargs)
            except BaseException as exc:
                fetched([], start, exc)
                raise
            fetched(messages, start, None)
            return messages

        return fetch_blocking

    def fetched(
        self, messages: Sequence[Any], start: tuple[int, float], error: BaseException | None
    ) -> None:
        try:
            links = []
            servers = set()
            states = []
            for message in messages:
                state = self.trace_of(message)
                states.append(state)
                address = message._delivery.address
                servers.add((address.host, address.port))
                creation = state.creation_span
                if creation is not None:
                    message_id = message.id.decode("ascii", "replace")
                    links.append(Link(creation, {sc.MESSAGING_MESSAGE_ID: message_id}))
            attributes = dict(self._base)
            attributes[sc.MESSAGING_OPERATION_NAME] = "fetch"
            attributes[sc.MESSAGING_OPERATION_TYPE] = sc.RECEIVE
            if len(servers) == 1:
                host, port = servers.pop()
                attributes[sc.SERVER_ADDRESS] = host
                attributes[sc.SERVER_PORT] = port
            duration = dict(attributes)
            attributes[sc.MESSAGING_BATCH_MESSAGE_COUNT] = len(messages)
            span = self.tracer.start_span(
                self._names["fetch"],
                kind=SpanKind.CLIENT,
                attributes=attributes,
                links=links,
                start_time=start[0],
            )
            if error is not None:
                _fail(span, error)
                duration[sc.ERROR_TYPE] = error_type(error)
            span.end()
            self.metrics.operation_duration.record(time.perf_counter() - start[1], duration)
            handed = span.get_span_context()
            for state in states:
                state.span = handed
        except Exception:
            _log.exception(
                "OpenTelemetry: a %s span failed (the operation itself went on)", "fetch"
            )

    def wrap_finish_many(self, finish_many: Callable[..., int]) -> Callable[..., int]:
        """``finish_many()``: one settle span for the messages it answered."""
        settled_many = self._settled_many

        def traced_finish_many(messages: Any, *args: Any, **kwargs: Any) -> int:
            given = list(messages)
            fresh = list({id(m): m for m in given if not getattr(m, "answered", True)}.values())
            count = finish_many(given, *args, **kwargs)
            if count:
                settled_many([m for m in fresh if m.answered], count)
            return count

        return traced_finish_many

    def _settled_many(self, messages: list[Any], count: int) -> None:
        try:
            states = [self.trace_of(message) for message in messages]
            parent = None
            if not _current_span_valid():
                own = next((state.span for state in states if state.span is not None), None)
                if own is not None:
                    parent = _context_of(own)
            links = []
            for message, state in zip(messages, states, strict=True):
                creation = state.creation_span
                if creation is not None:
                    message_id = message.id.decode("ascii", "replace")
                    links.append(Link(creation, {sc.MESSAGING_MESSAGE_ID: message_id}))
            attributes = dict(self._base)
            attributes[sc.MESSAGING_OPERATION_NAME] = "finish"
            attributes[sc.MESSAGING_OPERATION_TYPE] = sc.SETTLE
            attributes[sc.MESSAGING_BATCH_MESSAGE_COUNT] = count
            span = self.tracer.start_span(
                self._names["finish"],
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=attributes,
                links=links,
            )
            span.end()
        except Exception:
            _log.exception(
                "OpenTelemetry: a %s span failed (the operation itself went on)", "settle"
            )


def _fail(span: Span, error: BaseException) -> None:
    span.set_attribute(sc.ERROR_TYPE, error_type(error))
    if isinstance(error, Exception):
        span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, str(error) or type(error).__name__))


# --- producers ----------------------------------------------------------------------------------

#: The producers' publish calls: name -> (operation, what the second argument is).
PUBLISH_CALLS = {
    "publish": ("publish", "body"),
    "multi_publish": ("multi_publish", "bodies"),
    "deferred_publish": ("deferred_publish", "body"),
    "publish_async": ("publish", "body"),
    "multi_publish_async": ("multi_publish", "bodies"),
    "deferred_publish_async": ("deferred_publish", "body"),
}


class ProducerTelemetry:
    """The wrappers of an instrumented producer's publish calls: a span per call (the trace
    context put in an envelope in front of each body with ``propagate``), and the duration
    and message count of each publish."""

    def __init__(
        self, producer: Any, tracer: Tracer, metrics: ClientMetrics, *, propagate: bool
    ) -> None:
        self.tracer = tracer
        self.metrics = metrics
        self.propagate = propagate
        self._kind = SpanKind.PRODUCER if propagate else SpanKind.CLIENT
        self._server: Attributes = {}
        stats = getattr(producer, "stats", None)
        if callable(stats):
            addresses = {conn.address for conn in stats().connections}
            if len(addresses) == 1:
                host, port = parse_address(addresses.pop())
                self._server = {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port}

    def wrap(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """``call`` (the producer's method ``name``) in a publish span."""
        operation, shape = PUBLISH_CALLS[name]
        begin = self._begin
        end = self._end
        if inspect.iscoroutinefunction(call):

            async def publish_async(topic: Any, payload: Any, *args: Any, **kwargs: Any) -> Any:
                span, payload, start, count = begin(operation, shape, topic, payload)
                try:
                    result = await call(topic, payload, *args, **kwargs)
                except BaseException as exc:
                    end(span, operation, topic, count, start, exc)
                    raise
                end(span, operation, topic, count, start, None)
                return result

            return publish_async

        if name.endswith("_async"):  # the blocking producer's futures

            def publish_future(topic: Any, payload: Any, *args: Any, **kwargs: Any) -> Any:
                span, payload, start, count = begin(operation, shape, topic, payload)
                try:
                    future = call(topic, payload, *args, **kwargs)
                except BaseException as exc:
                    end(span, operation, topic, count, start, exc)
                    raise
                future.add_done_callback(
                    lambda done: end(span, operation, topic, count, start, done.exception())
                )
                return future

            return publish_future

        def publish_blocking(topic: Any, payload: Any, *args: Any, **kwargs: Any) -> Any:
            span, payload, start, count = begin(operation, shape, topic, payload)
            try:
                result = call(topic, payload, *args, **kwargs)
            except BaseException as exc:
                end(span, operation, topic, count, start, exc)
                raise
            end(span, operation, topic, count, start, None)
            return result

        return publish_blocking

    def _attributes(self, operation: str, topic: Any) -> Attributes:
        attributes: Attributes = {
            sc.MESSAGING_SYSTEM: sc.SYSTEM,
            sc.MESSAGING_DESTINATION_NAME: topic if isinstance(topic, str) else repr(topic),
            sc.MESSAGING_OPERATION_NAME: operation,
            sc.MESSAGING_OPERATION_TYPE: sc.SEND,
        }
        attributes.update(self._server)
        return attributes

    def _begin(
        self, operation: str, shape: str, topic: Any, payload: Any
    ) -> tuple[Span, Any, float, int]:
        """Start the span; the payload to send (enveloped with ``propagate``), the start and
        how many messages the call sends."""
        batch = shape == "bodies"
        bodies = None
        if batch and not isinstance(payload, (bytes, str)):
            try:
                bodies = list(payload)  # an iterable is read once, here: the list goes on
            except TypeError:
                pass
            else:
                payload = bodies
        count = len(bodies) if bodies is not None else 1
        attributes = self._attributes(operation, topic)
        if batch:
            attributes[sc.MESSAGING_BATCH_MESSAGE_COUNT] = count
        span = self.tracer.start_span(
            f"{operation} {attributes[sc.MESSAGING_DESTINATION_NAME]}",
            kind=self._kind,
            attributes=attributes,
        )
        if self.propagate:
            try:
                payload = self._envelope(span, payload, bodies)
            except Exception:
                _log.exception(
                    "OpenTelemetry: no trace context envelope (the body is sent as it was)"
                )
        return span, payload, time.perf_counter(), count

    def _envelope(self, span: Span, payload: Any, bodies: list[Any] | None) -> Any:
        carrier: dict[str, str] = {}
        otel_propagate.inject(carrier, context=trace.set_span_in_context(span))
        if not carrier:  # no trace context to carry (no SDK, or an invalid span)
            return payload
        front = prefix(carrier)
        if bodies is not None:
            # bodies the producer will refuse anyway are left as they are, so it still does
            return [front + b if type(b) is bytes and b else b for b in bodies]
        if type(payload) is bytes and payload:
            return front + payload
        return payload

    def _end(
        self,
        span: Span,
        operation: str,
        topic: Any,
        count: int,
        start: float,
        error: BaseException | None,
    ) -> None:
        try:
            seconds = time.perf_counter() - start
            attributes = self._attributes(operation, topic)
            if error is not None:
                _fail(span, error)
                attributes[sc.ERROR_TYPE] = error_type(error)
            span.end()
            self.metrics.operation_duration.record(seconds, attributes)
            self.metrics.sent_messages.add(count, attributes)
        except Exception:
            _log.exception(
                "OpenTelemetry: a %s span failed (the operation itself went on)", "publish"
            )

"""OpenTelemetry instruments for consumers, producers and nsqd.

What the clients count is read from their ``stats()`` when the SDK collects (observable
instruments), as the Prometheus export reads it when it is scraped: nothing is counted per
message for it. The one figure per operation is the duration of a publish, a fetch or a
``run()`` handler call (and the messages a publish sent), recorded when it ends by the
wrappers :func:`~transports.otel.instrument` puts on the client.

One collection reads each client's ``stats()`` (and each nsqd's ``/stats``) once, whatever
the number of instruments: see :class:`_Snapshots`.
"""

from __future__ import annotations

import ssl
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from nsq_sansio.admin import DEFAULT_NSQD_HTTP_PORT, AdminEndpoint, E2ELatency
from nsq_sansio.errors import NSQError
from nsq_sansio.http_client import DEFAULT_MAX_BODY_SIZE
from transports._common import ConsumerStats, ProducerStats, TLSOptions
from transports._common.addresses import parse_address

from . import _semconv as sc

__all__ = ["ClientMetrics", "NSQDMetrics"]

T = TypeVar("T")
Attributes = dict[str, "str | int"]


class _Snapshots(Generic[T]):
    """One reading (``take()``) per collection, shared by the callbacks of every instrument.

    The SDK calls each observable instrument's callback once per collection, one after the
    other. A callback that asks for the reading a second time has started the next
    collection: the reading is taken again. So whatever order the SDK calls them in, every
    instrument of one collection sees the same reading (the figures agree with one another,
    as one Prometheus scrape's do), and ``stats()`` or ``/stats`` is read once, not once per
    instrument.
    """

    def __init__(self, take: Callable[[], T]) -> None:
        self._take = take
        self._lock = threading.Lock()
        self._reading: T | None = None
        self._seen: set[str] = set()

    def get(self, instrument: str) -> T:
        with self._lock:
            if self._reading is None or instrument in self._seen:
                self._reading = self._take()
                self._seen = set()
            self._seen.add(instrument)
            return self._reading


def _server(address: str, default_port: int) -> Attributes:
    """``server.address`` and ``server.port`` of ``host:port``."""
    try:
        host, port = parse_address(address, default_port)
    except ValueError:
        return {sc.SERVER_ADDRESS: address}
    return {sc.SERVER_ADDRESS: host, sc.SERVER_PORT: port}


def _observations(totals: dict[tuple[Any, ...], tuple[Attributes, float]]) -> list[Observation]:
    return [Observation(value, attributes) for attributes, value in totals.values()]


@dataclass
class _ClientReading:
    consumers: list[ConsumerStats]
    producers: list[ProducerStats]


class ClientMetrics:
    """The instruments of one meter provider, over every client instrumented with it.

    Clients are held weakly: one that is garbage collected drops out of the next collection
    (its counters disappear; a backend sees the sum go down, as a counter reset).
    """

    def __init__(self, meter: Meter) -> None:
        self._lock = threading.Lock()
        self._consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._producers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._snapshots = _Snapshots(self._read)
        #: Publishes and fetches (a client operation), seconds: recorded when each ends.
        self.operation_duration = meter.create_histogram(
            sc.CLIENT_OPERATION_DURATION,
            unit="s",
            description="Duration of a publish or a fetch, from the call to its answer",
            explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
        )
        #: ``run()`` handler calls (and ``transports.otel.process`` blocks), seconds.
        self.process_duration = meter.create_histogram(
            sc.PROCESS_DURATION,
            unit="s",
            description="Duration of processing a message (a run() handler call)",
            explicit_bucket_boundaries_advisory=sc.DURATION_BUCKETS,
        )
        #: Messages each publish sent (with ``error.type`` when it failed).
        self.sent_messages = meter.create_counter(
            sc.CLIENT_SENT_MESSAGES,
            unit="{message}",
            description="Messages a producer sent to nsqd (PUB, MPUB, DPUB)",
        )
        kinds = {
            "counter": meter.create_observable_counter,
            "updown": meter.create_observable_up_down_counter,
            "gauge": meter.create_observable_gauge,
        }
        for kind, name, unit, description, reader in _CLIENT_INSTRUMENTS:
            kinds[kind](
                name, callbacks=[self._callback(name, reader)], unit=unit, description=description
            )

    # --- clients ------------------------------------------------------------------------------

    def add_consumer(self, consumer: Any) -> None:
        with self._lock:
            self._consumers.add(consumer)

    def add_producer(self, producer: Any) -> None:
        with self._lock:
            self._producers.add(producer)

    def discard(self, client: Any) -> None:
        with self._lock:
            self._consumers.discard(client)
            self._producers.discard(client)

    def _read(self) -> _ClientReading:
        with self._lock:
            consumers = list(self._consumers)
            producers = list(self._producers)
        # every client's stats() is safe to call from the collecting thread, and never raises
        return _ClientReading(
            [c.stats() for c in consumers],
            [p.stats() for p in producers if callable(getattr(p, "stats", None))],
        )

    def _callback(
        self, name: str, reader: Callable[[_ClientReading], list[Observation]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return reader(self._snapshots.get(name))

        return observe


def _field(name: str) -> Callable[[Any], int]:
    def read(stats: Any) -> int:
        value: int = getattr(stats, name)
        return value

    return read


def _channel_attributes(stats: ConsumerStats) -> Attributes:
    return {
        sc.MESSAGING_SYSTEM: sc.SYSTEM,
        sc.MESSAGING_DESTINATION_NAME: stats.topic,
        sc.MESSAGING_CONSUMER_GROUP_NAME: stats.channel,
    }


def _per_channel(
    value: Callable[[ConsumerStats], int],
    extra: Attributes | None = None,
    combine: Callable[[float, float], float] = lambda a, b: a + b,
) -> Callable[[_ClientReading], list[Observation]]:
    """One observation per topic/channel: the consumers of one channel combined (summed, or
    ``combine``)."""

    def read(reading: _ClientReading) -> list[Observation]:
        totals: dict[tuple[Any, ...], tuple[Attributes, float]] = {}
        for stats in reading.consumers:
            key = (stats.topic, stats.channel)
            found = totals.get(key)
            if found is None:
                attributes = _channel_attributes(stats)
                if extra:
                    attributes.update(extra)
                totals[key] = (attributes, value(stats))
            else:
                totals[key] = (found[0], combine(found[1], value(stats)))
        return _observations(totals)

    return read


def _links(reading: _ClientReading) -> Iterator[tuple[tuple[Any, ...], Attributes, Any]]:
    """(key, attributes, connection) for every consumer connection."""
    for stats in reading.consumers:
        for conn in stats.connections:
            key = (stats.topic, stats.channel, conn.address)
            attributes = _channel_attributes(stats)
            attributes.update(_server(conn.address, 4150))
            yield key, attributes, conn


def _per_link(value: Callable[[Any], int]) -> Callable[[_ClientReading], list[Observation]]:
    def read(reading: _ClientReading) -> list[Observation]:
        totals: dict[tuple[Any, ...], tuple[Attributes, float]] = {}
        for key, attributes, conn in _links(reading):
            found = totals.get(key)
            totals[key] = (attributes, value(conn) + (found[1] if found else 0))
        return _observations(totals)

    return read


def _io(
    rows: Iterable[tuple[tuple[Any, ...], Attributes, Any]],
) -> list[Observation]:
    totals: dict[tuple[Any, ...], tuple[Attributes, float]] = {}
    for key, attributes, conn in rows:
        for direction, value in (
            ("receive", conn.bytes_received),
            ("transmit", conn.bytes_sent),
        ):
            keyed = (*key, direction)
            found = totals.get(keyed)
            if found is None:
                totals[keyed] = ({**attributes, sc.NETWORK_IO_DIRECTION: direction}, value)
            else:
                totals[keyed] = (found[0], found[1] + value)
    return _observations(totals)


def _per_link_io(reading: _ClientReading) -> list[Observation]:
    return _io(_links(reading))


def _nodes(reading: _ClientReading) -> Iterator[tuple[tuple[Any, ...], Attributes, Any]]:
    for stats in reading.producers:
        for conn in stats.connections:
            attributes: Attributes = {sc.MESSAGING_SYSTEM: sc.SYSTEM}
            attributes.update(_server(conn.address, 4150))
            yield (conn.address,), attributes, conn


def _per_node(value: Callable[[Any], int]) -> Callable[[_ClientReading], list[Observation]]:
    def read(reading: _ClientReading) -> list[Observation]:
        totals: dict[tuple[Any, ...], tuple[Attributes, float]] = {}
        for key, attributes, conn in _nodes(reading):
            found = totals.get(key)
            totals[key] = (attributes, value(conn) + (found[1] if found else 0))
        return _observations(totals)

    return read


def _per_node_io(reading: _ClientReading) -> list[Observation]:
    return _io(_nodes(reading))


def _producer_total(field: str) -> Callable[[_ClientReading], list[Observation]]:
    def read(reading: _ClientReading) -> list[Observation]:
        if not reading.producers:
            return []
        total = sum(getattr(stats, field) for stats in reading.producers)
        return [Observation(total, {sc.MESSAGING_SYSTEM: sc.SYSTEM})]

    return read


#: The observable instruments of consumers and producers: (kind, name, unit, description,
#: what each observes of one reading).
_CLIENT_INSTRUMENTS: list[tuple[str, str, str, str, Callable[[_ClientReading], list[Observation]]]]
_CLIENT_INSTRUMENTS = [
    (
        "counter",
        sc.CLIENT_CONSUMED_MESSAGES,
        "{message}",
        "Messages nsqd delivered to the consumer (redeliveries included)",
        _per_channel(
            lambda s: s.received,
            {sc.MESSAGING_OPERATION_NAME: "receive", sc.MESSAGING_OPERATION_TYPE: sc.RECEIVE},
        ),
    ),
    *(
        (
            "counter",
            f"nsq.consumer.messages.{field}",
            "{message}",
            text,
            _per_channel(_field(field)),
        )
        for field, text in (
            ("finished", "Messages FIN'd"),
            ("requeued", "Messages REQ'd (delivered again later)"),
            ("given_up", "Messages given up after max_attempts (FIN'd and reported)"),
            ("taken_back", "Answers that came too late (nsqd had timed the message out)"),
        )
    ),
    (
        "updown",
        "nsq.consumer.in_flight",
        "{message}",
        "Messages delivered and not answered yet, per nsqd connection",
        _per_link(lambda c: c.in_flight),
    ),
    (
        "updown",
        "nsq.consumer.rdy",
        "{message}",
        "RDY last sent to nsqd, per connection (their sum never exceeds max_in_flight)",
        _per_link(lambda c: c.rdy),
    ),
    (
        "counter",
        "nsq.consumer.io",
        "By",
        "Bytes read from (receive) and written to (transmit) nsqd, per connection",
        _per_link_io,
    ),
    (
        "updown",
        "nsq.consumer.max_in_flight",
        "{message}",
        "Configured max_in_flight",
        _per_channel(_field("max_in_flight")),
    ),
    (
        "gauge",
        "nsq.consumer.backoff_level",
        "1",
        "Backoff level (0: not backing off; the highest of the consumers of a channel)",
        _per_channel(_field("backoff_level"), combine=max),
    ),
    (
        "updown",
        "nsq.consumer.backing_off",
        "{consumer}",
        "Consumers backing off (waiting out a window, or testing)",
        _per_channel(lambda s: int(s.backoff_phase != "normal")),
    ),
    (
        "counter",
        "nsq.consumer.backoff_windows",
        "{window}",
        "Backoff windows opened (RDY 0 for a while after failures)",
        _per_channel(_field("backoff_windows")),
    ),
    (
        "updown",
        "nsq.consumer.connections",
        "{connection}",
        "Subscribed nsqd connections",
        _per_channel(lambda s: s.connected),
    ),
    (
        "counter",
        "nsq.consumer.reconnects",
        "{connection}",
        "Connections made again after a loss",
        _per_channel(_field("reconnects")),
    ),
    (
        "counter",
        "nsq.consumer.connection_errors",
        "{error}",
        "Connection attempts that failed",
        _per_channel(_field("connection_errors")),
    ),
    (
        "counter",
        "nsq.producer.publishes",
        "{request}",
        "PUB/MPUB/DPUB requests nsqd acknowledged",
        _producer_total("published"),
    ),
    (
        "counter",
        "nsq.producer.failures",
        "{request}",
        "PUB/MPUB/DPUB requests that failed",
        _producer_total("failed"),
    ),
    (
        "updown",
        "nsq.producer.pending",
        "{request}",
        "Publish requests waiting for nsqd's answer",
        _producer_total("pending"),
    ),
    (
        "updown",
        "nsq.producer.connections",
        "{connection}",
        "Producer connections up, per nsqd",
        _per_node(lambda c: int(c.connected)),
    ),
    (
        "counter",
        "nsq.producer.reconnects",
        "{connection}",
        "Producer connections made again, per nsqd",
        _per_node(lambda c: c.reconnects),
    ),
    (
        "counter",
        "nsq.producer.io",
        "By",
        "Bytes read from (receive) and written to (transmit) nsqd by producers, per nsqd",
        _per_node_io,
    ),
]


# --- nsqd ---------------------------------------------------------------------------------------


@dataclass
class _NSQDReading:
    #: (attributes of the nsqd, its /stats or None when it did not answer)
    nodes: list[tuple[Attributes, Any]]


class NSQDMetrics:
    """nsqd's topics and channels, read from each nsqd's ``/stats`` once per collection,
    through the admin client (one kept-alive connection per nsqd; every answer capped at
    ``max_response_size`` and bounded by ``timeout`` as a whole). An nsqd that does not
    answer reports ``nsq.nsqd.up`` 0 and nothing else for that collection."""

    def __init__(self, meter: Meter) -> None:
        from transports.sync.admin import NSQDAdmin

        self._admin_type = NSQDAdmin
        self._lock = threading.Lock()
        #: What each :meth:`add` registered, by its key: (attributes, admin) per nsqd.
        self._groups: dict[int, list[tuple[Attributes, Any]]] = {}
        self._next_key = 0
        self._snapshots = _Snapshots(self._read)
        counter = meter.create_observable_counter
        updown = meter.create_observable_up_down_counter
        gauge = meter.create_observable_gauge
        topic = _topic_attributes
        channel = _channel_of_topic
        rows: list[tuple[Any, str, str, str, Callable[[_NSQDReading], list[Observation]]]] = [
            (
                gauge,
                "nsq.nsqd.up",
                "1",
                "1 if nsqd answered /stats, else 0",
                _nsqd_up,
            ),
            (
                updown,
                "nsq.topic.depth",
                "{message}",
                "Messages queued in the topic (memory and disk)",
                _per_topic(lambda t: t.depth),
            ),
            (
                counter,
                "nsq.topic.messages",
                "{message}",
                "Messages published to the topic",
                _per_topic(lambda t: t.message_count),
            ),
            (
                gauge,
                "nsq.topic.paused",
                "1",
                "1 if the topic is paused",
                _per_topic(lambda t: int(t.paused)),
            ),
            (
                gauge,
                "nsq.topic.e2e_latency",
                "s",
                "End-to-end latency (publish to FIN) at each quantile nsqd measures, all channels"
                " (when nsqd runs with --e2e-processing-latency-percentile)",
                _latency(lambda node: ((topic(node, t), t.e2e_latency) for t in node[1].topics)),
            ),
            (
                updown,
                "nsq.channel.lag",
                "{message}",
                "Messages published to the topic that the channel has not finished: topic "
                "depth + depth + in flight + deferred",
                _per_channel_of(lambda c: c.lag),
            ),
            (
                updown,
                "nsq.channel.depth",
                "{message}",
                "Messages queued in the channel (memory and disk)",
                _per_channel_of(lambda c: c.depth),
            ),
            (
                updown,
                "nsq.channel.in_flight",
                "{message}",
                "Messages sent to clients and not answered",
                _per_channel_of(lambda c: c.in_flight_count),
            ),
            (
                updown,
                "nsq.channel.deferred",
                "{message}",
                "Messages deferred (DPUB, or REQ with a delay)",
                _per_channel_of(lambda c: c.deferred_count),
            ),
            (
                counter,
                "nsq.channel.messages",
                "{message}",
                "Messages the channel received",
                _per_channel_of(lambda c: c.message_count),
            ),
            (
                counter,
                "nsq.channel.requeued",
                "{message}",
                "Messages requeued (REQ)",
                _per_channel_of(lambda c: c.requeue_count),
            ),
            (
                counter,
                "nsq.channel.timed_out",
                "{message}",
                "Messages nsqd took back after msg_timeout",
                _per_channel_of(lambda c: c.timeout_count),
            ),
            (
                updown,
                "nsq.channel.clients",
                "{client}",
                "Clients subscribed to the channel",
                _per_channel_of(lambda c: c.client_count),
            ),
            (
                gauge,
                "nsq.channel.paused",
                "1",
                "1 if the channel is paused",
                _per_channel_of(lambda c: int(c.paused)),
            ),
            (
                gauge,
                "nsq.channel.e2e_latency",
                "s",
                "End-to-end latency (publish to FIN) at each quantile nsqd measures (when nsqd"
                " runs with --e2e-processing-latency-percentile)",
                _latency(
                    lambda node: (
                        (channel(topic(node, t), c), c.e2e_latency)
                        for t in node[1].topics
                        for c in t.channels
                    )
                ),
            ),
        ]
        for factory, name, unit, description, reader in rows:
            factory(
                name, callbacks=[self._callback(name, reader)], unit=unit, description=description
            )

    def add(
        self,
        http_addresses: Sequence[str],
        *,
        timeout: float,
        tls: TLSOptions | ssl.SSLContext | None,
        max_response_size: int = DEFAULT_MAX_BODY_SIZE,
    ) -> int:
        """Observe these nsqd from the next collection on; the key :meth:`remove` takes."""
        group: list[tuple[Attributes, Any]] = []
        for address in http_addresses:
            endpoint = AdminEndpoint.parse(address, DEFAULT_NSQD_HTTP_PORT)
            admin = self._admin_type(
                endpoint,
                timeout=timeout,
                connect_timeout=min(timeout, 5.0),
                tls=tls if endpoint.tls else None,
                max_response_size=max_response_size,
            )
            admin.__enter__()  # one kept-alive connection, reused by every collection
            attributes: Attributes = {
                sc.MESSAGING_SYSTEM: sc.SYSTEM,
                sc.SERVER_ADDRESS: endpoint.host,
                sc.SERVER_PORT: endpoint.port,
            }
            group.append((attributes, admin))
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._groups[key] = group
        return key

    def remove(self, key: int) -> None:
        """Stop observing what :meth:`add` returned ``key`` for; close its connections."""
        with self._lock:
            group = self._groups.pop(key, [])
        for _, admin in group:
            admin.close()

    def _read(self) -> _NSQDReading:
        with self._lock:
            nodes = [node for group in self._groups.values() for node in group]
        reading = _NSQDReading([])
        for attributes, admin in nodes:
            try:
                # without the client lists the answer stays small; client_count counts them
                stats = admin.stats(include_clients=False)
            except (NSQError, OSError):  # refused, broken, too big, timed out, not /stats
                stats = None
            reading.nodes.append((attributes, stats))
        return reading

    def _callback(
        self, name: str, reader: Callable[[_NSQDReading], list[Observation]]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return reader(self._snapshots.get(name))

        return observe


def _nsqd_up(reading: _NSQDReading) -> list[Observation]:
    return [Observation(int(stats is not None), attributes) for attributes, stats in reading.nodes]


def _topic_attributes(node: tuple[Attributes, Any], topic: Any) -> Attributes:
    return {**node[0], sc.MESSAGING_DESTINATION_NAME: topic.name}


def _channel_of_topic(topic_attributes: Attributes, channel: Any) -> Attributes:
    return {**topic_attributes, sc.MESSAGING_CONSUMER_GROUP_NAME: channel.name}


def _per_topic(value: Callable[[Any], int]) -> Callable[[_NSQDReading], list[Observation]]:
    def read(reading: _NSQDReading) -> list[Observation]:
        return [
            Observation(value(topic), _topic_attributes(node, topic))
            for node in reading.nodes
            if node[1] is not None
            for topic in node[1].topics
        ]

    return read


def _per_channel_of(value: Callable[[Any], int]) -> Callable[[_NSQDReading], list[Observation]]:
    def read(reading: _NSQDReading) -> list[Observation]:
        return [
            Observation(value(channel), _channel_of_topic(_topic_attributes(node, topic), channel))
            for node in reading.nodes
            if node[1] is not None
            for topic in node[1].topics
            for channel in topic.channels
        ]

    return read


def _latency(
    entries: Callable[[tuple[Attributes, Any]], Iterable[tuple[Attributes, E2ELatency | None]]],
) -> Callable[[_NSQDReading], list[Observation]]:
    """One observation per quantile nsqd measures, once its window has seen a message (before
    that nsqd reports 0 for every quantile, which is no latency at all)."""

    def read(reading: _NSQDReading) -> list[Observation]:
        found = []
        for node in reading.nodes:
            if node[1] is None:
                continue
            for attributes, latency in entries(node):
                if latency is None or latency.count == 0:
                    continue
                for entry in latency.percentiles:
                    labelled = {**attributes, sc.NSQ_LATENCY_QUANTILE: repr(entry.quantile)}
                    found.append(Observation(entry.seconds, labelled))
        return found

    return read

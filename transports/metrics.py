"""Prometheus metrics for consumers, producers and nsqd (the ``metrics`` extra).

One call per client, on every runtime (asyncio, trio, blocking)::

    from transports import metrics

    metrics.instrument(consumer)          # a Consumer of transports.anyio/trio/sync
    metrics.instrument(producer)          # a Producer of any of them
    metrics.start_http_server("0.0.0.0:9117")   # or mount prometheus_client's own app

Nothing is counted per message: the collectors read each client's ``stats()`` (counters the
core keeps anyway) when Prometheus scrapes, so an instrumented client costs what it cost
before, and an uninstrumented one nothing at all. The one per-publish figure, the publish
latency histogram, comes from the producers' ``publish_observer`` hook (called once per
PUB/MPUB/DPUB answer), which is None unless :func:`instrument` (or the user) sets it.

:class:`NSQDCollector` exports an nsqd's topics and channels from its ``/stats`` (any nsqd,
embedded or real), each channel's lag included, read through the admin client (capped, typed);
``nsq-sansio nsqd --metrics-address`` serves it for the embedded broker. ``docs/grafana/``
has a Grafana dashboard of every series.

Label sets: consumers ``topic``/``channel`` (plus ``nsqd`` for the per-connection RDY,
in-flight and bytes), producers ``nsqd`` (connections) and ``topic`` (what the hook reports),
nsqd ``nsqd``/``topic``/``channel``. Clients with the same labels in one process (two
consumers of one channel) are summed, as Prometheus would sum them anyway.
"""

from __future__ import annotations

import ssl
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Histogram
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nsq_sansio.admin import DEFAULT_NSQD_HTTP_PORT, AdminEndpoint, E2ELatency
from nsq_sansio.errors import NSQError
from nsq_sansio.http_client import DEFAULT_MAX_BODY_SIZE
from transports._common import ConsumerStats, ProducerStats, TLSOptions
from transports.sync.admin import NSQDAdmin

__all__ = [
    "PUBLISH_BUCKETS",
    "ClientCollector",
    "NSQDCollector",
    "PublishObserver",
    "collector",
    "instrument",
    "serve_nsqd_metrics",
    "start_http_server",
    "uninstrument",
]

#: Publish latency buckets (seconds): a loopback PUB answers in ~0.1 ms, a loaded cluster in
#: tens of ms, a failover or timeout in seconds.
PUBLISH_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

_Client = TypeVar("_Client")
_Family = CounterMetricFamily | GaugeMetricFamily


class PublishObserver:
    """The producers' ``publish_observer``: one call per PUB/MPUB/DPUB when it completes.

    ``(topic, messages in the request, seconds from call to answer, error or None)``. A
    success is observed in the latency histogram and counts its messages; a failure counts
    once under the error's class name. Thread-safe (prometheus_client's own locks).
    """

    def __init__(self, buckets: Sequence[float] = PUBLISH_BUCKETS) -> None:
        self.latency = Histogram(
            "nsq_producer_publish_duration_seconds",
            "Seconds from a publish call to nsqd's answer, successful PUB/MPUB/DPUB",
            ["topic"],
            buckets=tuple(buckets),
            registry=None,
        )
        self._messages: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def __call__(
        self, topic: str, messages: int, seconds: float, error: BaseException | None
    ) -> None:
        if error is None:
            self.latency.labels(topic).observe(seconds)
            with self._lock:
                self._messages[topic] = self._messages.get(topic, 0) + messages
        else:
            key = (topic, type(error).__name__)
            with self._lock:
                self._errors[key] = self._errors.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        """The latency histogram and the per-topic message and error counters (a scrape)."""
        yield from self.latency.collect()
        messages = CounterMetricFamily(
            "nsq_producer_topic_messages",
            "Messages nsqd acknowledged, per topic",
            labels=["topic"],
        )
        errors = CounterMetricFamily(
            "nsq_producer_publish_errors",
            "Publishes that failed, per topic and error class",
            labels=["topic", "error"],
        )
        with self._lock:
            for topic, count in sorted(self._messages.items()):
                messages.add_metric([topic], count)
            for (topic, error), count in sorted(self._errors.items()):
                errors.add_metric([topic, error], count)
        yield messages
        yield errors


def _is_consumer(client: Any) -> bool:
    return hasattr(client, "channel") and hasattr(client, "topic") and hasattr(client, "stats")


def _is_producer(client: Any) -> bool:
    return hasattr(client, "multi_publish") and hasattr(client, "stats")


class ClientCollector(Collector):
    """Consumers' and producers' figures, read from their ``stats()`` at scrape time.

    Clients are held weakly: a consumer that is garbage collected drops out of the next
    scrape (its counters disappear, which Prometheus treats as a reset).
    """

    def __init__(self) -> None:
        self._consumers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._producers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.publishes = PublishObserver()

    def add(self, client: Any) -> None:
        """Export ``client`` (a consumer or a producer of any transport) from now on."""
        if _is_consumer(client):
            with self._lock:
                self._consumers.add(client)
        elif _is_producer(client):
            with self._lock:
                self._producers.add(client)
        else:
            raise TypeError(
                f"cannot instrument {type(client).__name__}: expected a Consumer or Producer"
                " of transports.anyio, transports.trio or transports.sync"
            )

    def discard(self, client: Any) -> None:
        with self._lock:
            self._consumers.discard(client)
            self._producers.discard(client)

    def describe(self) -> Iterable[Metric]:
        """The metric names (no samples), so registering does not read any client."""
        yield from self._consumer_families().values()
        yield from self._producer_families().values()
        yield from self.publishes.collect()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            consumers = list(self._consumers)
            producers = list(self._producers)
        # Every client's stats() is safe to call from this (the scrape) thread.
        yield from self._collect_consumers([c.stats() for c in consumers])
        yield from self._collect_producers([p.stats() for p in producers])
        yield from self.publishes.collect()

    # --- consumers ------------------------------------------------------------------------------

    @staticmethod
    def _consumer_families() -> dict[str, _Family]:
        tc = ["topic", "channel"]
        tcn = ["topic", "channel", "nsqd"]

        def counter(name: str, doc: str, labels: list[str] = tc) -> CounterMetricFamily:
            return CounterMetricFamily(f"nsq_consumer_{name}", doc, labels=labels)

        def gauge(name: str, doc: str, labels: list[str] = tc) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"nsq_consumer_{name}", doc, labels=labels)

        return {
            "received": counter("messages_received", "Messages delivered by nsqd"),
            "finished": counter("messages_finished", "Messages FIN'd"),
            "requeued": counter("messages_requeued", "Messages REQ'd (retried later)"),
            "given_up": counter(
                "messages_given_up", "Messages given up after max_attempts (FIN'd, reported)"
            ),
            "taken_back": counter(
                "messages_taken_back", "Answers that came too late (nsqd had timed them out)"
            ),
            "reconnects": counter("reconnects", "Connections re-established after a loss"),
            "connection_errors": counter("connection_errors", "Connection attempts that failed"),
            "in_flight": gauge("in_flight", "Messages delivered and not answered yet", tcn),
            "rdy": gauge("rdy", "RDY last sent to nsqd", tcn),
            "bytes_received": counter("bytes_received", "Bytes read from nsqd", tcn),
            "bytes_sent": counter("bytes_sent", "Bytes written to nsqd", tcn),
            "max_in_flight": gauge("max_in_flight", "Configured max_in_flight"),
            "backoff_level": gauge("backoff_level", "Backoff level (0: not backing off)"),
            "backing_off": gauge(
                "backing_off", "Consumers backing off (waiting out a window, or testing)"
            ),
            "backoff_windows": counter(
                "backoff_windows", "Backoff windows opened (RDY 0 for a while after failures)"
            ),
            "connections": gauge("connections", "Subscribed nsqd connections"),
        }

    def _collect_consumers(self, snapshots: list[ConsumerStats]) -> Iterator[Metric]:
        families = self._consumer_families()
        per_channel: dict[tuple[str, str], dict[str, float]] = {}
        per_link: dict[tuple[str, str, str], dict[str, float]] = {}
        summed = ("received", "finished", "requeued", "given_up", "taken_back")
        for s in snapshots:
            key = (s.topic, s.channel)
            row = per_channel.setdefault(key, dict.fromkeys(families, 0.0))
            for name in summed:
                row[name] += getattr(s, name)
            row["reconnects"] += s.reconnects
            row["connection_errors"] += s.connection_errors
            row["max_in_flight"] += s.max_in_flight
            row["backoff_level"] = max(row["backoff_level"], s.backoff_level)
            row["backing_off"] += s.backoff_phase != "normal"
            row["backoff_windows"] += s.backoff_windows
            row["connections"] += s.connected
            for conn in s.connections:
                link = per_link.setdefault(
                    (s.topic, s.channel, conn.address), dict.fromkeys(families, 0.0)
                )
                link["in_flight"] += conn.in_flight
                link["rdy"] += conn.rdy
                link["bytes_received"] += conn.bytes_received
                link["bytes_sent"] += conn.bytes_sent
        link_names = ("in_flight", "rdy", "bytes_received", "bytes_sent")
        for name, family in families.items():
            if name in link_names:
                for link_key, values in sorted(per_link.items()):
                    family.add_metric(list(link_key), values[name])
            else:
                for channel_key, values in sorted(per_channel.items()):
                    family.add_metric(list(channel_key), values[name])
            yield family

    # --- producers ------------------------------------------------------------------------------

    @staticmethod
    def _producer_families() -> dict[str, _Family]:
        n = ["nsqd"]
        return {
            "published": CounterMetricFamily(
                "nsq_producer_publishes",
                "PUB/MPUB/DPUB requests nsqd acknowledged",
                labels=[],
            ),
            "failed": CounterMetricFamily(
                "nsq_producer_publish_failures", "Publish requests that failed", labels=[]
            ),
            "pending": GaugeMetricFamily(
                "nsq_producer_pending", "Publish requests waiting for nsqd's answer", labels=[]
            ),
            "connected": GaugeMetricFamily(
                "nsq_producer_connected", "1 while the connection to nsqd is up", labels=n
            ),
            "reconnects": CounterMetricFamily(
                "nsq_producer_reconnects", "Connections to nsqd made again", labels=n
            ),
            "bytes_sent": CounterMetricFamily(
                "nsq_producer_bytes_sent", "Bytes written to nsqd", labels=n
            ),
            "bytes_received": CounterMetricFamily(
                "nsq_producer_bytes_received", "Bytes read from nsqd", labels=n
            ),
        }

    def _collect_producers(self, snapshots: list[ProducerStats]) -> Iterator[Metric]:
        families = self._producer_families()
        totals = {"published": 0, "failed": 0, "pending": 0}
        per_node: dict[str, dict[str, int]] = {}
        for s in snapshots:
            totals["published"] += s.published
            totals["failed"] += s.failed
            totals["pending"] += s.pending
            for conn in s.connections:
                node = per_node.setdefault(
                    conn.address, {"connected": 0, "reconnects": 0, "bytes_sent": 0}
                )
                node["connected"] = max(node["connected"], int(conn.connected))
                node["reconnects"] += conn.reconnects
                node["bytes_sent"] += conn.bytes_sent
                node["bytes_received"] = node.get("bytes_received", 0) + conn.bytes_received
        for name, family in families.items():
            if name in totals:
                if snapshots:
                    family.add_metric([], totals[name])
            else:
                for address, values in sorted(per_node.items()):
                    family.add_metric([address], values.get(name, 0))
            yield family


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, ClientCollector] = (
    weakref.WeakKeyDictionary()
)
_collectors_lock = threading.Lock()


def collector(registry: CollectorRegistry | None = None) -> ClientCollector:
    """The :class:`ClientCollector` of ``registry`` (the default registry when None),
    registered with it on first use."""
    registry = REGISTRY if registry is None else registry
    with _collectors_lock:
        found = _collectors.get(registry)
        if found is None:
            found = ClientCollector()
            registry.register(found)
            _collectors[registry] = found
        return found


def instrument(client: _Client, *, registry: CollectorRegistry | None = None) -> _Client:
    """Export ``client``'s figures through ``registry``; returns the client.

    Works for the consumers and producers of ``transports.anyio`` (asyncio and trio),
    ``transports.trio`` and ``transports.sync``. For a producer it also sets its
    ``publish_observer`` (kept: an observer already set is called too) so that publish
    latency is measured.
    """
    found = collector(registry)
    found.add(client)
    if _is_producer(client) and hasattr(client, "publish_observer"):
        previous = client.publish_observer
        observer = found.publishes
        if previous is None or previous is observer:
            client.publish_observer = observer
        else:
            client.publish_observer = _chain(previous, observer)
    return client


def uninstrument(client: Any, *, registry: CollectorRegistry | None = None) -> None:
    """Stop exporting ``client`` (its counters disappear from the next scrape)."""
    collector(registry).discard(client)


def _chain(
    first: Callable[[str, int, float, BaseException | None], None],
    second: Callable[[str, int, float, BaseException | None], None],
) -> Callable[[str, int, float, BaseException | None], None]:
    def observe(topic: str, messages: int, seconds: float, error: BaseException | None) -> None:
        first(topic, messages, seconds, error)
        second(topic, messages, seconds, error)

    return observe


# --- nsqd ---------------------------------------------------------------------------------------


class NSQDCollector(Collector):
    """Topics and channels of one or more nsqd, read from their HTTP ``/stats`` per scrape.

    Works with any nsqd (embedded or real), through :class:`~transports.sync.admin.NSQDAdmin`
    (one per nsqd, its connection kept alive from one scrape to the next; every answer capped
    at ``max_response_size`` and bounded by ``timeout`` as a whole). An nsqd that does not
    answer, or answers what is not nsqd's ``/stats``, is reported by ``nsq_nsqd_up{nsqd} 0``
    and leaves its series out of that scrape. ``tls`` is for ``https://`` addresses.
    """

    def __init__(
        self,
        http_addresses: Sequence[str],
        timeout: float = 5.0,
        *,
        tls: TLSOptions | ssl.SSLContext | None = None,
        max_response_size: int = DEFAULT_MAX_BODY_SIZE,
    ) -> None:
        self._admins: list[NSQDAdmin] = []
        for address in http_addresses:
            endpoint = AdminEndpoint.parse(address, DEFAULT_NSQD_HTTP_PORT)
            admin = NSQDAdmin(
                endpoint,
                timeout=timeout,
                connect_timeout=min(timeout, 5.0),
                tls=tls if endpoint.tls else None,
                max_response_size=max_response_size,
            )
            admin.__enter__()  # one kept-alive connection, reused by every scrape
            self._admins.append(admin)
        #: The ``nsqd`` label of each: its HTTP ``host:port``.
        self.addresses = [admin.endpoint.host_header for admin in self._admins]
        self.timeout = timeout

    def close(self) -> None:
        """Close the kept-alive connections (a later scrape opens them again)."""
        for admin in self._admins:
            admin.close()

    @staticmethod
    def _families() -> dict[str, _Family]:
        t = ["nsqd", "topic"]
        c = ["nsqd", "topic", "channel"]
        return {
            "up": GaugeMetricFamily("nsq_nsqd_up", "1 if nsqd answered /stats", labels=["nsqd"]),
            "topic_depth": GaugeMetricFamily(
                "nsq_topic_depth", "Messages queued in the topic (memory + disk)", labels=t
            ),
            "topic_messages": CounterMetricFamily(
                "nsq_topic_messages", "Messages published to the topic", labels=t
            ),
            "topic_paused": GaugeMetricFamily("nsq_topic_paused", "1 if paused", labels=t),
            "topic_e2e": GaugeMetricFamily(
                "nsq_topic_e2e_latency_seconds",
                "End-to-end latency (publish to FIN) at a quantile over nsqd's window, all "
                "channels (when nsqd runs with --e2e-processing-latency-percentile)",
                labels=[*t, "quantile"],
            ),
            "lag": GaugeMetricFamily(
                "nsq_channel_lag",
                "Messages published to the topic that the channel has not finished: "
                "topic depth + depth + in flight + deferred",
                labels=c,
            ),
            "depth": GaugeMetricFamily(
                "nsq_channel_depth", "Messages queued in the channel (memory + disk)", labels=c
            ),
            "in_flight": GaugeMetricFamily(
                "nsq_channel_in_flight", "Messages sent to clients, not answered", labels=c
            ),
            "deferred": GaugeMetricFamily(
                "nsq_channel_deferred", "Messages deferred (DPUB or REQ with delay)", labels=c
            ),
            "messages": CounterMetricFamily(
                "nsq_channel_messages", "Messages the channel received", labels=c
            ),
            "requeued": CounterMetricFamily(
                "nsq_channel_requeued", "Messages requeued (REQ)", labels=c
            ),
            "timed_out": CounterMetricFamily(
                "nsq_channel_timed_out", "Messages nsqd took back after msg_timeout", labels=c
            ),
            "clients": GaugeMetricFamily("nsq_channel_clients", "Subscribed clients", labels=c),
            "paused": GaugeMetricFamily("nsq_channel_paused", "1 if paused", labels=c),
            "e2e": GaugeMetricFamily(
                "nsq_channel_e2e_latency_seconds",
                "End-to-end latency (publish to FIN) at a quantile over nsqd's window "
                "(when nsqd runs with --e2e-processing-latency-percentile)",
                labels=[*c, "quantile"],
            ),
        }

    def describe(self) -> Iterable[Metric]:
        return list(self._families().values())

    def collect(self) -> Iterator[Metric]:
        f = self._families()
        for address, admin in zip(self.addresses, self._admins, strict=True):
            try:
                # without client lists the answer stays small; client_count still counts them
                stats = admin.stats(include_clients=False)
            except (NSQError, OSError):  # refused, broken, too big, timed out, not /stats
                f["up"].add_metric([address], 0)
                continue
            f["up"].add_metric([address], 1)
            for topic in stats.topics:
                labels = [address, topic.name]
                f["topic_depth"].add_metric(labels, topic.depth)
                f["topic_messages"].add_metric(labels, topic.message_count)
                f["topic_paused"].add_metric(labels, int(topic.paused))
                _add_latency(f["topic_e2e"], labels, topic.e2e_latency)
                for ch in topic.channels:
                    labels = [address, topic.name, ch.name]
                    f["lag"].add_metric(labels, ch.lag)
                    f["depth"].add_metric(labels, ch.depth)
                    f["in_flight"].add_metric(labels, ch.in_flight_count)
                    f["deferred"].add_metric(labels, ch.deferred_count)
                    f["messages"].add_metric(labels, ch.message_count)
                    f["requeued"].add_metric(labels, ch.requeue_count)
                    f["timed_out"].add_metric(labels, ch.timeout_count)
                    f["clients"].add_metric(labels, ch.client_count)
                    f["paused"].add_metric(labels, int(ch.paused))
                    _add_latency(f["e2e"], labels, ch.e2e_latency)
        yield from f.values()


def _add_latency(family: _Family, labels: list[str], latency: E2ELatency | None) -> None:
    """A sample per quantile nsqd measures, once its window has seen a message (before that
    nsqd reports 0 for every quantile, which is no latency at all)."""
    if latency is None or latency.count == 0:
        return
    for entry in latency.percentiles:
        family.add_metric([*labels, repr(entry.quantile)], entry.seconds)  # "0.99"


# --- serving ------------------------------------------------------------------------------------


def start_http_server(
    address: str, registry: CollectorRegistry | None = None
) -> tuple[Any, threading.Thread]:
    """Serve ``registry`` (default: the default registry) at ``http://address/metrics`` from a
    daemon thread; ``address`` is ``host:port`` (port 0 picks a free one: read it from
    ``server.server_address``). Returns prometheus_client's ``(server, thread)``; call
    ``server.shutdown()`` to stop it."""
    host, port = _listen_address(address)
    return _start_http_server(port, addr=host, registry=REGISTRY if registry is None else registry)


def serve_nsqd_metrics(address: str, nsqd_http_addresses: Sequence[str]) -> Any:
    """Serve an :class:`NSQDCollector` of ``nsqd_http_addresses`` (alone in its registry) at
    ``http://address/metrics``; returns the server (``server.shutdown()`` stops it)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(NSQDCollector(nsqd_http_addresses))
    server, _ = start_http_server(address, registry)
    return server


def _listen_address(address: str) -> tuple[str, int]:
    text = address.strip()
    if text.startswith(":"):
        text = "0.0.0.0" + text
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)

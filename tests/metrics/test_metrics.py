"""Prometheus export (``transports.metrics``): real clients over loopback sockets to the
embedded broker, the exposition scraped over HTTP and parsed, values checked against what
was sent."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from transports import metrics
from transports.embedded import EmbeddedLookupd, EmbeddedNSQD

pytestmark = pytest.mark.timeout(60)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """GET a Prometheus exposition and parse it: {(sample name, labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _broker_samples(collector: metrics.NSQDCollector) -> Samples:
    """One scrape of ``collector``, as :func:`scrape` parses one."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in collector.collect()
        for s in family.samples
    }


@pytest.fixture
def served() -> Iterator[tuple[CollectorRegistry, str]]:
    """A fresh registry served over HTTP on a free loopback port."""
    registry = CollectorRegistry()
    server, thread = metrics.start_http_server("127.0.0.1:0", registry)
    try:
        yield registry, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_blocking_consumer_and_producer_scraped(
    nsqd: EmbeddedNSQD, served: tuple[CollectorRegistry, str]
) -> None:
    from transports.sync import Consumer, Producer

    registry, url = served
    with Producer(nsqd.tcp_address) as producer:
        metrics.instrument(producer, registry=registry)
        producer.multi_publish("orders", [f"m{i}".encode() for i in range(30)])
        producer.publish("orders", b"last")
        samples = scrape(url)
        assert value(samples, "nsq_producer_publishes_total") == 2
        assert value(samples, "nsq_producer_publish_failures_total") == 0
        assert value(samples, "nsq_producer_pending") == 0
        assert value(samples, "nsq_producer_connected", nsqd=nsqd.tcp_address) == 1
        assert value(samples, "nsq_producer_bytes_sent_total", nsqd=nsqd.tcp_address) > 31 * 2

    requeued = 0
    with Consumer("orders", "billing", nsqd=[nsqd.tcp_address], max_in_flight=7) as consumer:
        metrics.instrument(consumer, registry=registry)
        finished = 0
        while finished < 31:
            msg = consumer.get(timeout=10)
            assert msg is not None
            if msg.attempts == 1 and msg.body.endswith(b"3"):  # m3, m13, m23: retried once
                msg.requeue(delay=0)
                requeued += 1
            else:
                msg.finish()
                finished += 1
        held = consumer.get(timeout=0.2)  # nothing left
        assert held is None
        labels = {"topic": "orders", "channel": "billing"}
        link = {**labels, "nsqd": nsqd.tcp_address}
        samples = scrape(url)
        assert requeued == 3
        assert value(samples, "nsq_consumer_messages_received_total", **labels) == 31 + 3
        assert value(samples, "nsq_consumer_messages_finished_total", **labels) == 31
        assert value(samples, "nsq_consumer_messages_requeued_total", **labels) == 3
        assert value(samples, "nsq_consumer_messages_given_up_total", **labels) == 0
        assert value(samples, "nsq_consumer_in_flight", **link) == 0
        assert value(samples, "nsq_consumer_rdy", **link) == 7
        assert value(samples, "nsq_consumer_max_in_flight", **labels) == 7
        assert value(samples, "nsq_consumer_backoff_level", **labels) == 0
        assert value(samples, "nsq_consumer_connections", **labels) == 1
        assert value(samples, "nsq_consumer_bytes_received_total", **link) > 0
    # nsqd agrees: everything finished, three requeues
    stats = metrics.NSQDCollector([nsqd.http_address])
    broker = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in stats.collect()
        for s in family.samples
    }
    channel = {"nsqd": nsqd.http_address, "topic": "orders", "channel": "billing"}
    assert value(broker, "nsq_channel_requeued_total", **channel) == 3
    assert value(broker, "nsq_channel_depth", **channel) == 0


def test_backoff_is_scraped(nsqd: EmbeddedNSQD, served: tuple[CollectorRegistry, str]) -> None:
    """A failure opens a backoff window: the consumer is counted as backing off while it
    lasts, and the windows opened are a counter (they stay counted once it resumes)."""
    from transports.sync import Consumer, Producer

    registry, url = served
    with Producer(nsqd.tcp_address) as producer:
        producer.publish("refunds", b"fails once")
    labels = {"topic": "refunds", "channel": "audit"}
    with Consumer(
        "refunds",
        "audit",
        nsqd=[nsqd.tcp_address],
        backoff_multiplier=0.5,  # a 1 s window
        default_requeue_delay=0.0,
    ) as consumer:
        metrics.instrument(consumer, registry=registry)
        samples = scrape(url)
        assert value(samples, "nsq_consumer_backing_off", **labels) == 0
        assert value(samples, "nsq_consumer_backoff_windows_total", **labels) == 0
        msg = consumer.get(timeout=10)
        assert msg is not None
        msg.requeue()  # with backoff
        assert consumer.stats().backoff_phase == "waiting"
        samples = scrape(url)
        assert value(samples, "nsq_consumer_backing_off", **labels) == 1
        assert value(samples, "nsq_consumer_backoff_level", **labels) == 1
        assert value(samples, "nsq_consumer_backoff_windows_total", **labels) == 1
        again = consumer.get(timeout=10)  # the test message, after the window
        assert again is not None and again.attempts == 2
        again.finish()
        deadline = time.monotonic() + 10
        while consumer.stats().backoff_phase != "normal":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        samples = scrape(url)
        assert value(samples, "nsq_consumer_backing_off", **labels) == 0
        assert value(samples, "nsq_consumer_backoff_level", **labels) == 0
        assert value(samples, "nsq_consumer_backoff_windows_total", **labels) == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
def test_anyio_consumer_scraped_while_running(
    nsqd: EmbeddedNSQD, served: tuple[CollectorRegistry, str], anyio_backend: str
) -> None:
    if anyio_backend == "trio":
        pytest.importorskip("trio")
    from transports.anyio import Consumer, Producer

    registry, url = served

    async def main() -> Samples:
        async with Producer([nsqd.tcp_address]) as producer:
            metrics.instrument(producer, registry=registry)
            await producer.multi_publish("clicks", [b"x"] * 20)
        async with Consumer(
            "clicks", "agg", nsqd=[nsqd.tcp_address], max_in_flight=50, max_attempts=2
        ) as consumer:
            metrics.instrument(consumer, registry=registry)
            seen = 0
            async for msg in consumer:
                seen += 1
                if seen <= 5:  # hold five: they are in flight at the scrape
                    continue
                await msg.finish()
                if seen == 20:
                    break
            # scraped from another thread while the event loop runs
            return await anyio.to_thread.run_sync(scrape, url)

    samples = anyio.run(main, backend=anyio_backend)
    labels = {"topic": "clicks", "channel": "agg"}
    assert value(samples, "nsq_consumer_messages_received_total", **labels) == 20
    assert value(samples, "nsq_consumer_messages_finished_total", **labels) == 15
    assert value(samples, "nsq_consumer_in_flight", nsqd=nsqd.tcp_address, **labels) == 5
    assert value(samples, "nsq_consumer_connections", **labels) == 1
    assert value(samples, "nsq_producer_publishes_total") == 1


def test_two_consumers_of_one_channel_are_summed(
    nsqd: EmbeddedNSQD, served: tuple[CollectorRegistry, str]
) -> None:
    from transports.sync import Consumer, Producer

    registry, url = served
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish("jobs", [b"j"] * 40)
    with (
        Consumer("jobs", "work", nsqd=[nsqd.tcp_address], max_in_flight=4) as a,
        Consumer("jobs", "work", nsqd=[nsqd.tcp_address], max_in_flight=4) as b,
    ):
        metrics.instrument(a, registry=registry)
        metrics.instrument(b, registry=registry)
        done = 0
        while done < 40:
            for consumer in (a, b):
                msg = consumer.get(timeout=0.05)
                if msg is not None:
                    msg.finish()
                    done += 1
        samples = scrape(url)
        labels = {"topic": "jobs", "channel": "work"}
        assert value(samples, "nsq_consumer_messages_finished_total", **labels) == 40
        assert value(samples, "nsq_consumer_max_in_flight", **labels) == 8
        assert value(samples, "nsq_consumer_connections", **labels) == 2
        metrics.uninstrument(b, registry=registry)
        finished_by_a = a.stats().finished
        samples = scrape(url)
        assert value(samples, "nsq_consumer_messages_finished_total", **labels) == finished_by_a


def test_paused_and_topic_not_found_are_scraped(
    nsqlookupd: EmbeddedLookupd, served: tuple[CollectorRegistry, str]
) -> None:
    """A consumer started with max_in_flight 0 is paused until set_max_in_flight() raises it;
    each lookupd answer that lists no nsqd for its topic is counted."""
    from transports.sync import Consumer

    registry, url = served
    labels = {"topic": "nowhere", "channel": "c"}
    with Consumer(
        "nowhere",
        "c",
        lookupd=[nsqlookupd.http_url],
        lookupd_poll_interval=0.05,
        max_in_flight=0,
    ) as consumer:
        metrics.instrument(consumer, registry=registry)
        deadline = time.monotonic() + 10
        while consumer.stats().topic_not_found < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        samples = scrape(url)
        assert value(samples, "nsq_consumer_paused", **labels) == 1
        assert value(samples, "nsq_consumer_topic_not_found_total", **labels) >= 3
        consumer.set_max_in_flight(5)
        samples = scrape(url)
        assert value(samples, "nsq_consumer_paused", **labels) == 0
        assert value(samples, "nsq_consumer_connections", **labels) == 0


def test_publish_observer_histogram_and_errors(served: tuple[CollectorRegistry, str]) -> None:
    """The producers' publish_observer signature: (topic, messages, seconds, error)."""
    registry, url = served
    observer = metrics.collector(registry).publishes
    observer("orders", 100, 0.0003, None)
    observer("orders", 1, 0.02, None)
    observer("orders", 50, 7.0, TimeoutError("no answer"))
    observer("audit", 10, 0.5, None)
    samples = scrape(url)
    hist = "nsq_producer_publish_duration_seconds"
    assert value(samples, f"{hist}_count", topic="orders") == 2
    assert value(samples, f"{hist}_sum", topic="orders") == pytest.approx(0.0203)
    assert value(samples, f"{hist}_bucket", topic="orders", le="0.0005") == 1
    assert value(samples, f"{hist}_bucket", topic="orders", le="0.025") == 2
    assert value(samples, f"{hist}_bucket", topic="audit", le="0.25") == 0
    assert value(samples, f"{hist}_bucket", topic="audit", le="0.5") == 1
    assert value(samples, "nsq_producer_topic_messages_total", topic="orders") == 101
    assert value(samples, "nsq_producer_topic_messages_total", topic="audit") == 10
    assert (
        value(samples, "nsq_producer_publish_errors_total", topic="orders", error="TimeoutError")
        == 1
    )


def test_instrument_refuses_what_is_not_a_client() -> None:
    registry = CollectorRegistry()
    with pytest.raises(TypeError, match="expected a Consumer or Producer"):
        metrics.instrument(object(), registry=registry)
    assert metrics.collector(registry) is metrics.collector(registry)  # registered once


def test_nsqd_collector_marks_an_unreachable_nsqd_down() -> None:
    collector = metrics.NSQDCollector(["127.0.0.1:1"], timeout=1)
    families = {f.name: f for f in collector.collect()}
    [sample] = families["nsq_nsqd_up"].samples
    assert sample.labels == {"nsqd": "127.0.0.1:1"} and sample.value == 0
    assert families["nsq_channel_depth"].samples == []


def test_nsqd_collector_marks_what_is_not_nsqd_down(nsqlookupd: EmbeddedLookupd) -> None:
    """nsqlookupd has no ``/stats`` (404): down, like an nsqd that does not answer."""
    collector = metrics.NSQDCollector([nsqlookupd.http_address], timeout=5)
    assert _broker_samples(collector) == {
        ("nsq_nsqd_up", frozenset({("nsqd", nsqlookupd.http_address)})): 0
    }


class EndlessHTTPServer:
    """Answers every request with 200 and a chunked body that never ends (1 MiB chunks, or
    one byte every ``pause`` seconds), counting what it sent."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = 0
        self.stopping = threading.Event()

    def __enter__(self) -> EndlessHTTPServer:
        threading.Thread(target=self._serve, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        size = 1 if self.pause else 1024 * 1024
        piece = b"%x\r\n" % size + b" " * size + b"\r\n"
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while not self.stopping.is_set():
                conn.sendall(piece)
                self.sent += size
                if self.pause:
                    time.sleep(self.pause)


def test_nsqd_collector_stops_reading_an_endless_answer_at_its_cap() -> None:
    """The read is capped (``max_response_size``): an endless /stats marks nsqd down instead
    of taking the scraping process's memory."""
    with EndlessHTTPServer() as endless:
        collector = metrics.NSQDCollector(
            [endless.address], timeout=10, max_response_size=4 * 1024 * 1024
        )
        started = time.monotonic()
        samples = _broker_samples(collector)
        elapsed = time.monotonic() - started
        sent = endless.sent
    assert samples == {("nsq_nsqd_up", frozenset({("nsqd", endless.address)})): 0}
    assert elapsed < 10  # refused at the cap, not at the timeout
    assert sent < 64 * 1024 * 1024  # it stopped reading (the body has no end)


def test_nsqd_collector_gives_up_on_a_trickle_at_its_timeout() -> None:
    """A byte every 50 ms keeps each socket read short: the timeout bounds the whole read."""
    with EndlessHTTPServer(pause=0.05) as trickle:
        collector = metrics.NSQDCollector([trickle.address], timeout=1)
        started = time.monotonic()
        samples = _broker_samples(collector)
        elapsed = time.monotonic() - started
    assert samples == {("nsq_nsqd_up", frozenset({("nsqd", trickle.address)})): 0}
    assert 1 <= elapsed < 5


def test_nsqd_collector_exports_each_channels_lag(nsqd: EmbeddedNSQD) -> None:
    """``nsq_channel_lag`` = waiting in the (paused) topic + queued + in flight + deferred;
    a channel with nothing left has lag 0."""
    from transports.sync import Consumer, Producer
    from transports.sync.admin import NSQDAdmin

    with NSQDAdmin(nsqd.http_url) as admin, Producer(nsqd.tcp_address) as producer:
        admin.create_topic("lagged")
        admin.create_channel("lagged", "slow")
        admin.create_channel("lagged", "idle")
        producer.multi_publish("lagged", [b"m"] * 10)
        admin.empty_channel("lagged", "idle")  # idle has nothing to do
        with Consumer("lagged", "slow", nsqd=[nsqd.tcp_address], max_in_flight=2) as consumer:
            held = [consumer.get(timeout=10) for _ in range(2)]
            assert None not in held
            held[0].requeue(delay=60, backoff=False)  # deferred; another comes in its place
            admin.pause_topic("lagged")
            producer.multi_publish("lagged", [b"late"] * 4)  # held in the topic
            deadline = time.monotonic() + 10
            while True:
                slow = admin.channel_stats("lagged", "slow")
                parts = (slow.topic_depth, slow.depth, slow.in_flight_count, slow.deferred_count)
                if parts == (4, 7, 2, 1):
                    break
                assert time.monotonic() < deadline, parts
                time.sleep(0.01)
            samples = _broker_samples(metrics.NSQDCollector([nsqd.http_address]))
    channel = {"nsqd": nsqd.http_address, "topic": "lagged"}
    assert value(samples, "nsq_channel_lag", **channel, channel="slow") == 4 + 7 + 2 + 1
    assert value(samples, "nsq_channel_lag", **channel, channel="idle") == 4  # the topic's
    assert value(samples, "nsq_topic_depth", **channel) == 4
    assert value(samples, "nsq_topic_paused", **channel) == 1
    # the embedded nsqd does not measure end-to-end latency: no such series
    assert not [name for name, _ in samples if "e2e" in name]


def test_nsqd_collector_exports_end_to_end_latency_when_nsqd_measures_it() -> None:
    """The real nsqd with ``--e2e-processing-latency-percentile``: a gauge per quantile, in
    seconds, per channel and per topic (skips without the real binaries)."""
    from transports.sync import Consumer, Producer
    from transports.sync.admin import NSQDAdmin
    from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flag = "--e2e-processing-latency-percentile=0.99,0.5"
    with (
        RealNSQD([flag]) as real,
        NSQDAdmin(real.http_address) as admin,
        Producer(real.tcp_address) as producer,
    ):
        admin.create_topic("timed")
        admin.create_channel("timed", "work")
        collector = metrics.NSQDCollector([real.http_address])
        assert not [name for name, _ in _broker_samples(collector) if "e2e" in name]
        producer.multi_publish("timed", [b"a", b"b", b"c"])
        with Consumer("timed", "work", nsqd=[real.tcp_address]) as consumer:
            for _ in range(3):
                msg = consumer.get(timeout=10)
                assert msg is not None
                msg.finish()
            deadline = time.monotonic() + 10
            while True:  # the FINs go out on the consumer's IO thread
                latency = admin.channel_stats("timed", "work").e2e_latency
                if latency is not None and latency.count == 3:
                    break
                assert time.monotonic() < deadline, latency
                time.sleep(0.01)
        samples = _broker_samples(collector)
    channel = {"nsqd": real.http_address, "topic": "timed", "channel": "work"}
    for quantile in ("0.99", "0.5"):
        seconds = value(samples, "nsq_channel_e2e_latency_seconds", **channel, quantile=quantile)
        assert 0 < seconds < 60  # seconds, not nanoseconds
        topic = {"nsqd": real.http_address, "topic": "timed", "quantile": quantile}
        assert value(samples, "nsq_topic_e2e_latency_seconds", **topic) > 0


@pytest.mark.parametrize("runtime", ["sync", "asyncio"])
def test_instrumented_producer_measures_publish_latency(
    nsqd: EmbeddedNSQD, served: tuple[CollectorRegistry, str], runtime: str
) -> None:
    """Through the producers' ``publish_observer`` hook (skipped while they lack it)."""
    from transports import anyio as aio
    from transports import sync

    producer_class: Any = sync.Producer if runtime == "sync" else aio.Producer
    if "publish_observer" not in producer_class.__init__.__code__.co_varnames:
        pytest.skip("this Producer has no publish_observer hook yet")
    registry, url = served

    def publish_sync() -> None:
        with sync.Producer(nsqd.tcp_address) as producer:
            metrics.instrument(producer, registry=registry)
            producer.multi_publish("orders", [b"a"] * 10)
            producer.publish("orders", b"b")
            producer.deferred_publish("audit", b"c", 0.5)

    async def publish_async() -> None:
        async with aio.Producer([nsqd.tcp_address]) as producer:
            metrics.instrument(producer, registry=registry)
            await producer.multi_publish("orders", [b"a"] * 10)
            await producer.publish("orders", b"b")
            await producer.deferred_publish("audit", b"c", 0.5)

    if runtime == "sync":
        publish_sync()
    else:
        anyio.run(publish_async)
    samples = scrape(url)
    hist = "nsq_producer_publish_duration_seconds"
    assert value(samples, f"{hist}_count", topic="orders") == 2
    assert value(samples, f"{hist}_count", topic="audit") == 1
    assert 0 < value(samples, f"{hist}_sum", topic="orders") < 5
    assert value(samples, f"{hist}_bucket", topic="orders", le="+Inf") == 2
    assert value(samples, "nsq_producer_topic_messages_total", topic="orders") == 11
    assert value(samples, "nsq_producer_topic_messages_total", topic="audit") == 1


def test_nsqd_collector_reads_the_real_nsqd() -> None:
    """The real nsqd is the referee: the same series from its /stats (skips without it)."""
    from transports.sync import Consumer, Producer
    from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    with RealNSQD() as real:
        with Producer(real.tcp_address) as producer:
            producer.multi_publish("orders", [b"a", b"b", b"c"])
        with Consumer("orders", "billing", nsqd=[real.tcp_address], max_in_flight=1) as consumer:
            msg = consumer.get(timeout=10)
            assert msg is not None
            msg.requeue(delay=60)  # deferred at the scrape
            topic = {"nsqd": real.http_address, "topic": "orders"}
            channel = {**topic, "channel": "billing"}
            collector = metrics.NSQDCollector([real.http_address])
            # The REQ goes out on the consumer's IO thread, and nsqd counts it before it
            # defers the message; the topic's pump moves the other two into the channel, and
            # a message on its way to the consumer is briefly neither queued nor in flight:
            # scrape until nsqd has applied all of it (a state that never comes fails here)
            deadline = time.monotonic() + 10
            while True:
                samples = _broker_samples(collector)
                held = value(samples, "nsq_channel_depth", **channel) + value(
                    samples, "nsq_channel_in_flight", **channel
                )
                if value(samples, "nsq_channel_deferred", **channel) == 1 and held == 2:
                    break
                assert time.monotonic() < deadline, "nsqd never applied the REQ"
                time.sleep(0.01)
    assert value(samples, "nsq_nsqd_up", nsqd=real.http_address) == 1
    assert value(samples, "nsq_topic_messages_total", **topic) == 3
    assert value(samples, "nsq_channel_requeued_total", **channel) == 1
    assert value(samples, "nsq_channel_deferred", **channel) == 1
    assert value(samples, "nsq_channel_clients", **channel) == 1
    assert (
        value(samples, "nsq_channel_depth", **channel)
        + value(samples, "nsq_channel_in_flight", **channel)
        == 2
    )

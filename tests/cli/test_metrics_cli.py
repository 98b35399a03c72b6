"""``--metrics-address``: ``nsq-sansio nsqd`` exports the embedded broker's topics and
channels, ``tail`` its consumer; scraped over HTTP and parsed."""

from __future__ import annotations

import re
import signal
import time
import urllib.request

import pytest

from transports.embedded import EmbeddedNSQD
from transports.sync import Consumer, Producer

from .conftest import cli_popen, http_post

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.timeout(60)


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_nsqd_command_serves_its_topics_and_channels() -> None:
    proc = cli_popen(
        "nsqd",
        "--tcp-address",
        "127.0.0.1:0",
        "--http-address",
        "127.0.0.1:0",
        "--metrics-address",
        "127.0.0.1:0",
    )
    try:
        assert proc.stderr is not None
        listen = re.search(r"TCP (\S+) HTTP (\S+)", proc.stderr.readline().decode())
        metrics = re.search(r"metrics (http://\S+)", proc.stderr.readline().decode())
        assert listen and metrics
        tcp, http = listen.groups()
        url = metrics.group(1)
        http_post(http, "/topic/create?topic=orders")
        http_post(http, "/channel/create?topic=orders&channel=billing")
        with Producer(tcp) as producer:
            producer.multi_publish("orders", [b"a", b"b", b"c", b"d"])
        with Consumer("orders", "billing", nsqd=[tcp], max_in_flight=1) as consumer:
            msg = consumer.get(timeout=10)
            assert msg is not None
            msg.finish()
            held = consumer.get(timeout=10)
            assert held is not None  # in flight at the scrape
            samples = scrape(url)
            held.finish()
        topic = frozenset({("nsqd", http), ("topic", "orders")})
        channel = frozenset({*topic, ("channel", "billing")})
        assert samples[("nsq_nsqd_up", frozenset({("nsqd", http)}))] == 1
        assert samples[("nsq_topic_messages_total", topic)] == 4
        assert samples[("nsq_channel_messages_total", channel)] == 4
        assert samples[("nsq_channel_in_flight", channel)] == 1
        assert samples[("nsq_channel_depth", channel)] == 2
        assert samples[("nsq_channel_clients", channel)] == 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_tail_exports_its_consumer(nsqd: EmbeddedNSQD) -> None:
    http_post(nsqd.http_address, "/topic/create?topic=feed")
    http_post(nsqd.http_address, "/channel/create?topic=feed&channel=watch")
    proc = cli_popen(
        "tail",
        "--topic",
        "feed",
        "--channel",
        "watch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--metrics-address",
        "127.0.0.1:0",
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        metrics = re.search(r"metrics: (http://\S+)", proc.stderr.readline().decode())
        assert metrics
        with Producer(nsqd.tcp_address) as producer:
            producer.multi_publish("feed", [b"1", b"2", b"3"])
        assert [proc.stdout.readline() for _ in range(3)] == [b"1\n", b"2\n", b"3\n"]
        labels = frozenset({("topic", "feed"), ("channel", "watch")})
        link = frozenset({*labels, ("nsqd", nsqd.tcp_address)})
        # tail prints a message, then finishes it: the last FIN can follow the last line
        finished = ("nsq_consumer_messages_finished_total", labels)
        deadline = time.monotonic() + 10
        samples = scrape(metrics.group(1))
        while samples[finished] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
            samples = scrape(metrics.group(1))
        assert samples[("nsq_consumer_messages_received_total", labels)] == 3
        assert samples[finished] == 3
        assert samples[("nsq_consumer_connections", labels)] == 1
        assert samples[("nsq_consumer_rdy", link)] == 200
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=15)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

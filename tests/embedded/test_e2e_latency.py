"""nsqd's end-to-end processing latency percentiles (``--e2e-processing-latency-percentile``,
``--e2e-processing-latency-window-time``): the same probe against the embedded nsqd and the
real one (when its binaries are there), compared field by field where the values are
deterministic, bounded by what the test measured where they are not; and read through the
admin client."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from conformance.wire import RawConn, http_json, http_request, unique

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync.admin import NSQDAdmin
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

KINDS = ["embedded", "real"]
HELD = 0.3  # seconds each message waits between its publish and its FIN, at least


@contextmanager
def broker(kind: str, **e2e: object) -> Iterator[str]:
    """An nsqd's HTTP address, with ``e2e`` (the EmbeddedNSQD keywords) as flags too."""
    if kind == "embedded":
        with ServerThread(EmbeddedNSQD(**e2e)) as nsqd:  # type: ignore[arg-type]
            yield nsqd.http_address
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    flags = []
    if "e2e_processing_latency_percentiles" in e2e:
        values = e2e["e2e_processing_latency_percentiles"]
        assert isinstance(values, tuple)
        flags.append("--e2e-processing-latency-percentile=" + ",".join(map(str, values)))
    if "e2e_processing_latency_window_time" in e2e:
        window = e2e["e2e_processing_latency_window_time"]
        flags.append(f"--e2e-processing-latency-window-time={window}s")
    with RealNSQD(flags) as real:
        yield real.http_address


def consume(tcp: str, topic: str, channel: str, count: int) -> None:
    with RawConn(tcp) as consumer:
        consumer.sub(topic, channel)
        consumer.command(f"RDY {count}")
        for _ in range(count):
            consumer.fin(consumer.read_message())
        # a FIN nsqd cannot match is answered (E_FIN_FAILED, not fatal): the FINs before it
        # are done by then
        consumer.command("FIN " + "0" * 16)
        consumer.expect_error("E_FIN_FAILED")


def tcp_of(kind: str, http: str) -> str:
    info = http_json(http, "GET", "/info")
    return f"127.0.0.1:{info['tcp_port']}"


@pytest.mark.parametrize("kind", KINDS)
def test_percentiles_per_channel_and_topic_as_nsqd_reports_them(kind: str) -> None:
    percentiles = (0.5, 1.0, 0.99)  # nsqd keeps them highest first
    with broker(
        kind,
        e2e_processing_latency_percentiles=percentiles,
        e2e_processing_latency_window_time=10,
    ) as http:
        tcp = tcp_of(kind, http)
        assert http_json(http, "GET", "/config/e2e_processing_latency_percentiles") == [
            1,
            0.99,
            0.5,
        ]
        window = http_json(http, "GET", "/config/e2e_processing_latency_window_time")
        assert window == 10_000_000_000

        lonely, topic = unique("lonely"), unique("e2e")
        assert http_request(http, "POST", f"/topic/create?topic={lonely}")[0] == 200
        assert http_request(http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 404
        assert http_request(http, "POST", f"/topic/create?topic={topic}")[0] == 200
        assert http_request(http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        raw = http_request(http, "GET", f"/stats?format=json&topic={topic}")[1]
        empty = '"e2e_processing_latency":{"count":0,"percentiles":[{"quantile":1,"value":0},'
        assert raw.decode().count(empty) == 2  # the channel's and the topic's, as Go writes
        (lonely_stats,) = http_json(http, "GET", f"/stats?format=json&topic={lonely}")["topics"]
        assert lonely_stats["e2e_processing_latency"] == {"count": 0, "percentiles": None}

        started = time.monotonic()
        for i in range(5):
            assert http_request(http, "POST", f"/pub?topic={topic}", b"%d" % i)[0] == 200
        time.sleep(HELD)
        consume(tcp, topic, "c", 5)
        longest = time.monotonic() - started

        (stats,) = http_json(http, "GET", f"/stats?format=json&topic={topic}")["topics"]
        (chan,) = stats["channels"]
        for latency in (chan["e2e_processing_latency"], stats["e2e_processing_latency"]):
            assert latency["count"] == 5
            assert [p["quantile"] for p in latency["percentiles"]] == [1, 0.99, 0.5]
            values = [p["value"] for p in latency["percentiles"]]
            assert all(isinstance(v, int) for v in values), values  # whole ns, as Go writes
            assert all(HELD * 1e9 <= v <= longest * 1e9 for v in values), (values, longest)
            assert values == sorted(values, reverse=True)

        text = http_request(http, "GET", f"/stats?topic={topic}")[1].decode()
        shown = re.findall(r"e2e%: (\d+\.\d(?:ms|s)), (\d+\.\d(?:ms|s)), (\d+\.\d(?:ms|s))", text)
        assert len(shown) == 2, text  # the topic's line and the channel's

        admin = NSQDAdmin(f"http://{http}")
        latency = admin.channel_stats(topic, "c").e2e_latency
        assert latency is not None and latency.count == 5
        assert [p.quantile for p in latency.percentiles] == [1, 0.99, 0.5]
        p99 = latency.percentile(0.99)
        assert p99 is not None and HELD <= p99 <= longest
        topic_latency = admin.topic_stats(topic).e2e_latency
        assert topic_latency is not None and topic_latency.count == 5


@pytest.mark.parametrize("kind", KINDS)
def test_without_percentiles_nothing_is_tracked(kind: str) -> None:
    with broker(kind) as http:
        topic = unique("off")
        assert http_request(http, "POST", f"/pub?topic={topic}", b"x")[0] == 200
        assert http_request(http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        consume(tcp_of(kind, http), topic, "c", 1)
        (stats,) = http_json(http, "GET", f"/stats?format=json&topic={topic}")["topics"]
        off = {"count": 0, "percentiles": None}
        assert stats["e2e_processing_latency"] == off
        assert stats["channels"][0]["e2e_processing_latency"] == off
        assert http_json(http, "GET", "/config/e2e_processing_latency_percentiles") in ([], None)
        text = http_request(http, "GET", f"/stats?topic={topic}")[1].decode()
        assert "e2e%: \n" in text
        assert NSQDAdmin(f"http://{http}").channel_stats(topic, "c").e2e_latency is None


@pytest.mark.parametrize("kind", KINDS)
def test_the_window_forgets_old_latencies(kind: str) -> None:
    """Latencies older than the window are dropped (nsqd keeps two half-windows)."""
    with broker(
        kind, e2e_processing_latency_percentiles=(1.0,), e2e_processing_latency_window_time=1
    ) as http:
        topic = unique("window")
        assert http_request(http, "POST", f"/topic/create?topic={topic}")[0] == 200
        assert http_request(http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        assert http_request(http, "POST", f"/pub?topic={topic}", b"x")[0] == 200
        consume(tcp_of(kind, http), topic, "c", 1)

        def count() -> int:
            (stats,) = http_json(http, "GET", f"/stats?format=json&topic={topic}")["topics"]
            return int(stats["channels"][0]["e2e_processing_latency"]["count"])

        assert count() == 1
        time.sleep(1.2)  # more than a whole window: both halves have moved on
        assert count() == 0


def test_bad_percentiles_are_refused_at_construction() -> None:
    from nsq_sansio.errors import ConfigError

    for bad in ((0.0,), (1.5,), (-0.1,)):
        with pytest.raises(ConfigError, match="invalid E2E processing latency percentile"):
            EmbeddedNSQD(e2e_processing_latency_percentiles=bad)
    with pytest.raises(ConfigError, match="e2e_processing_latency_window_time"):
        EmbeddedNSQD(e2e_processing_latency_window_time=0)


def test_the_cli_takes_nsqds_e2e_flags() -> None:
    from transports.cli.servers import build_nsqd_parser, nsqd_options_from_args

    args = build_nsqd_parser().parse_args(
        [
            "--e2e-processing-latency-percentile=0.5,1.0",
            "--e2e-processing-latency-percentile",
            "0.99",
            "--e2e-processing-latency-window-time=30s",
        ]
    )
    options = nsqd_options_from_args(args)
    assert options["e2e_processing_latency_percentiles"] == (0.5, 1.0, 0.99)
    assert options["e2e_processing_latency_window_time"] == 30.0
    with pytest.raises(SystemExit):
        build_nsqd_parser().parse_args(["--e2e-processing-latency-percentile=1.5"])
    assert json.dumps(options["e2e_processing_latency_percentiles"])  # plain numbers

"""A topic's backlog moves into its channels in the background, as nsqd's topic messagePump
does: SUB (which creates the first channel) and ``/topic/unpause`` are answered at once, and
while the backlog moves nsqd keeps answering ``/ping`` and serving every other client.

The embedded broker used to move the whole backlog inside the command: with 1M messages
waiting, SUB was answered after 2 s and nothing else was served meanwhile.

Measuring latency needs care when the broker is the embedded one: it runs on a thread of this
process, and with CPython's default 5 ms GIL switch interval every blocking call of the test's
own client threads waits behind the broker's busy thread (the convoy effect), which measures
the GIL rather than the broker. The test lowers the switch interval while it measures.
"""

from __future__ import annotations

import http.client
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from .conftest import Target
from .wire import RawConn, http_json, http_request, split_address, unique, wait_for

BACKLOG = 300_000  # 1-byte messages: a few MPUBs to publish, a second or so to move
MPUB_BATCH = 100_000
MAX_LATENCY = 0.5  # seconds; nsqd answers in milliseconds, the old embedded broker froze
#: Typical latency while the backlog moves (median), and the longest single stall tolerated: a
#: loaded CI machine can delay one sample, a frozen broker delays all of them.
TYPICAL_LATENCY = 0.1
WORST_STALL = 2.0


def _topic_stats(target: Target, topic: str) -> dict[str, Any]:
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}&include_mem=false")
    (found,) = stats["topics"]
    result: dict[str, Any] = found
    return result


class _Pinger(threading.Thread):
    """GET /ping over and over on fresh connections, recording (sent at, latency)."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.address = split_address(address)
        self.samples: list[tuple[float, float]] = []
        self.failures: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            sent = time.monotonic()
            try:
                conn = http.client.HTTPConnection(*self.address, timeout=30)
                conn.request("GET", "/ping")
                body = conn.getresponse().read()
                conn.close()
            except OSError as err:
                self.failures.append(repr(err))
                return
            if body != b"OK":
                self.failures.append(repr(body))
            self.samples.append((sent, time.monotonic() - sent))
            self.done.wait(0.005)


@contextmanager
def _measuring(target: Target) -> Iterator[None]:
    previous = sys.getswitchinterval()
    if target.embedded:
        sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _publish_backlog(target: Target, topic: str) -> None:
    with RawConn(target.tcp) as producer:
        for _ in range(BACKLOG // MPUB_BATCH):
            producer.mpub(topic, [b"x"] * MPUB_BATCH)
            producer.expect_ok()


@pytest.mark.parametrize("release", ["first SUB", "topic unpause"])
def test_a_big_backlog_moves_while_everything_else_is_served(target: Target, release: str) -> None:
    topic, channel = unique("backlog"), "c"
    if release == "topic unpause":
        assert http_request(target.http, "POST", f"/topic/create?topic={topic}")[0] == 200
        http_request(target.http, "POST", f"/channel/create?topic={topic}&channel={channel}")
        assert http_request(target.http, "POST", f"/topic/pause?topic={topic}")[0] == 200
    _publish_backlog(target, topic)
    assert _topic_stats(target, topic)["depth"] == BACKLOG

    side_topic = unique("side")
    bystander = RawConn(target.tcp)
    consumer = RawConn(target.tcp)
    pinger = _Pinger(target.http)
    try:
        bystander.identify(heartbeat_interval=1000)
        bystander.sub(side_topic, "c")
        bystander.command("RDY 100")
        consumer.identify()
        if release == "topic unpause":
            consumer.sub(topic, channel)
        with _measuring(target), RawConn(target.tcp) as side_producer:
            pinger.start()
            started = time.monotonic()
            if release == "first SUB":
                consumer.sub(topic, channel)
            else:
                status, _, _ = http_request(target.http, "POST", f"/topic/unpause?topic={topic}")
                assert status == 200
            answered = time.monotonic() - started
            # answered while most of the backlog still waits in the topic: it moves afterwards
            left = _topic_stats(target, topic)["depth"]
            assert left > 0, f"the whole backlog moved before {release} was answered"
            assert answered < MAX_LATENCY, answered
            consumer.command("RDY 10")
            assert consumer.read_message().body == b"x"
            # until the move is done, other clients are served: a publish to another topic
            # reaches its subscriber promptly, again and again
            side_latencies = []
            deadline = started + 60
            while _topic_stats(target, topic)["depth"] > 0:
                assert time.monotonic() < deadline, "the backlog never finished moving"
                sent = time.monotonic()
                side_producer.pub(side_topic, b"side")
                side_producer.expect_ok()
                side = bystander.read_message(within=WORST_STALL * 2)
                assert side.body == b"side"
                side_latencies.append(time.monotonic() - sent)
                # answered, so its RDY never runs out: a message it held would leave the
                # next one waiting for nsqd's 60 s msg_timeout after RDY round trips
                bystander.fin(side)
            moved = time.monotonic()
            pinger.done.set()
            pinger.join(30)
        assert not pinger.failures, pinger.failures
        during = [latency for sent, latency in pinger.samples if started <= sent <= moved]
        assert len(during) >= 3, (len(during), moved - started)
        assert statistics.median(during) < TYPICAL_LATENCY, sorted(during)[-5:]
        assert max(during) < WORST_STALL, sorted(during)[-5:]
        assert side_latencies, "no publish to another topic was timed while the backlog moved"
        # a delivery waits for nsqd's output buffer timeout (250 ms by default), a /ping does not
        assert statistics.median(side_latencies) < MAX_LATENCY, sorted(side_latencies)[-5:]
        assert max(side_latencies) < WORST_STALL, sorted(side_latencies)[-5:]

        def every_message_counted() -> dict[str, Any] | None:
            # The topic's depth reached 0 when nsqd's topic pump took the last message, before
            # it put it in the channel, and a message on its way to the consumer is briefly in
            # neither depth nor in flight: read until each is counted (one lost is never
            # counted, one doubled never goes away: both fail here)
            (found,) = _topic_stats(target, topic)["channels"]
            counted = found["depth"] + found["in_flight_count"] == BACKLOG
            return found if counted and found["message_count"] == BACKLOG else None

        # nothing lost or doubled on the way
        found = wait_for(every_message_counted)
        assert found["message_count"] == BACKLOG
        assert found["depth"] + found["in_flight_count"] == BACKLOG
    finally:
        pinger.done.set()
        consumer.close()
        bystander.close()
        http_request(target.http, "POST", f"/topic/delete?topic={topic}")

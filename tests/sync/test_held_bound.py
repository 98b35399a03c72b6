"""Issue 12.2 on the blocking transport: max_in_flight bounds what the user holds when an nsqd
joins, against two embedded nsqd and against two real ones (skipped without the binaries).

The user holds all 10 messages of nsqd A; nsqd B comes up with messages. Before the fix B got
RDY (its share, 5) while A's 10 were still in flight: 15 held. Now B gets budget only as A's
messages are answered, and everything is still consumed.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest

from transports.embedded import EmbeddedNSQD, ServerThread
from transports.real_nsq import RealNSQD, find_binaries, free_port
from transports.sync import Consumer

from ._helpers import unique, wait_for


class Broker:
    """One nsqd on a fixed loopback port, started when the test says (embedded or real)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.real: RealNSQD | None = None
        self.thread: ServerThread[EmbeddedNSQD] | None = None
        if kind == "real":
            self.real = RealNSQD()
            self.tcp_address = self.real.tcp_address
        else:
            self.tcp_address = f"127.0.0.1:{free_port()}"
        self.http_url = ""

    def start(self) -> None:
        if self.real is not None:
            self.real.start()
            self.http_url = self.real.http_url
        else:
            self.thread = ServerThread(EmbeddedNSQD(tcp_address=self.tcp_address))
            self.http_url = self.thread.start().http_url

    def close(self) -> None:
        if self.real is not None:
            self.real.close()
        if self.thread is not None:
            self.thread.stop()

    def publish(self, topic: str, count: int, tag: str) -> None:
        body = b"\n".join(b"%s-%d" % (tag.encode(), i) for i in range(count))
        request = urllib.request.Request(f"{self.http_url}/mpub?topic={topic}", data=body)
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.read() == b"OK"

    def in_flight(self, topic: str, channel: str) -> int:
        url = f"{self.http_url}/stats?format=json&topic={topic}&channel={channel}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            stats: Any = json.loads(answer.read())
        for t in stats.get("topics") or ():
            for c in t.get("channels") or ():
                if t["topic_name"] == topic and c["channel_name"] == channel:
                    return int(c["in_flight_count"])
        return 0


KINDS = [
    "embedded",
    pytest.param(
        "real",
        marks=pytest.mark.skipif(find_binaries() is None, reason="real NSQ binaries not found"),
    ),
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_joining_nsqd_never_takes_the_held_messages_over_max_in_flight(kind: str) -> None:
    topic, channel = unique("held"), "ch"
    a, b = Broker(kind), Broker(kind)
    try:
        a.start()
        a.publish(topic, 30, "a")
        with Consumer(
            topic,
            channel,
            nsqd=[a.tcp_address, b.tcp_address],  # B is down: retried every 0.1-0.2 s
            max_in_flight=10,
            reconnect_delay=0.1,
            max_reconnect_delay=0.2,
            msg_timeout=300.0,  # nothing times out on a loaded machine
        ) as consumer:
            held = []
            for _ in range(10):
                message = consumer.get(timeout=10)
                assert message is not None
                held.append(message)
            b.start()
            b.publish(topic, 30, "b")
            wait_for(lambda: consumer.stats().connected == 2, what="B subscribed")
            # The user holds 10 and answers nothing: B gets no message, on nsqd's own count
            # and on the library's.
            until = time.monotonic() + 1.0
            while time.monotonic() < until:
                stats = consumer.stats()
                assert stats.in_flight <= 10, stats
                assert a.in_flight(topic, channel) + b.in_flight(topic, channel) <= 10
                time.sleep(0.05)
            assert b.in_flight(topic, channel) == 0
            assert all(m.body.startswith(b"a-") for m in held)
            # Answering returns the budget: B's messages come, never more than 10 held.
            for message in held:
                assert message.finish()
                assert consumer.stats().in_flight <= 10
            seen = {m.body for m in held}
            while len(seen) < 60:
                message = consumer.get(timeout=10)
                assert message is not None, f"only {len(seen)} of 60 consumed"
                assert consumer.stats().in_flight <= 10
                seen.add(message.body)
                assert message.finish()
            assert sum(body.startswith(b"b-") for body in seen) == 30
    finally:
        a.close()
        b.close()

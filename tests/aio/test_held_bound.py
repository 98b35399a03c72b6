"""Issue 12.2 on the anyio transport (asyncio and trio): max_in_flight bounds what the user
holds when an nsqd joins, against two embedded nsqd and against two real ones (skipped
without the binaries).

The user holds all 10 messages of nsqd A; nsqd B comes up with messages. Before the fix B got
RDY (its share, 5) while A's 10 were still in flight: 15 held. Now B gets budget only as A's
messages are answered, and everything is still consumed.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import anyio
import pytest

from transports.anyio import Consumer, Message
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.real_nsq import RealNSQD, find_binaries, free_port

pytestmark = pytest.mark.anyio


class Broker:
    """One nsqd on a fixed loopback port, started when the test says (embedded or real).
    Its methods block: call them through ``anyio.to_thread.run_sync``."""

    def __init__(self, kind: str) -> None:
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
async def test_a_joining_nsqd_never_takes_the_held_messages_over_max_in_flight(
    kind: str,
) -> None:
    topic, channel = f"held{uuid.uuid4().hex[:10]}", "ch"
    a, b = Broker(kind), Broker(kind)
    run = anyio.to_thread.run_sync
    try:
        await run(a.start)
        await run(a.publish, topic, 30, "a")
        async with Consumer(
            topic,
            channel,
            nsqd=[a.tcp_address, b.tcp_address],  # B is down: retried every 0.1-0.2 s
            max_in_flight=10,
            reconnect_delay=0.1,
            max_reconnect_delay=0.2,
            msg_timeout=300.0,  # nothing times out on a loaded machine
        ) as consumer:
            with anyio.fail_after(60):
                held: list[Message] = [await consumer.__anext__() for _ in range(10)]
                await run(b.start)
                await run(b.publish, topic, 30, "b")
                while consumer.stats().connected < 2:
                    await anyio.sleep(0.02)
                # The user holds 10 and answers nothing: B gets no message, on nsqd's own
                # count and on the library's.
                for _ in range(20):
                    assert consumer.stats().in_flight <= 10, consumer.stats()
                    in_a = await run(a.in_flight, topic, channel)
                    in_b = await run(b.in_flight, topic, channel)
                    assert in_a + in_b <= 10, (in_a, in_b)
                    await anyio.sleep(0.05)
                assert await run(b.in_flight, topic, channel) == 0
                assert all(m.body.startswith(b"a-") for m in held)
                # Answering returns the budget: B's messages come, never more than 10 held.
                for message in held:
                    assert await message.finish()
                    assert consumer.stats().in_flight <= 10
                seen = {m.body for m in held}
                while len(seen) < 60:
                    message = await consumer.__anext__()
                    assert consumer.stats().in_flight <= 10
                    seen.add(message.body)
                    assert await message.finish()
                assert sum(body.startswith(b"b-") for body in seen) == 30
    finally:
        await run(a.close)
        await run(b.close)

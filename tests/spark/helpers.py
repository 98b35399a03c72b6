"""Helpers for the Spark tests: publish, read back and count over real sockets."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterable, Sequence
from typing import Any

from transports.sync import Consumer, Producer


def stats(server: Any, topic: str) -> dict[str, Any]:
    """The topic's entry of nsqd's ``/stats?format=json`` (empty when it does not exist)."""
    url = f"http://{server.http_address}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as response:
        document = json.load(response)
    for entry in document.get("topics") or []:  # null when nsqd has no such topic
        if entry["topic_name"] == topic:
            return dict(entry)
    return {}


def channel_stats(server: Any, topic: str, channel: str) -> dict[str, Any]:
    for entry in stats(server, topic).get("channels", []):
        if entry["channel_name"] == channel:
            return dict(entry)
    return {}


def message_count(servers: Sequence[Any], topic: str) -> int:
    return sum(int(stats(s, topic).get("message_count", 0)) for s in servers)


def publish(servers: Sequence[Any], topic: str, bodies: Sequence[bytes]) -> None:
    """Publish ``bodies`` spread over ``servers`` (MPUB of 500)."""
    for index, server in enumerate(servers):
        mine = list(bodies[index :: len(servers)])
        with Producer(server.tcp_address) as producer:
            for start in range(0, len(mine), 500):
                producer.multi_publish(topic, mine[start : start + 500])


def _left(servers: Sequence[Any], topic: str, channel: str) -> int:
    """Messages nsqd still holds for ``channel``: queued in the topic (a backlog moves into a
    new channel in the background), queued in the channel, or in flight."""
    left = 0
    for server in servers:
        topic_entry = stats(server, topic)
        left += int(topic_entry.get("depth", 0))
        for entry in topic_entry.get("channels") or []:
            if entry["channel_name"] == channel:
                left += int(entry["depth"]) + int(entry["in_flight_count"])
                left += int(entry["deferred_count"])
    return left


def drain(servers: Sequence[Any], topic: str, channel: str, idle: float = 1.0) -> list[bytes]:
    """Read and FIN everything queued on ``channel``: until nothing came for ``idle`` s and
    no nsqd holds anything more for it (a pause alone, under load, does not end it)."""
    bodies: list[bytes] = []
    addresses = [s.tcp_address for s in servers]
    with Consumer(topic, channel, nsqd=addresses, max_in_flight=2000) as consumer:
        # every nsqd has the channel once subscribed (it gets every later message)
        wait_for(
            lambda: sum(c.connected for c in consumer.stats().connections) == len(addresses),
            10,
            "subscribed to every nsqd",
        )
        while True:
            message = consumer.get(timeout=idle)
            if message is None:
                if _left(servers, topic, channel) == 0:
                    return bodies
                continue
            bodies.append(message.body)
            message.finish()


def wait_for(predicate: Any, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def as_set(values: Iterable[bytes]) -> set[bytes]:
    return set(values)


def create_channel(server: Any, topic: str, channel: str) -> None:
    """Create ``topic`` and ``channel`` over nsqd's HTTP API (the channel then gets every
    message published from now on)."""
    for path in (f"topic/create?topic={topic}", f"channel/create?topic={topic}&channel={channel}"):
        request = urllib.request.Request(f"http://{server.http_address}/{path}", method="POST")
        urllib.request.urlopen(request, timeout=5).close()


def crash_after(code: str, timeout: float = 60.0, before_kill: Any = None) -> Any:
    """Run ``code`` in a fresh Python process, take the JSON line it prints, call
    ``before_kill``, then kill -9 the process: a crash (nothing is answered or closed; nsqd
    keeps what it held in flight until its timeout)."""
    import os
    import selectors
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert process.stdout is not None
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout):
                raise AssertionError(f"the process printed nothing in {timeout}s")
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the process ended first (exit code {process.wait()})")
        if before_kill is not None:
            before_kill()
        return json.loads(line)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def hold_and_crash(nsqd: str, topic: str, channel: str, count: int, msg_timeout: float) -> None:
    """A consumer in another process takes ``count`` messages and dies holding them."""
    crash_after(
        f"""
import json, time
from nsq_sansio.config import Config
from transports.sync import Consumer
consumer = Consumer({topic!r}, {channel!r}, nsqd=[{nsqd!r}], pull=True,
                    config=Config(max_in_flight={count}, msg_timeout={msg_timeout}))
got = []
while len(got) < {count}:
    got += consumer.fetch({count} - len(got), timeout=5.0)
print(json.dumps(len(got)), flush=True)
time.sleep(600)
"""
    )

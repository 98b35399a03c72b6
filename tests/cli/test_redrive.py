"""``nsq-sansio redrive`` against the embedded broker: moves dead letters back to the source
topic named in their envelope (or ``--to-topic``), unwrapped, at the rate asked, stopping
after ``--count`` or when the channel is empty; a plain body without ``--to-topic`` stays."""

from __future__ import annotations

import re
import time

from support.brokers import get_json, unique

from nsq_sansio.dead_letter import DeadLetterEnvelope, encode_envelope
from transports.embedded import EmbeddedNSQD
from transports.sync import Consumer, Producer

from .conftest import channel_stats, cli


def _topic_count(nsqd: EmbeddedNSQD, topic: str) -> int:
    stats = get_json(f"{nsqd.http_url}/stats?format=json&topic={topic}")
    return sum(
        int(t["message_count"]) for t in stats.get("topics") or [] if t["topic_name"] == topic
    )


def _dead_letters(nsqd: EmbeddedNSQD, dead: str, source: str, count: int) -> list[bytes]:
    """Publish ``count`` envelopes naming ``source`` to ``dead`` (its channel ``redrive``
    made first); returns the original bodies."""
    bodies = [b"order-%d" % i for i in range(count)]
    with Producer(nsqd.tcp_address) as producer:
        with Consumer(dead, "redrive", nsqd=[nsqd.tcp_address], pull=True) as made:
            made.fetch(1, timeout=0.1)  # the channel exists before the messages come
        envelopes = [
            encode_envelope(
                DeadLetterEnvelope(
                    f"{i:016x}", 6, time.time_ns(), source, "billing", "n:1", "boom", 0.0, body
                )
            )
            for i, body in enumerate(bodies)
        ]
        producer.multi_publish(dead, envelopes)
    return bodies


def _elapsed(stderr: bytes) -> float:
    found = re.search(rb"in ([0-9.]+)s", stderr)
    assert found is not None, stderr
    return float(found.group(1))


def test_redrive_moves_count_messages_at_the_rate_asked(nsqd: EmbeddedNSQD) -> None:
    dead, source = unique("dead"), unique("orders")
    bodies = _dead_letters(nsqd, dead, source, 10)
    done = cli(
        "redrive", "--topic", dead, "--nsqd-tcp-address", nsqd.tcp_address,
        "--count", "6", "--rate", "10",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"moved 6 messages from {dead}/redrive".encode() in done.stderr
    assert f"(6 to {source})".encode() in done.stderr
    # Message n goes at start + n / rate: the 6th at 0.5 s, and not much later.
    assert 0.5 <= _elapsed(done.stderr) < 2.5
    assert _topic_count(nsqd, source) == 6
    assert channel_stats(nsqd.http_address, dead, "redrive")["depth"] == 4
    got: list[bytes] = []
    with Consumer(source, "check", nsqd=[nsqd.tcp_address]) as check:
        while len(got) < 6 and (msg := check.get(timeout=5.0)) is not None:
            got.append(msg.body)
            msg.finish()
    assert sorted(got) == sorted(bodies[:6])  # unwrapped: the original bodies

    # The rest, until the channel is empty.
    rest = cli(
        "redrive", "--topic", dead, "--nsqd-tcp-address", nsqd.tcp_address,
        "--rate", "0", "--idle-timeout", "0.5",
    )  # fmt: skip
    assert rest.returncode == 0, rest.stderr
    assert b"moved 4 messages" in rest.stderr
    assert _topic_count(nsqd, source) == 10
    empty = channel_stats(nsqd.http_address, dead, "redrive")
    assert empty["depth"] == 0 and empty["in_flight_count"] == 0


def test_plain_bodies_need_to_topic(nsqd: EmbeddedNSQD) -> None:
    dead, target = unique("dead"), unique("back")
    with Consumer(dead, "redrive", nsqd=[nsqd.tcp_address], pull=True) as made:
        made.fetch(1, timeout=0.1)
    with Producer(nsqd.tcp_address) as producer:
        producer.publish(dead, b"not an envelope")
    refused = cli(
        "redrive", "--topic", dead, "--nsqd-tcp-address", nsqd.tcp_address,
        "--idle-timeout", "0.5",
    )  # fmt: skip
    assert refused.returncode == 1
    assert b"not a dead-letter envelope: give --to-topic" in refused.stderr
    kept = channel_stats(nsqd.http_address, dead, "redrive")
    assert kept["depth"] + kept["deferred_count"] == 1  # requeued, not lost
    moved = cli(
        "redrive", "--topic", dead, "--nsqd-tcp-address", nsqd.tcp_address,
        "--to-topic", target, "--idle-timeout", "0.5",
    )  # fmt: skip
    assert moved.returncode == 0, moved.stderr
    assert _topic_count(nsqd, target) == 1

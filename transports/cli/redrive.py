"""``nsq-sansio redrive``: move messages from a dead-letter topic back to their source topic
(read from the dead-letter envelope, or ``--to-topic``), at most ``--rate`` messages per
second, until the dead-letter channel is empty or ``--count`` were moved.

Each message is published to its destination, nsqd's OK awaited, and only then FIN'd on the
dead-letter channel: a failed publish requeues it there (and stops the command with exit code
1), so nothing is lost. An envelope is unwrapped (its original body is published); a message
that is not an envelope needs ``--to-topic`` (without it the command requeues it and stops).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence

from .common import (
    CLIError,
    CommandParser,
    add_client,
    add_sources,
    check_sources,
    client_options,
    flag,
    lookupd_nsqd_addresses,
    non_negative,
    positive,
    reports_errors,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

__all__ = ["build_parser", "redrive_main"]


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio redrive``'s flags."""
    p = CommandParser(
        prog="nsq-sansio redrive",
        description="move messages from a dead-letter topic back to their source topic",
    )
    flag(p, "topic", required=True, help="the dead-letter topic to read")
    flag(
        p,
        "channel",
        default="redrive",
        help="the dead-letter topic's channel to read (default %(default)s)",
    )
    flag(
        p,
        "to-topic",
        default=None,
        help="publish every message here (default: the source topic named in its envelope)",
    )
    flag(
        p,
        "rate",
        type=non_negative(float),
        default=10.0,
        help="at most this many messages per second (0: no limit; default %(default)s)",
    )
    flag(p, "count", type=positive(int), default=None, help="stop after moving this many")
    flag(
        p,
        "idle-timeout",
        type=positive(float),
        default=2.0,
        help="the channel counts as empty when no message came for this long "
        "(seconds, default %(default)s)",
    )
    add_sources(p)
    add_client(p)
    return p


@reports_errors("redrive")
def redrive_main(argv: Sequence[str]) -> int:
    """``nsq-sansio redrive [flags]``: move messages, print what went where."""
    from nsq_sansio.dead_letter import EnvelopeError, decode_envelope
    from transports.sync import Consumer, Producer

    args = build_parser().parse_args(argv)
    topic = valid_topic(args.topic)
    channel = valid_channel(args.channel)
    to_topic = valid_topic(args.to_topic) if args.to_topic else None
    options = client_options(args)
    nsqd, lookupd = check_sources(args, args.connect_timeout)
    targets = list(nsqd)
    if lookupd:
        targets += [
            a
            for a in lookupd_nsqd_addresses(lookupd, topic, args.connect_timeout)
            if a not in targets
        ]
    if not targets:
        raise CLIError(f"no nsqd has the topic {topic}")
    limit: int | None = args.count
    interval = 1.0 / args.rate if args.rate else 0.0
    moved: Counter[str] = Counter()
    total = 0
    started = time.monotonic()
    error: str | None = None
    last_message = started
    with (
        stop_on_signals() as stop,
        Producer(targets, **options) as producer,
        Consumer(topic, channel, nsqd=nsqd, lookupd=lookupd, pull=True, **options) as consumer,
    ):
        while not stop.is_set() and (limit is None or total < limit) and error is None:
            batch = min(100, limit - total) if limit is not None else 100
            if interval:
                batch = min(batch, max(1, int(args.rate)))
            # Short fetches (what arrived within 0.1 s): the channel is empty once nothing
            # came for --idle-timeout in a row.
            messages = consumer.fetch(batch, timeout=0.1)
            if not messages:
                if time.monotonic() - last_message >= args.idle_timeout:
                    break
                continue
            last_message = time.monotonic()
            for msg in messages:
                if stop.is_set() or error is not None:
                    msg.requeue(0.0, backoff=False)
                    continue
                destination, body = to_topic, msg.body
                try:
                    envelope = decode_envelope(msg.body)
                except EnvelopeError:
                    envelope = None
                if envelope is not None:
                    body = envelope.body
                    destination = destination or envelope.topic
                if destination is None:
                    msg.requeue(0.0, backoff=False)
                    error = (
                        f"message {msg.id.decode(errors='replace')} is not a dead-letter "
                        "envelope: give --to-topic"
                    )
                    continue
                if interval:  # message number `total` goes at started + total / rate
                    wait = started + total * interval - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)
                try:
                    producer.publish(destination, body)
                except Exception as exc:
                    msg.requeue(0.0, backoff=False)
                    error = f"publishing to {destination} failed: {exc}"
                    continue
                msg.finish()
                moved[destination] += 1
                total += 1
        elapsed = max(time.monotonic() - started, 1e-9)
        consumer.drain(timeout=2.0)
    where = ", ".join(f"{count:,} to {name}" for name, count in sorted(moved.items()))
    print(
        f"moved {total:,} messages from {topic}/{channel} in {elapsed:.2f}s"
        + (f" ({where})" if where else ""),
        file=sys.stderr,
    )
    if error is not None:
        raise CLIError(error)
    return 0

"""``nsq-sansio pub``: publish the lines (or delimited records) of stdin or a file to a topic
(``to_nsq``), in MPUB batches, with an optional rate limit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO

from .common import (
    CLIError,
    CommandParser,
    UsageError,
    add_client,
    add_metrics_flag,
    check_metrics_address,
    client_options,
    flag,
    lookupd_nsqd_addresses,
    lookupd_urls,
    non_negative,
    positive,
    probe_tcp,
    reports_errors,
    serving_metrics,
    valid_topic,
)

__all__ = ["build_parser", "pub_main"]


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio pub``'s flags."""
    p = CommandParser(
        prog="nsq-sansio pub",
        description="publish lines of stdin (or --file) to a topic, in MPUB batches",
    )
    flag(p, "topic", required=True, help="NSQ topic")
    flag(
        p,
        "nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times: round robin with failover)",
    )
    flag(
        p,
        "lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times): publish to the nsqd that "
        "have the topic, else to every nsqd registered",
    )
    flag(p, "file", default=None, help="read this file instead of stdin")
    flag(
        p,
        "delimiter",
        default="\\n",
        help="message delimiter; escapes such as \\t or \\0 work (default: newline)",
    )
    flag(
        p,
        "batch-size",
        type=positive(int),
        default=100,
        help="messages per MPUB (1: PUB; default %(default)s)",
    )
    flag(
        p,
        "rate",
        type=non_negative(float),
        default=0.0,
        help="at most this many messages/s (0: no limit)",
    )
    add_metrics_flag(p)
    add_client(p)
    return p


def _delimiter(text: str) -> bytes:
    """``--delimiter`` with its backslash escapes resolved; empty or malformed is refused."""
    try:
        delimiter = text.encode().decode("unicode_escape").encode("latin-1")
    except (UnicodeError, ValueError) as err:
        raise UsageError(f"bad --delimiter {text!r}: {err}") from None
    if not delimiter:
        raise UsageError("--delimiter must not be empty")
    return delimiter


def _read_messages(stream: IO[bytes], delimiter: bytes) -> Iterator[bytes]:
    pending = b""
    while True:
        chunk = stream.read(64 * 1024)
        if not chunk:
            break
        pending += chunk
        *bodies, pending = pending.split(delimiter)
        for body in bodies:
            if delimiter == b"\n" and body.endswith(b"\r"):
                body = body[:-1]
            if body:
                yield body
    if pending.rstrip(b"\r"):
        yield pending.rstrip(b"\r") if delimiter == b"\n" else pending


@reports_errors("pub")
def pub_main(argv: Sequence[str]) -> int:
    """``nsq-sansio pub [flags]``: publish stdin (or ``--file``), exit once nsqd confirmed all."""
    from transports.sync import Producer, PublishFuture

    args = build_parser().parse_args(argv)
    topic = valid_topic(args.topic)
    nsqd = list(args.nsqd_tcp_address)
    lookupd = lookupd_urls(args.lookupd_http_address)
    if not nsqd and not lookupd:
        raise UsageError("give --nsqd-tcp-address or --lookupd-http-address")
    delimiter = _delimiter(args.delimiter)
    options = client_options(args)
    check_metrics_address(args.metrics_address)
    if args.file is not None and (not os.path.exists(args.file) or os.path.isdir(args.file)):
        raise CLIError(f"--file {args.file!r}: no such file")
    for address in nsqd:
        probe_tcp(address, "nsqd", args.connect_timeout)
    if lookupd:
        found = [
            a for a in lookupd_nsqd_addresses(lookupd, topic, args.connect_timeout) if a not in nsqd
        ]
        if not nsqd and not found:
            raise CLIError(f"no nsqd registered with {', '.join(lookupd)}")
        nsqd += found
    batch_size = args.batch_size
    if args.rate:
        batch_size = max(1, min(batch_size, int(args.rate / 10) or 1))
    published = 0
    started = time.monotonic()
    pending: list[tuple[PublishFuture, int]] = []

    def settle(keep: int) -> None:
        nonlocal published
        while len(pending) > keep:
            future, count = pending.pop(0)
            future.result()
            published += count

    with contextlib.ExitStack() as stack:
        stream: IO[bytes] = (
            stack.enter_context(open(args.file, "rb")) if args.file else sys.stdin.buffer
        )
        producer = stack.enter_context(Producer(nsqd, **options))
        stack.enter_context(serving_metrics(args.metrics_address, producer))
        # round robin goes over the connected nsqd: let every one connect first (or time
        # out, then failover covers it), so a short input is spread over all of them
        ready_by = time.monotonic() + args.connect_timeout
        while time.monotonic() < ready_by and not all(
            c.connected for c in producer.stats().connections
        ):
            time.sleep(0.005)
        batch: list[bytes] = []
        sent = 0

        def flush() -> None:
            nonlocal sent
            if not batch:
                return
            if args.rate:
                wait = started + sent / args.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            if len(batch) == 1:
                future = producer.publish_async(topic, batch[0])
            else:
                future = producer.multi_publish_async(topic, list(batch))
            pending.append((future, len(batch)))
            sent += len(batch)
            batch.clear()
            settle(32)

        for body in _read_messages(stream, delimiter):
            batch.append(body)
            if len(batch) >= batch_size:
                flush()
        flush()
        settle(0)
    elapsed = max(time.monotonic() - started, 1e-9)
    print(
        f"published {published:,} messages to {topic} in {elapsed:.2f}s "
        f"({published / elapsed:,.0f} msg/s)",
        file=sys.stderr,
    )
    return 0

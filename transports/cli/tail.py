"""``nsq-sansio tail``: print a topic's messages as they arrive (``nsq_tail``), one JSON object or
one raw body per line.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import sys
from collections.abc import Sequence
from typing import Any

from .common import (
    CommandParser,
    add_client,
    add_metrics_flag,
    add_progress_flag,
    add_sources,
    check_metrics_address,
    check_sources,
    client_options,
    flag,
    non_negative,
    positive,
    reports_errors,
    serving_metrics,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

__all__ = ["build_parser", "tail_main"]


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio tail``'s flags."""
    p = CommandParser(prog="nsq-sansio tail", description="print a topic's messages")
    flag(p, "topic", required=True, help="NSQ topic")
    flag(p, "channel", default=None, help="NSQ channel (default: a new ephemeral one)")
    add_sources(p)
    flag(
        p,
        "max-in-flight",
        type=positive(int),
        default=200,
        help="messages nsqd may send before they are printed (default %(default)s)",
    )
    p.add_argument(
        "-n", "--n", type=non_negative(int), default=0, help="stop after N messages (0: never)"
    )
    flag(
        p,
        "format",
        choices=("raw", "json"),
        default="raw",
        help="raw: each body on its line; json: one object per message (default %(default)s)",
    )
    add_progress_flag(p)
    add_metrics_flag(p)
    add_client(p)
    return p


def _message_json(msg: Any, topic: str, channel: str) -> str:
    body: bytes = msg.body
    record: dict[str, Any] = {
        "id": msg.id.decode("ascii", "replace"),
        "topic": topic,
        "channel": channel,
        "timestamp": msg.timestamp,
        "attempts": msg.attempts,
        "nsqd": msg.nsqd_address,
    }
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    return json.dumps(record, ensure_ascii=False)


@reports_errors("tail")
def tail_main(argv: Sequence[str]) -> int:
    """``nsq-sansio tail [flags]``: print messages until ``-n`` or SIGINT/SIGTERM."""
    from transports.sync import Consumer

    from .progress import ProgressDisplay, Stage

    args = build_parser().parse_args(argv)
    topic = valid_topic(args.topic)
    channel = args.channel or f"tail{random.randrange(10**6):06d}#ephemeral"
    valid_channel(channel)
    options = client_options(args)
    check_metrics_address(args.metrics_address)
    nsqd, lookupd = check_sources(args, args.connect_timeout)
    out = sys.stdout.buffer
    shown = 0
    limit = args.n
    # messages go to stdout: on the same terminal, progress lines must not redraw over them
    progress = ProgressDisplay(enabled=args.progress, plain=sys.stdout.isatty())

    def show(final: bool = False) -> None:
        progress.update([Stage("tail", shown, limit or None)], final=final)

    with (
        stop_on_signals() as stop,
        Consumer(
            topic,
            channel,
            nsqd=nsqd,
            lookupd=lookupd,
            max_in_flight=min(args.max_in_flight, limit) if limit else args.max_in_flight,
            **options,
        ) as consumer,
        serving_metrics(args.metrics_address, consumer),
    ):
        while not stop.is_set() and (not limit or shown < limit):
            msg = consumer.get(timeout=0.25)
            if msg is None:
                if consumer.draining:
                    break
                show()
                continue
            if args.format == "json":
                out.write(_message_json(msg, topic, channel).encode() + b"\n")
            else:
                out.write(msg.body + b"\n")
            out.flush()
            msg.finish()
            shown += 1
            show()
        consumer.drain(timeout=2.0)
    show(final=True)
    return 0

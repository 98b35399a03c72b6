"""``nsq-sansio stat``: a live table of every topic's and channel's depth, in-flight count and
rates, from every nsqd's ``/stats`` (``nsq_stat``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime

from transports._common import (
    DEFAULT_HTTP_PORT,
    format_address,
    parse_address,
)

from .common import (
    CLIError,
    flag,
    http_get_json,
    lookupd_urls,
    parse_duration,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

__all__ = ["collect_stats", "format_stats", "stat_main"]


def _stat_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsq-sansio stat",
        description="a live table of topic/channel depth, in-flight and rates from the /stats "
        "of every nsqd (given, or found through nsqlookupd)",
    )
    flag(p, "topic", default=None, help="only this topic")
    flag(p, "channel", default=None, help="only this channel")
    flag(
        p,
        "nsqd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd HTTP address (may be given multiple times)",
    )
    flag(
        p,
        "lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times)",
    )
    p.add_argument(
        "--status-every",
        "-status-every",
        "--interval",
        dest="status_every",
        type=parse_duration,
        default=2.0,
        help="refresh interval (default 2s)",
    )
    flag(p, "count", type=int, default=0, help="stop after this many tables (0: never)")
    flag(p, "http-timeout", type=parse_duration, default=5.0, help="per HTTP request")
    return p


def _nsqd_http_addresses(nsqd: Sequence[str], lookupd: Sequence[str], timeout: float) -> list[str]:
    found: list[str] = []
    for address in nsqd:
        host, port = parse_address(address.split("://")[-1], DEFAULT_HTTP_PORT)
        found.append(format_address(host, port))
    for url in lookupd:
        data = http_get_json(f"{url}/nodes", timeout)
        for producer in data.get("producers") or []:
            address = format_address(producer["broadcast_address"], int(producer["http_port"]))
            if address not in found:
                found.append(address)
    return found


StatKey = tuple[str, str]  # (topic, channel or "")


def collect_stats(
    addresses: Sequence[str],
    topic: str | None,
    channel: str | None,
    timeout: float,
    errors: list[str] | None = None,
) -> dict[StatKey, dict[str, int]]:
    """Sum the /stats of every nsqd per (topic, channel); channel "" is the topic itself.

    An nsqd that does not answer is skipped and described in ``errors`` when a list is given
    (else its error is raised)."""
    rows: dict[StatKey, dict[str, int]] = {}
    for address in addresses:
        query = "format=json" + (f"&topic={topic}" if topic else "")
        try:
            data = http_get_json(f"http://{address}/stats?{query}", timeout)
        except CLIError as err:
            if errors is None:
                raise
            errors.append(str(err))
            continue
        data = data.get("data", data)  # nsqd before 1.0 wrapped the answer
        for t in data.get("topics") or []:
            name = t["topic_name"]
            if topic and name != topic:
                continue
            row = rows.setdefault((name, ""), dict.fromkeys(_COLUMNS, 0))
            row["nsqd"] += 1
            row["depth"] += int(t.get("depth", 0))
            row["messages"] += int(t.get("message_count", 0))
            for c in t.get("channels") or []:
                if channel and c["channel_name"] != channel:
                    continue
                crow = rows.setdefault((name, c["channel_name"]), dict.fromkeys(_COLUMNS, 0))
                crow["nsqd"] += 1
                crow["depth"] += int(c.get("depth", 0))
                crow["in_flight"] += int(c.get("in_flight_count", 0))
                crow["deferred"] += int(c.get("deferred_count", 0))
                crow["requeued"] += int(c.get("requeue_count", 0))
                crow["timed_out"] += int(c.get("timeout_count", 0))
                crow["messages"] += int(c.get("message_count", 0))
                crow["clients"] += len(c.get("clients") or []) or int(c.get("client_count", 0))
    return rows


_COLUMNS = (
    "nsqd",
    "depth",
    "in_flight",
    "deferred",
    "requeued",
    "timed_out",
    "messages",
    "clients",
)


def format_stats(
    rows: dict[StatKey, dict[str, int]],
    previous: dict[StatKey, dict[str, int]] | None,
    interval: float,
) -> str:
    header = (
        "topic",
        "channel",
        "nsqd",
        "depth",
        "in-flight",
        "deferred",
        "requeued",
        "timed-out",
        "messages",
        "msg/s",
        "clients",
    )
    table = [header]
    for key in sorted(rows):
        row = rows[key]
        rate = "-"
        if previous is not None and key in previous and interval > 0:
            rate = f"{max(0, row['messages'] - previous[key]['messages']) / interval:,.0f}"
        topic_row = key[1] == ""
        table.append(
            (
                key[0],
                key[1] or "-",
                str(row["nsqd"]),
                f"{row['depth']:,}",
                "-" if topic_row else f"{row['in_flight']:,}",
                "-" if topic_row else f"{row['deferred']:,}",
                "-" if topic_row else f"{row['requeued']:,}",
                "-" if topic_row else f"{row['timed_out']:,}",
                f"{row['messages']:,}",
                rate,
                "-" if topic_row else str(row["clients"]),
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = []
    for r in table:
        cells = [c.ljust(widths[i]) if i < 2 else c.rjust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    if len(table) == 1:
        lines.append("(no topics)")
    return "\n".join(lines)


def stat_main(argv: Sequence[str]) -> int:
    args = _stat_parser().parse_args(argv)
    if args.topic:
        valid_topic(args.topic)
    if args.channel:
        valid_channel(args.channel)
    lookupd = lookupd_urls(args.lookupd_http_address)
    if not args.nsqd_http_address and not lookupd:
        raise CLIError("give --nsqd-http-address or --lookupd-http-address")
    previous: dict[StatKey, dict[str, int]] | None = None
    shown = 0
    last = time.monotonic()
    with stop_on_signals() as stop:
        while not stop.is_set():
            # The first table fails on any error (a wrong address should say so at once);
            # later ones keep going and name what did not answer.
            errors: list[str] | None = [] if shown else None
            try:
                addresses = _nsqd_http_addresses(args.nsqd_http_address, lookupd, args.http_timeout)
            except CLIError as err:
                if errors is None:
                    raise
                print(f"nsq-sansio stat: {err}", file=sys.stderr, flush=True)
                stop.wait(args.status_every)
                continue
            rows = collect_stats(addresses, args.topic, args.channel, args.http_timeout, errors)
            now = time.monotonic()
            stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {len(addresses)} nsqd")
            print(format_stats(rows, previous, now - last))
            for error in errors or ():
                print(f"  ! {error}")
            print(flush=True)
            previous, last = rows, now
            shown += 1
            if args.count and shown >= args.count:
                break
            stop.wait(args.status_every)
    return 0

"""``nsq-sansio stat``: a live table of every topic's and channel's depth, in-flight count and
rates, from every nsqd's ``/stats`` (``nsq_stat``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from nsq_sansio.errors import NSQError
from nsq_sansio.names import validate_channel, validate_topic
from transports._common import (
    DEFAULT_HTTP_PORT,
    format_address,
    parse_address,
)

from .common import (
    NSQD_ANSWER_LIMIT,
    CLIError,
    CommandParser,
    UsageError,
    describe_error,
    flag,
    http_get_json,
    lookupd_urls,
    parse_duration,
    positive,
    producer_addresses,
    reports_errors,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

__all__ = ["build_parser", "collect_stats", "format_stats", "stat_main"]

#: The table is made to fit this many columns.
TABLE_WIDTH = 80


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio stat``'s flags."""
    p = CommandParser(
        prog="nsq-sansio stat",
        description="a live table of topic/channel depth, in-flight and rates from the /stats "
        "of every nsqd (given, or found through nsqlookupd)",
    )
    flag(p, "topic", default=None, help="only this topic (an error if no nsqd has it)")
    flag(p, "channel", default=None, help="only this channel (an error if no nsqd has it)")
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
        "-interval",
        dest="status_every",
        type=positive(parse_duration),
        default=2.0,
        metavar="DURATION",
        help="time between two tables (default 2s)",
    )
    flag(
        p,
        "count",
        type=positive(int),
        default=None,
        help="stop after this many tables (default: until interrupted)",
    )
    flag(
        p,
        "http-timeout",
        type=positive(parse_duration),
        default=5.0,
        metavar="DURATION",
        help="bound on each HTTP request, answer included (default 5s)",
    )
    return p


def _nsqd_http_addresses(nsqd: Sequence[str], lookupd: Sequence[str], timeout: float) -> list[str]:
    found: list[str] = []
    for address in nsqd:
        try:
            host, port = parse_address(address.split("://")[-1], DEFAULT_HTTP_PORT)
        except ValueError as err:
            raise UsageError(f"bad nsqd HTTP address {address!r}: {err}") from None
        found.append(format_address(host, port))
    for url in lookupd:
        nodes = f"{url}/nodes"
        for address in producer_addresses(http_get_json(nodes, timeout), nodes, "http_port"):
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
        # without client lists the answer stays small; client_count still says how many
        query = "format=json&include_clients=false&include_mem=false"
        if topic:
            query += f"&topic={topic}"
        url = f"http://{address}/stats?{query}"
        try:
            answer = http_get_json(url, timeout, NSQD_ANSWER_LIMIT)
            _add_stats(rows, answer, url, topic, channel)
        except CLIError as err:
            if errors is None:
                raise
            errors.append(str(err))
    return rows


def _add_stats(
    rows: dict[StatKey, dict[str, int]],
    answer: Any,
    url: str,
    topic: str | None,
    channel: str | None,
) -> None:
    """Add one nsqd's ``/stats`` answer to ``rows`` (all or nothing: an answer of another
    shape is a :class:`CLIError` and leaves ``rows`` as they were)."""
    mine: dict[StatKey, dict[str, int]] = {}
    try:
        _sum_stats(mine, answer.get("data", answer), topic, channel)  # nsqd < 1.0 wrapped it
    except (ArithmeticError, AttributeError, KeyError, TypeError, ValueError, NSQError) as err:
        raise CLIError(f"{url}: not an nsqd /stats answer ({describe_error(err)})") from None
    for key, row in mine.items():
        total = rows.setdefault(key, dict.fromkeys(_COLUMNS, 0))
        for field, value in row.items():
            total[field] += value


def _sum_stats(
    rows: dict[StatKey, dict[str, int]], data: Any, topic: str | None, channel: str | None
) -> None:
    """Add the topics and channels of one nsqd's ``/stats`` (unwrapped) to ``rows``."""
    for t in data.get("topics") or []:
        name = validate_topic(str(t["topic_name"]))  # printed: no escape sequences
        if topic and name != topic:
            continue
        row = rows.setdefault((name, ""), dict.fromkeys(_COLUMNS, 0))
        row["nsqd"] += 1
        row["depth"] += _count(t.get("depth", 0))
        row["messages"] += _count(t.get("message_count", 0))
        for c in t.get("channels") or []:
            channel_name = validate_channel(str(c["channel_name"]))
            if channel and channel_name != channel:
                continue
            crow = rows.setdefault((name, channel_name), dict.fromkeys(_COLUMNS, 0))
            crow["nsqd"] += 1
            crow["depth"] += _count(c.get("depth", 0))
            crow["in_flight"] += _count(c.get("in_flight_count", 0))
            crow["deferred"] += _count(c.get("deferred_count", 0))
            crow["requeued"] += _count(c.get("requeue_count", 0))
            crow["timed_out"] += _count(c.get("timeout_count", 0))
            crow["messages"] += _count(c.get("message_count", 0))
            if "client_count" in c:
                crow["clients"] += _count(c["client_count"])
            else:  # nsqd before 1.2 lists its clients
                crow["clients"] += len(c.get("clients") or [])


def _count(value: Any) -> int:
    """A count of an nsqd answer: an integer >= 0, else ValueError."""
    number = int(value)
    if number < 0:
        raise ValueError(f"negative count {number}")
    return number


def missing_filter(
    rows: dict[StatKey, dict[str, int]], topic: str | None, channel: str | None
) -> str | None:
    """What ``--topic`` / ``--channel`` named that no nsqd has (as ``nsq_stat`` refuses a
    channel it does not find), or None."""
    if topic and (topic, "") not in rows:
        return f"topic {topic!r} not found"
    if channel and not any(key[1] == channel for key in rows):
        where = f"topic {topic!r}" if topic else "any topic"
        return f"channel {channel!r} not found in {where}"
    return None


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

# (heading, field): msg/s is computed between two tables, the others summed over the nsqd
_HEADINGS = (
    ("nsqd", "nsqd"),
    ("depth", "depth"),
    ("inflt", "in_flight"),
    ("def", "deferred"),
    ("req", "requeued"),
    ("t-o", "timed_out"),
    ("msgs", "messages"),
    ("msg/s", ""),
    ("clients", "clients"),
)
_CHANNEL_ONLY = {"in_flight", "deferred", "requeued", "timed_out", "clients"}
_UNITS = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def count(n: float) -> str:
    """At most 6 characters: ``99,999``, then three significant digits (``123k``, ``4.56M``)."""
    n = round(n)
    if n < 100_000:
        return f"{n:,}"
    for size, unit in _UNITS:
        if n >= size * 0.9995:
            text = f"{n / size:.3g}"
            if "e" not in text:
                return f"{text}{unit}"
    return f"{n:.2g}"  # pragma: no cover  (beyond int64)


def format_stats(
    rows: dict[StatKey, dict[str, int]],
    previous: dict[StatKey, dict[str, int]] | None,
    interval: float,
    width: int = TABLE_WIDTH,
) -> str:
    """The table: a line per topic, its channels indented under it, every line at most
    ``width`` columns (numbers above 99,999 in three significant digits; a name too long
    for its column gets a line of its own, the numbers below it)."""
    names: list[str] = []
    table: list[list[str]] = []
    for key in sorted(rows):
        row = rows[key]
        topic_row = key[1] == ""
        cells = []
        for _, field in _HEADINGS:
            if not field:  # msg/s
                rate = "-"
                if previous is not None and key in previous and interval > 0:
                    done = max(0, row["messages"] - previous[key]["messages"])
                    rate = count(done / interval)
                cells.append(rate)
            elif topic_row and field in _CHANNEL_ONLY:
                cells.append("-")
            else:
                cells.append(count(row[field]))
        names.append(key[0] if topic_row else f"  {key[1]}")
        table.append(cells)
    widths = [
        max([len(heading)] + [len(cells[i]) for cells in table])
        for i, (heading, _) in enumerate(_HEADINGS)
    ]
    numbers_width = sum(widths) + 2 * len(widths)
    room = width - numbers_width
    label = "topic/channel" if room >= len("topic/channel") else "topic"
    name_width = max([len(label)] + [len(n) for n in names if len(n) <= room])

    def numbers(cells: Sequence[str]) -> str:
        return "".join("  " + c.rjust(w) for c, w in zip(cells, widths, strict=True))

    lines = [label.ljust(name_width) + numbers([h for h, _ in _HEADINGS])]
    for name, cells in zip(names, table, strict=True):
        if len(name) > name_width:
            lines.append(name)
            lines.append(" " * name_width + numbers(cells))
        else:
            lines.append(name.ljust(name_width) + numbers(cells))
    if not table:
        lines.append("(no topics)")
    return "\n".join(lines)


@reports_errors("stat")
def stat_main(argv: Sequence[str]) -> int:
    """``nsq-sansio stat [flags]``: print a table every ``--status-every``."""
    args = build_parser().parse_args(argv)
    if args.topic:
        valid_topic(args.topic)
    if args.channel:
        valid_channel(args.channel)
    lookupd = lookupd_urls(args.lookupd_http_address)
    if not args.nsqd_http_address and not lookupd:
        raise UsageError("give --nsqd-http-address or --lookupd-http-address")
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
            except UsageError:
                raise
            except CLIError as err:
                if errors is None:
                    raise
                print(f"nsq-sansio stat: {err}", file=sys.stderr, flush=True)
                stop.wait(args.status_every)
                continue
            rows = collect_stats(addresses, args.topic, args.channel, args.http_timeout, errors)
            missing = missing_filter(rows, args.topic, args.channel)
            if missing is not None and not errors:  # every nsqd answered: it is not there
                raise CLIError(f"{missing} on {len(addresses)} nsqd")
            now = time.monotonic()
            stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {len(addresses)} nsqd")
            print(format_stats(rows, previous, now - last))
            for error in errors or ():
                print(f"  ! {error}")
            print(flush=True)
            previous, last = rows, now
            shown += 1
            if args.count is not None and shown >= args.count:
                break
            stop.wait(args.status_every)
    return 0

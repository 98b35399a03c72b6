"""``nsq-sansio stat``: a live table of every topic's and channel's lag, depth, in-flight count
and rates, from every nsqd's ``/stats`` (``nsq_stat``), read through the admin client
(:class:`~transports.sync.admin.NSQDAdmin`, one per nsqd, kept from one table to the next).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from nsq_sansio.errors import NSQError
from nsq_sansio.names import validate_channel, validate_topic

from .common import (
    CLIError,
    CommandParser,
    UsageError,
    admin_call,
    describe_error,
    flag,
    lookupd_admin,
    lookupd_urls,
    nsqd_admin,
    parse_duration,
    positive,
    reports_errors,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

if TYPE_CHECKING:
    from nsq_sansio.admin import NSQDStats
    from transports.sync.admin import NSQDAdmin

__all__ = [
    "StatSources",
    "add_stats",
    "build_parser",
    "collect_stats",
    "format_stats",
    "missing_filter",
    "stat_main",
]

#: The table is made to fit this many columns.
TABLE_WIDTH = 80


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio stat``'s flags."""
    p = CommandParser(
        prog="nsq-sansio stat",
        description="a live table of topic/channel lag, depth, in-flight and rates from the "
        "/stats of every nsqd (given, or found through nsqlookupd)",
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


class StatSources:
    """The admin clients ``stat`` reads through, kept (with their connections) from one table
    to the next: one per lookupd, and one per nsqd found so far (given, or listed by a
    lookupd's ``/nodes``); an nsqd no longer listed has its client closed."""

    def __init__(self, nsqd: Sequence[str], lookupd: Sequence[str], timeout: float) -> None:
        self._timeout = timeout
        self._given = [nsqd_admin(address, timeout) for address in nsqd]  # usage errors now
        self._lookupds = [lookupd_admin(url, timeout) for url in lookupd]
        self._found: dict[str, NSQDAdmin] = {}

    def __enter__(self) -> StatSources:
        for admin in (*self._given, *self._lookupds):
            admin.__enter__()  # a kept-alive connection each
        return self

    def __exit__(self, *exc: object) -> None:
        for admin in (*self._given, *self._lookupds, *self._found.values()):
            admin.close()

    def nsqds(self) -> list[NSQDAdmin]:
        """The nsqd to read: those given, then those the lookupds list (each once, by its
        HTTP address); a lookupd that does not answer is a :class:`CLIError`."""
        chosen = {str(admin.endpoint.host_header): admin for admin in self._given}
        listed: dict[str, None] = {}
        for lookupd in self._lookupds:
            for node in admin_call(lookupd, "/nodes", lookupd.nodes):
                listed.setdefault(node.http_address)
        for address in listed:
            if address in chosen:
                continue
            admin = self._found.get(address)
            if admin is None:
                admin = self._found[address] = nsqd_admin(address, self._timeout)
                admin.__enter__()
            chosen[address] = admin
        for address in [a for a in self._found if a not in listed]:  # gone from the cluster
            self._found.pop(address).close()
        return list(chosen.values())


StatKey = tuple[str, str]  # (topic, channel or "")


def collect_stats(
    nsqds: Sequence[NSQDAdmin],
    topic: str | None,
    channel: str | None,
    errors: list[str] | None = None,
) -> dict[StatKey, dict[str, int]]:
    """Sum the ``/stats`` of every nsqd per (topic, channel); channel "" is the topic itself.

    An nsqd that does not answer (or answers what is not nsqd's ``/stats``) is skipped and
    described in ``errors`` when a list is given (else its error is raised)."""
    rows: dict[StatKey, dict[str, int]] = {}
    for admin in nsqds:
        try:
            # without client lists the answer stays small; client_count still says how many
            stats = admin_call(admin, "/stats", _stats_without_clients, admin, topic)
            add_stats(rows, stats, f"{admin.endpoint}/stats", topic, channel)
        except CLIError as err:
            if errors is None:
                raise
            errors.append(str(err))
    return rows


def _stats_without_clients(admin: NSQDAdmin, topic: str | None) -> NSQDStats:
    return admin.stats(topic, include_clients=False)


def add_stats(
    rows: dict[StatKey, dict[str, int]],
    stats: NSQDStats,
    url: str,
    topic: str | None,
    channel: str | None,
) -> None:
    """Add one nsqd's ``/stats`` to ``rows`` (all or nothing: names that could not be
    printed as they are, or negative counts, are a :class:`CLIError` and leave ``rows`` as
    they were)."""
    mine: dict[StatKey, dict[str, int]] = {}
    try:
        _sum_stats(mine, stats, topic, channel)
    except (ValueError, NSQError) as err:  # InvalidName is both
        raise CLIError(f"{url}: not an nsqd /stats answer ({describe_error(err)})") from None
    for key, row in mine.items():
        total = rows.setdefault(key, dict.fromkeys(_COLUMNS, 0))
        for field, value in row.items():
            total[field] += value


def _sum_stats(
    rows: dict[StatKey, dict[str, int]], stats: NSQDStats, topic: str | None, channel: str | None
) -> None:
    """Add the topics and channels of one nsqd's ``/stats`` to ``rows``."""
    for t in stats.topics:
        name = validate_topic(t.name)  # printed: no escape sequences
        if topic and name != topic:
            continue
        row = rows.setdefault((name, ""), dict.fromkeys(_COLUMNS, 0))
        row["nsqd"] += 1
        row["depth"] += _count(t.depth)
        row["messages"] += _count(t.message_count)
        for c in t.channels:
            channel_name = validate_channel(c.name)
            if channel and channel_name != channel:
                continue
            crow = rows.setdefault((name, channel_name), dict.fromkeys(_COLUMNS, 0))
            crow["nsqd"] += 1
            crow["lag"] += _count(c.lag)
            crow["depth"] += _count(c.depth)
            crow["in_flight"] += _count(c.in_flight_count)
            crow["deferred"] += _count(c.deferred_count)
            crow["requeued"] += _count(c.requeue_count)
            crow["timed_out"] += _count(c.timeout_count)
            crow["messages"] += _count(c.message_count)
            crow["clients"] += _count(c.client_count)


def _count(number: int) -> int:
    """A count of an nsqd answer: an integer >= 0, else ValueError."""
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
    "lag",
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
    ("lag", "lag"),
    ("depth", "depth"),
    ("inflt", "in_flight"),
    ("def", "deferred"),
    ("req", "requeued"),
    ("t-o", "timed_out"),
    ("msgs", "messages"),
    ("msg/s", ""),
    ("clients", "clients"),
)
_CHANNEL_ONLY = {"lag", "in_flight", "deferred", "requeued", "timed_out", "clients"}
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
    # two spaces between columns, one when huge numbers would leave no room for "topic"
    gap = 2 if sum(widths) + 2 * len(widths) + len("topic") <= width else 1
    numbers_width = sum(widths) + gap * len(widths)
    room = width - numbers_width
    label = "topic/channel" if room >= len("topic/channel") else "topic"
    name_width = max([len(label)] + [len(n) for n in names if len(n) <= room])

    def numbers(cells: Sequence[str]) -> str:
        return "".join(" " * gap + c.rjust(w) for c, w in zip(cells, widths, strict=True))

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
    sources = StatSources(args.nsqd_http_address, lookupd, args.http_timeout)
    with stop_on_signals() as stop, sources:
        while not stop.is_set():
            # The first table fails on any error (a wrong address should say so at once);
            # later ones keep going and name what did not answer.
            errors: list[str] | None = [] if shown else None
            try:
                nsqds = sources.nsqds()
            except CLIError as err:
                if errors is None:
                    raise
                print(f"nsq-sansio stat: {err}", file=sys.stderr, flush=True)
                stop.wait(args.status_every)
                continue
            rows = collect_stats(nsqds, args.topic, args.channel, errors)
            missing = missing_filter(rows, args.topic, args.channel)
            if missing is not None and not errors:  # every nsqd answered: it is not there
                raise CLIError(f"{missing} on {len(nsqds)} nsqd")
            now = time.monotonic()
            stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            print(f"{stamp}  {len(nsqds)} nsqd")
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

"""``nsq-sansio to-file``: archive a channel to rolling files (``nsq_to_file``); a message is
FIN'd only once the file holding it is synced (see :mod:`.archive`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .archive import DEFAULT_FILENAME_FORMAT, FileArchive
from .common import (
    CLIError,
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
    parse_duration,
    positive,
    reports_errors,
    serving_metrics,
    stop_on_signals,
    valid_channel,
    valid_topic,
)

__all__ = ["build_parser", "to_file_main"]


def _gzip_level(text: str) -> int:
    level = positive(int)(text)
    if not 1 <= level <= 9:
        raise argparse.ArgumentTypeError(f"must be 1 to 9, got {text!r}")
    return int(level)


def build_parser() -> argparse.ArgumentParser:
    """``nsq-sansio to-file``'s flags."""
    p = CommandParser(
        prog="nsq-sansio to-file",
        description="archive a channel to rolling files; messages are FIN'd only after the "
        "file holding them was fsync'd (at-least-once: a crash may repeat lines, never lose them)",
    )
    flag(p, "topic", required=True, help="NSQ topic")
    flag(p, "channel", default="nsq_to_file", help="NSQ channel (default nsq_to_file)")
    add_sources(p)
    flag(
        p,
        "output-dir",
        default=".",
        metavar="DIR",
        help="directory for finished files (default: the current directory)",
    )
    flag(
        p,
        "work-dir",
        default=None,
        metavar="DIR",
        help="directory for files being written, moved to --output-dir when closed "
        "(default: --output-dir)",
    )
    flag(
        p,
        "filename-format",
        default=DEFAULT_FILENAME_FORMAT,
        help="<TOPIC>, <HOST>, <REV>, <DATETIME>, <PID> are replaced (default %(default)s)",
    )
    flag(
        p,
        "datetime-format",
        default="%Y-%m-%d_%H",
        help="strftime format for <DATETIME>; a new value starts a new file (default %(default)s)",
    )
    flag(
        p,
        "host-identifier",
        default=None,
        help="<HOST> in file names (default: the short host name; <SHORT_HOST> and <HOSTNAME> "
        "are replaced)",
    )
    flag(p, "gzip", action="store_true", help="gzip the files (one gzip member per fsync)")
    flag(p, "gzip-level", type=_gzip_level, default=6, help="gzip level 1-9 (default 6)")
    flag(
        p,
        "max-in-flight",
        type=positive(int),
        default=200,
        help="messages in flight, and the most written per fsync (default %(default)s)",
    )
    flag(
        p,
        "sync-interval",
        type=positive(parse_duration),
        metavar="DURATION",
        default=2.0,
        help="write + fsync + FIN at least this often (default 2s)",
    )
    flag(
        p,
        "rotate-size",
        type=non_negative(int),
        default=0,
        help="start a new file once this many bytes (before gzip) were written (0: off)",
    )
    flag(
        p,
        "rotate-interval",
        type=non_negative(parse_duration),
        metavar="DURATION",
        default=0.0,
        help="start a new file after this long (0: off)",
    )
    p.add_argument(
        "-n", "--n", type=non_negative(int), default=0, help="stop after N messages (0: never)"
    )
    add_progress_flag(p)
    add_metrics_flag(p)
    add_client(p)
    return p


@reports_errors("to-file")
def to_file_main(argv: Sequence[str]) -> int:
    """``nsq-sansio to-file [flags]``: archive until ``-n`` or SIGINT/SIGTERM."""
    from transports.sync import Consumer

    from .progress import ProgressDisplay, Stage

    args = build_parser().parse_args(argv)
    topic = valid_topic(args.topic)
    channel = valid_channel(args.channel)
    options = client_options(args)
    check_metrics_address(args.metrics_address)
    if not os.path.isdir(args.output_dir):
        raise CLIError(f"--output-dir {args.output_dir!r} is not a directory")
    if args.work_dir is not None and not os.path.isdir(args.work_dir):
        raise CLIError(f"--work-dir {args.work_dir!r} is not a directory")
    files = FileArchive(
        output_dir=args.output_dir,
        work_dir=args.work_dir,
        filename_format=args.filename_format,
        datetime_format=args.datetime_format,
        topic=topic,
        host=args.host_identifier,
        gzip_level=args.gzip_level if args.gzip else None,
        rotate_size=args.rotate_size,
        rotate_interval=args.rotate_interval,
    )
    nsqd, lookupd = check_sources(args, args.connect_timeout)
    for path in files.recover():
        print(f"nsq-sansio to-file: recovered {path}", file=sys.stderr)
    archived = 0
    limit = args.n
    progress = ProgressDisplay(enabled=args.progress)

    def show(final: bool = False) -> None:
        extras = (
            ("files", len(files.paths) + (files.file is not None)),
            ("bytes", files.bytes_written),
        )
        progress.update([Stage("archive", archived, limit or None, extras)], final=final)

    try:
        with (
            stop_on_signals() as stop,
            Consumer(
                topic,
                channel,
                nsqd=nsqd,
                lookupd=lookupd,
                pull=True,
                max_in_flight=args.max_in_flight,
                # a batch may wait up to sync-interval before its FIN: keep nsqd from timing it out
                msg_timeout=min(
                    900.0, max(60.0, args.sync_interval * 4)
                ),  # nsqd default max: 15 min
                **options,
            ) as consumer,
            serving_metrics(args.metrics_address, consumer),
        ):
            while not stop.is_set() and (not limit or archived < limit):
                want = (
                    args.max_in_flight if not limit else min(args.max_in_flight, limit - archived)
                )
                batch = consumer.fetch(want, timeout=min(args.sync_interval, 0.5))
                if batch:
                    files.write_synced([m.body for m in batch])
                    for m in batch:  # only now that the bytes are on disk
                        m.finish()
                    archived += len(batch)
                elif consumer.draining:
                    break
                elif files.file is not None and files.needs_rotation():
                    files.close()  # rotate (or finish the hour's file) while idle too
                show()
            consumer.drain(timeout=2.0)
    finally:
        files.close()
        show(final=True)
    print(
        f"archived {archived:,} messages to {len(files.paths)} file(s) in "
        f"{os.path.abspath(args.output_dir)}",
        file=sys.stderr,
    )
    return 0

"""``nsq-sansio demo``'s command: parse the options, run the demo on the chosen runtime
(:mod:`.run_async` for asyncio and trio, :mod:`.run_blocking` for threads, :mod:`.spark` for
``--spark``), print the report, exit 0 only when every message is accounted for.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from transports.testing.tls import self_signed_certificate

from ..common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CommandParser, reports_errors
from .accounting import Tally
from .report import DemoResult, Progress, format_report
from .workload import MIN_BODY_SIZE, DemoOptions, Workload

__all__ = ["build_parser", "demo_main", "run_demo"]


@contextlib.contextmanager
def _quiet_logs(*names: str) -> Iterator[None]:
    """Give-ups and retries are the point of the demo and counted in its table: while it runs,
    the library's loggers (``nsq_sansio``, plus ``names``) show errors only."""
    loggers = [logging.getLogger(name) for name in ("nsq_sansio", *names)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def run_demo(options: DemoOptions, *, stream: TextIO | None = None) -> DemoResult:
    """Run the demo and return its result (nothing is printed but the progress bars)."""
    workload = Workload(options)
    tally = Tally(workload)
    progress = Progress(tally, stream=stream, enabled=options.progress)
    result = DemoResult(options, tally)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_quiet_logs())
        tls: tuple[str, str] | None = None
        if options.tls:
            tls = stack.enter_context(self_signed_certificate())
        if options.runtime == "blocking":
            from .run_blocking import run_blocking

            run_blocking(options, workload, tally, progress, result, tls)
        else:
            import anyio

            from .run_async import run_async

            if options.runtime == "trio":
                try:
                    import trio  # noqa: F401
                except ImportError:
                    raise RuntimeError(
                        "--runtime trio needs trio: python -m pip install 'nsq-sansio[trio]'"
                    ) from None

            anyio.run(
                run_async, options, workload, tally, progress, result, tls, backend=options.runtime
            )
    result.elapsed = time.monotonic() - started
    progress.update(final=True)
    return result


def build_parser(prog: str = "nsq-sansio demo") -> argparse.ArgumentParser:
    """``nsq-sansio demo``'s flags."""
    defaults = DemoOptions()
    p = CommandParser(
        prog=prog,
        description="Embedded nsqlookupd + 2 nsqd in this process; publish a workload and "
        "consume it on a push channel (2 consumers) and a pull channel (fetch), with retries, "
        "backoff and give-ups; exit 0 only if every message is accounted for.",
    )
    p.add_argument(
        "-n",
        "--messages",
        type=int,
        default=None,
        help=f"messages to publish (default {defaults.messages}; with --spark, 20000 clicks)",
    )
    p.add_argument(
        "--size",
        type=int,
        default=defaults.body_size,
        help=f"message body size in bytes, >= {MIN_BODY_SIZE} (default %(default)s)",
    )
    p.add_argument(
        "--runtime",
        choices=("asyncio", "trio", "blocking"),
        default=defaults.runtime,
        help="the transport every client runs on: asyncio or trio (anyio, one event loop), "
        "or blocking (threads) (default %(default)s)",
    )
    p.add_argument(
        "--compression",
        choices=("none", "snappy", "deflate"),
        default=defaults.compression,
        help="compression between every client and nsqd (default %(default)s)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="TLS between every client and nsqd (throwaway self-signed certificate)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help=f"per consumer (default {defaults.max_in_flight}; with --spark, 5000)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=defaults.batch,
        help="MPUB batch and fetch batch size (default %(default)s)",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=defaults.max_attempts,
        help="deliveries before a message is given up (default %(default)s)",
    )
    p.add_argument(
        "--fail-per-mille",
        type=int,
        default=defaults.fail_per_mille,
        help="messages per 1000 whose first attempt fails (default %(default)s)",
    )
    p.add_argument(
        "--give-ups",
        type=int,
        default=None,
        help="messages that always fail and are given up (default: 1 per 1000, 1 to 10)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"give up the run after this many seconds (default {defaults.timeout:g};"
        " with --spark, 600)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--spark",
        action="store_true",
        help="run the data pipeline instead: NSQ -> Spark Structured Streaming aggregation -> "
        "Parquet -> NSQ, with a table accounting for every message (needs the spark extra; "
        "takes -n, --max-in-flight, --timeout, --no-progress)",
    )
    return p


def _describe(err: BaseException) -> str:
    """The first real error inside (nested) exception groups, as one line."""
    while getattr(err, "exceptions", None):  # (Base)ExceptionGroup, also on 3.10
        err = err.exceptions[0]  # type: ignore[attr-defined]
    # a Java exception's text is a stack trace: keep its message lines only
    text = " ".join(
        line.strip()
        for line in str(err).splitlines()
        if line.strip() and not line.lstrip().startswith(("at ", "..."))
    )
    text = text.split(" Caused by:")[0][:500]
    if isinstance(err, (RuntimeError, OSError)) and text:
        return text
    return f"{type(err).__name__}: {text}"


@reports_errors("demo")
def demo_main(argv: Sequence[str] | None = None, *, spark: Any = None) -> int:
    """``nsq-sansio demo [options]``; returns the exit code (0: every message accounted for).

    ``spark``: a SparkSession for ``--spark`` (default: a local[2] one started for the run)."""
    args = build_parser().parse_args(argv)
    if args.spark:
        return _spark_main(args, spark)
    defaults = DemoOptions()
    try:
        options = DemoOptions(
            messages=defaults.messages if args.messages is None else args.messages,
            body_size=args.size,
            runtime=args.runtime,
            compression=args.compression,
            tls=args.tls,
            max_in_flight=defaults.max_in_flight
            if args.max_in_flight is None
            else args.max_in_flight,
            batch=args.batch,
            max_attempts=args.max_attempts,
            fail_per_mille=args.fail_per_mille,
            give_ups=args.give_ups,
            timeout=defaults.timeout if args.timeout is None else args.timeout,
            progress=not args.no_progress,
        )
    except ValueError as err:
        print(f"nsq-sansio demo: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = run_demo(options)
    except KeyboardInterrupt:
        print("nsq-sansio demo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # one line, never a traceback
        print(f"nsq-sansio demo: {_describe(err)}", file=sys.stderr)
        return EXIT_FAILURE
    print(format_report(result))
    return 0 if result.ok else EXIT_FAILURE


def _spark_main(args: argparse.Namespace, spark: Any) -> int:
    from .spark import SparkDemoOptions, format_spark_report, run_spark_demo

    defaults = SparkDemoOptions()
    try:
        options = SparkDemoOptions(
            messages=defaults.messages if args.messages is None else args.messages,
            max_in_flight=defaults.max_in_flight
            if args.max_in_flight is None
            else args.max_in_flight,
            timeout=defaults.timeout if args.timeout is None else args.timeout,
            progress=not args.no_progress,
        )
    except ValueError as err:
        print(f"nsq-sansio demo: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with _quiet_logs("transports"):  # the sink's commit report: the table has it
            result = run_spark_demo(options, spark=spark)
    except KeyboardInterrupt:
        print("nsq-sansio demo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # one line, never a traceback
        print(f"nsq-sansio demo: {_describe(err)}", file=sys.stderr)
        return EXIT_FAILURE
    print(format_spark_report(result))
    return 0 if result.ok else EXIT_FAILURE

"""``nsq-sansio``: the command line (the ``cli`` extra installs it).

::

    nsq-sansio demo       the main job: embedded lookupd + 2 nsqd, push and pull channels,
                          retries, give-ups, a table; exit 0 only if every message is accounted
    nsq-sansio tail       print a topic's messages (nsq_tail)
    nsq-sansio pub        publish lines of stdin or a file (to_nsq), MPUB batches, rate limit
    nsq-sansio stat       live table of topic/channel depth, in-flight and rates (nsq_stat)
    nsq-sansio to-file    archive a channel to rolling files, FIN after fsync (nsq_to_file)
    nsq-sansio nsqd       run an embedded nsqd (nsqd's flags)
    nsq-sansio lookupd    run an embedded nsqlookupd (nsqlookupd's flags)

They work against any nsqd / nsqlookupd, embedded or real. Flag names follow NSQ's own tools
(``--nsqd-tcp-address``, ``--lookupd-http-address``, ``--topic``, ``--channel``,
``--max-in-flight``); Go's single-dash spelling (``-topic``) is accepted too. Errors print one
line (``nsq-sansio tail: ...``) and exit non-zero; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import IO, Any

from nsq_sansio.errors import InvalidName, NSQError
from nsq_sansio.names import validate_channel, validate_topic
from transports._common import (
    DEFAULT_HTTP_PORT,
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_TCP_PORT,
    TLSOptions,
    format_address,
    parse_address,
    parse_http_url,
)
from transports.embedded.cli import parse_duration

__all__ = ["CLIError", "main"]

COMMANDS = ("demo", "tail", "pub", "stat", "to-file", "nsqd", "lookupd")


class CLIError(Exception):
    """A failure worth one line on stderr and exit code 1."""


# --- shared flags ----------------------------------------------------------------------------


def _flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--name`` plus Go's ``-name`` spelling (nsq's tools use Go's flag package)."""
    parser.add_argument(f"--{name}", f"-{name}", **kwargs)


def _add_sources(parser: argparse.ArgumentParser, *, http: bool = False) -> None:
    _flag(
        parser,
        "nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times)",
    )
    if http:
        _flag(
            parser,
            "nsqd-http-address",
            action="append",
            default=[],
            metavar="HOST:PORT",
            help="nsqd HTTP address (may be given multiple times)",
        )
    _flag(
        parser,
        "lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times)",
    )


def _add_client(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    group.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    group.add_argument("--tls", action="store_true", help="negotiate TLS (server verified)")
    group.add_argument("--tls-root-ca-file", default=None, help="CA bundle to verify nsqd with")
    group.add_argument("--tls-cert", default=None, help="client certificate (PEM)")
    group.add_argument("--tls-key", default=None, help="client private key (PEM)")
    group.add_argument(
        "--tls-insecure-skip-verify", action="store_true", help="do not verify nsqd's certificate"
    )
    group.add_argument("--auth-secret", default=None, help="secret sent with AUTH")
    group.add_argument(
        "--connect-timeout", type=parse_duration, default=5.0, help="TCP connect + handshake"
    )


def _client_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "snappy": args.snappy,
        "deflate": args.deflate,
        "connect_timeout": args.connect_timeout,
    }
    if args.auth_secret is not None:
        options["auth_secret"] = args.auth_secret.encode()
    if args.tls or args.tls_root_ca_file or args.tls_cert:
        options["tls_v1"] = True
        options["tls"] = TLSOptions(
            verify=not args.tls_insecure_skip_verify,
            ca_file=args.tls_root_ca_file,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
        )
    return options


def _topic(name: str) -> str:
    try:
        validate_topic(name)
    except InvalidName as err:
        raise CLIError(str(err)) from None
    return name


def _channel(name: str) -> str:
    try:
        validate_channel(name)
    except InvalidName as err:
        raise CLIError(str(err)) from None
    return name


def _lookupd_urls(addresses: Sequence[str]) -> list[str]:
    urls = []
    for address in addresses:
        text = address if "://" in address else f"http://{address}"
        url = parse_http_url(text, DEFAULT_LOOKUPD_HTTP_PORT)
        urls.append(f"{url.scheme}://{format_address(url.host, url.port)}")
    return urls


def _probe_tcp(address: str, what: str, timeout: float) -> None:
    """Fail fast with one clear line when an address does not answer."""
    try:
        host, port = parse_address(address, DEFAULT_TCP_PORT)
    except ValueError as err:
        raise CLIError(f"bad {what} address {address!r}: {err}") from None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise CLIError(f"cannot connect to {what} {address}: {reason}") from None


def _http_get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise CLIError(f"GET {url}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise CLIError(f"cannot reach {url}: {reason}") from None


def lookupd_nsqd_addresses(lookupd: Sequence[str], topic: str, timeout: float) -> list[str]:
    """nsqd TCP addresses to publish ``topic`` to, found through nsqlookupd: the nsqd that
    already have the topic (``/lookup``), else every nsqd registered (``/nodes``)."""

    def addresses(path: str) -> list[str]:
        found: list[str] = []
        for url in lookupd:
            try:
                data = _http_get_json(f"{url}{path}", timeout)
            except CLIError:
                if path.startswith("/lookup"):  # 404: no nsqd has the topic (yet)
                    continue
                raise
            data = data.get("data", data)  # nsqlookupd before 1.0 wrapped the answer
            for producer in data.get("producers") or []:
                address = format_address(producer["broadcast_address"], int(producer["tcp_port"]))
                if address not in found:
                    found.append(address)
        return found

    return addresses(f"/lookup?topic={topic}") or addresses("/nodes")


def _check_sources(args: argparse.Namespace, timeout: float) -> tuple[list[str], list[str]]:
    nsqd = list(args.nsqd_tcp_address)
    lookupd = _lookupd_urls(args.lookupd_http_address)
    if not nsqd and not lookupd:
        raise CLIError("give --nsqd-tcp-address or --lookupd-http-address")
    for address in nsqd:
        _probe_tcp(address, "nsqd", timeout)
    for url in lookupd:
        _http_get_json(f"{url}/info", timeout)
    return nsqd, lookupd


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT/SIGTERM (restored on the way out)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# --- tail ------------------------------------------------------------------------------------


def _tail_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsq-sansio tail", description="print a topic's messages")
    _flag(p, "topic", required=True, help="NSQ topic")
    _flag(p, "channel", default=None, help="NSQ channel (default: an ephemeral one)")
    _add_sources(p)
    _flag(p, "max-in-flight", type=int, default=200, help="max messages in flight")
    p.add_argument("-n", "--n", type=int, default=0, help="stop after N messages (0: never)")
    _flag(p, "format", choices=("raw", "json"), default="raw", help="output format")
    _add_progress(p)
    _add_metrics(p)
    _add_client(p)
    return p


def _message_json(msg: Any, topic: str, channel: str) -> str:
    body: bytes = msg.body
    record: dict[str, Any] = {
        "id": msg.id.decode("ascii", "replace"),
        "topic": topic,
        "channel": channel,
        "timestamp": msg.timestamp,
        "attempts": msg.attempts,
        "nsqd": msg.address,
    }
    try:
        record["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        record["body_base64"] = base64.b64encode(body).decode("ascii")
    return json.dumps(record, ensure_ascii=False)


def tail_main(argv: Sequence[str]) -> int:
    from transports.progress import ProgressDisplay, Stage
    from transports.sync import Consumer

    args = _tail_parser().parse_args(argv)
    topic = _topic(args.topic)
    channel = args.channel or f"tail{random.randrange(10**6):06d}#ephemeral"
    _channel(channel)
    nsqd, lookupd = _check_sources(args, args.connect_timeout)
    out = sys.stdout.buffer
    shown = 0
    limit = args.n
    # messages go to stdout: on the same terminal, progress lines must not redraw over them
    progress = ProgressDisplay(enabled=args.progress, plain=sys.stdout.isatty())

    def show(final: bool = False) -> None:
        progress.update([Stage("tail", shown, limit or None)], final=final)

    with (
        _stop_on_signals() as stop,
        Consumer(
            topic,
            channel,
            nsqd=nsqd,
            lookupd=lookupd,
            max_in_flight=max(1, min(args.max_in_flight, limit) if limit else args.max_in_flight),
            **_client_options(args),
        ) as consumer,
        _metrics(args.metrics_address, consumer),
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


# --- pub -------------------------------------------------------------------------------------


def _pub_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsq-sansio pub",
        description="publish lines of stdin (or --file) to a topic, in MPUB batches",
    )
    _flag(p, "topic", required=True, help="NSQ topic")
    _flag(
        p,
        "nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times: round robin with failover)",
    )
    _flag(
        p,
        "lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times): publish to the nsqd that "
        "have the topic, else to every nsqd registered",
    )
    _flag(p, "file", default=None, help="read this file instead of stdin")
    _flag(p, "delimiter", default="\\n", help="message delimiter (default: newline)")
    _flag(p, "batch-size", type=int, default=100, help="messages per MPUB (1: PUB)")
    _flag(p, "rate", type=float, default=0.0, help="at most this many messages/s (0: no limit)")
    _add_metrics(p)
    _add_client(p)
    return p


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


def pub_main(argv: Sequence[str]) -> int:
    from transports.sync import Producer, PublishFuture

    args = _pub_parser().parse_args(argv)
    topic = _topic(args.topic)
    nsqd = list(args.nsqd_tcp_address)
    lookupd = _lookupd_urls(args.lookupd_http_address)
    if not nsqd and not lookupd:
        raise CLIError("give --nsqd-tcp-address or --lookupd-http-address")
    if args.batch_size < 1:
        raise CLIError("--batch-size must be >= 1")
    if args.rate < 0:
        raise CLIError("--rate must be >= 0")
    for address in nsqd:
        _probe_tcp(address, "nsqd", args.connect_timeout)
    if lookupd:
        found = [
            a for a in lookupd_nsqd_addresses(lookupd, topic, args.connect_timeout) if a not in nsqd
        ]
        if not nsqd and not found:
            raise CLIError(f"no nsqd registered with {', '.join(lookupd)}")
        nsqd += found
    delimiter = args.delimiter.encode().decode("unicode_escape").encode("latin-1")
    if not delimiter:
        raise CLIError("--delimiter must not be empty")
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
        producer = stack.enter_context(Producer(nsqd, **_client_options(args)))
        stack.enter_context(_metrics(args.metrics_address, producer))
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


# --- stat ------------------------------------------------------------------------------------


def _stat_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsq-sansio stat",
        description="a live table of topic/channel depth, in-flight and rates from the /stats "
        "of every nsqd (given, or found through nsqlookupd)",
    )
    _flag(p, "topic", default=None, help="only this topic")
    _flag(p, "channel", default=None, help="only this channel")
    _flag(
        p,
        "nsqd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd HTTP address (may be given multiple times)",
    )
    _flag(
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
    _flag(p, "count", type=int, default=0, help="stop after this many tables (0: never)")
    _flag(p, "http-timeout", type=parse_duration, default=5.0, help="per HTTP request")
    return p


def _nsqd_http_addresses(nsqd: Sequence[str], lookupd: Sequence[str], timeout: float) -> list[str]:
    found: list[str] = []
    for address in nsqd:
        host, port = parse_address(address.split("://")[-1], DEFAULT_HTTP_PORT)
        found.append(format_address(host, port))
    for url in lookupd:
        data = _http_get_json(f"{url}/nodes", timeout)
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
            data = _http_get_json(f"http://{address}/stats?{query}", timeout)
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
        _topic(args.topic)
    if args.channel:
        _channel(args.channel)
    lookupd = _lookupd_urls(args.lookupd_http_address)
    if not args.nsqd_http_address and not lookupd:
        raise CLIError("give --nsqd-http-address or --lookupd-http-address")
    previous: dict[StatKey, dict[str, int]] | None = None
    shown = 0
    last = time.monotonic()
    with _stop_on_signals() as stop:
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


# --- to-file ---------------------------------------------------------------------------------


def _to_file_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nsq-sansio to-file",
        description="archive a channel to rolling files; messages are FIN'd only after the "
        "file holding them was fsync'd (at-least-once: a crash may repeat lines, never lose them)",
    )
    _flag(p, "topic", required=True, help="NSQ topic")
    _flag(p, "channel", default="nsq_to_file", help="NSQ channel (default nsq_to_file)")
    _add_sources(p)
    _flag(p, "output-dir", default="/tmp", help="directory for finished files (default /tmp)")
    _flag(
        p,
        "work-dir",
        default=None,
        help="directory for files being written, moved to --output-dir when closed "
        "(default: --output-dir)",
    )
    _flag(
        p,
        "filename-format",
        default=DEFAULT_FILENAME_FORMAT,
        help="<TOPIC>, <HOST>, <REV>, <DATETIME>, <PID> are replaced (default %(default)s)",
    )
    _flag(
        p,
        "datetime-format",
        default="%Y-%m-%d_%H",
        help="strftime format for <DATETIME>; a new value starts a new file (default %(default)s)",
    )
    _flag(
        p,
        "host-identifier",
        default=None,
        help="<HOST> in file names (default: the short host name; <SHORT_HOST> and <HOSTNAME> "
        "are replaced)",
    )
    _flag(p, "gzip", action="store_true", help="gzip the files (one gzip member per fsync)")
    _flag(p, "gzip-level", type=int, default=6, help="gzip level 1-9 (default 6)")
    _flag(p, "max-in-flight", type=int, default=200, help="max messages in flight (and batch)")
    _flag(
        p,
        "sync-interval",
        type=parse_duration,
        default=2.0,
        help="write + fsync + FIN at least this often (default 2s)",
    )
    _flag(
        p,
        "rotate-size",
        type=int,
        default=0,
        help="start a new file once this many bytes (before gzip) were written (0: off)",
    )
    _flag(
        p,
        "rotate-interval",
        type=parse_duration,
        default=0.0,
        help="start a new file after this long (0: off)",
    )
    p.add_argument("-n", "--n", type=int, default=0, help="stop after N messages (0: never)")
    _add_progress(p)
    _add_metrics(p)
    _add_client(p)
    return p


DEFAULT_FILENAME_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"


class FileArchive:
    """nsq_to_file's files: named by ``--filename-format``, rotated when ``<DATETIME>``
    changes, after ``rotate_size`` bytes or ``rotate_interval`` seconds; written in
    ``work_dir`` and moved to ``output_dir`` when closed, never over an existing file.

    Each :meth:`write_synced` is one ``write()`` then ``fsync``; with gzip it is one whole
    gzip member (compressed in memory first), so a crash between two batches leaves a file
    ``gzip -d`` reads entirely (gzip reads concatenated members). A crash during the write
    itself can leave a partial member at the end of a file in the work directory; when the
    work directory is not the output directory, :meth:`recover` (run at start) cuts it off
    and moves such files to the output directory.
    """

    def __init__(
        self,
        *,
        output_dir: str,
        work_dir: str | None = None,
        filename_format: str = DEFAULT_FILENAME_FORMAT,
        datetime_format: str = "%Y-%m-%d_%H",
        topic: str,
        host: str | None = None,
        gzip_level: int | None = None,
        rotate_size: int = 0,
        rotate_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.output_dir = output_dir
        self.work_dir = work_dir or output_dir
        self.gzip_level = gzip_level
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.datetime_format = datetime_format
        self.clock = clock
        self.now = now
        needs_rev = (
            gzip_level is not None
            or rotate_size > 0
            or rotate_interval > 0
            or os.path.abspath(self.work_dir) != os.path.abspath(output_dir)
        )
        if needs_rev and "<REV>" not in filename_format:
            raise CLIError(
                "--filename-format needs <REV> with --gzip, rotation or a separate --work-dir"
            )
        if not needs_rev:
            filename_format = filename_format.replace("<REV>", "")
        hostname = socket.gethostname()
        short = hostname.split(".")[0]
        identifier = host or short
        identifier = identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
        fmt = (
            filename_format.replace("<TOPIC>", topic)
            .replace("<HOST>", identifier)
            .replace("<PID>", str(os.getpid()))
        )
        if gzip_level is not None and not fmt.endswith(".gz"):
            fmt += ".gz"
        self.format = fmt
        self.file: IO[bytes] | None = None
        self.name = ""  # the current file name with <REV> unresolved
        self.rev = 0
        self.path = ""  # the current file in the work directory
        self.opened_at = 0.0
        self.size = 0  # bytes written to the current file, before compression
        self.bytes_written = 0  # bytes written to disk, all files
        self.paths: list[str] = []  # every file finished in the output directory, in order

    # --- names ----------------------------------------------------------------------------------

    def _current_name(self) -> str:
        return self.format.replace("<DATETIME>", self.now().strftime(self.datetime_format))

    @staticmethod
    def _with_rev(name: str, rev: int) -> str:
        return name.replace("<REV>", f"-{rev:06d}")

    def _pattern(self) -> re.Pattern[str]:
        parts = re.split(r"(<REV>|<DATETIME>)", self.format)
        regex = "".join(
            r"-\d{6}" if p == "<REV>" else ".+?" if p == "<DATETIME>" else re.escape(p)
            for p in parts
        )
        return re.compile(regex + "$")

    # --- rotation -------------------------------------------------------------------------------

    def needs_rotation(self) -> bool:
        if self.file is None:
            return True
        if self._current_name() != self.name:
            return True
        if self.rotate_interval > 0 and self.clock() - self.opened_at > self.rotate_interval:
            return True
        return self.rotate_size > 0 and self.size > self.rotate_size

    def _open(self) -> None:
        self.close()
        name = self._current_name()
        self.rev = 0 if name != self.name else self.rev + 1
        self.name = name
        exclusive = self.gzip_level is not None or self.rotate_interval > 0
        separate = os.path.abspath(self.work_dir) != os.path.abspath(self.output_dir)
        while True:
            filename = self._with_rev(name, self.rev)
            path = os.path.join(self.work_dir, filename)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            if separate:
                final = os.path.join(self.output_dir, filename)
                os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
                if os.path.exists(final):
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
            try:
                fd = os.open(path, flags, 0o666)
            except FileExistsError:
                self.rev += 1
                continue
            size = os.fstat(fd).st_size
            if self.rotate_size > 0 and size > self.rotate_size:
                os.close(fd)
                self.rev += 1
                continue
            break
        self.file = os.fdopen(fd, "ab")
        self.path = path
        self.size = size
        self.opened_at = self.clock()

    # --- writing --------------------------------------------------------------------------------

    def write_synced(self, bodies: Sequence[bytes]) -> None:
        """Append ``bodies`` (one per line) and fsync before returning."""
        if self.needs_rotation():
            self._open()
        f = self.file
        assert f is not None
        data = b"".join(body + b"\n" for body in bodies)
        out = data
        if self.gzip_level is not None:
            member = zlib.compressobj(self.gzip_level, zlib.DEFLATED, 31)  # 31: gzip wrapper
            out = member.compress(data) + member.flush()
        f.write(out)
        f.flush()
        os.fsync(f.fileno())
        self.size += len(data)
        self.bytes_written += len(out)

    def close(self) -> None:
        """fsync and close the current file, then move it to the output directory."""
        if self.file is None:
            return
        f, self.file = self.file, None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self.paths.append(self._finish(self.path, self.name, self.rev))

    def _finish(self, path: str, name: str, rev: int) -> str:
        """Move ``path`` from the work directory to the output directory without ever
        replacing a file there (link, then unlink; the revision goes up on a clash)."""
        if os.path.abspath(self.work_dir) == os.path.abspath(self.output_dir):
            return path
        relative = os.path.relpath(path, self.work_dir)
        target = os.path.join(self.output_dir, relative)
        while True:
            try:
                os.link(path, target)
            except FileExistsError:
                rev += 1
                target = os.path.join(
                    self.output_dir, os.path.dirname(relative), self._with_rev(name, rev)
                )
                if "<REV>" not in name:
                    raise
                continue
            os.unlink(path)
            return target

    def recover(self) -> list[str]:
        """Files a killed run left in a separate work directory: a partial gzip member at
        the end is cut off (the whole members before it are kept), then the file is moved
        to the output directory. Returns the moved files."""
        if os.path.abspath(self.work_dir) == os.path.abspath(self.output_dir):
            return []
        pattern = self._pattern()
        moved = []
        for entry in sorted(os.listdir(self.work_dir)):
            path = os.path.join(self.work_dir, entry)
            if not os.path.isfile(path) or not pattern.match(entry):
                continue
            if self.gzip_level is not None:
                good = whole_gzip_members(path)
                if good < os.path.getsize(path):
                    os.truncate(path, good)
            rev_name = re.sub(r"-\d{6}(?=[^/]*$)", "<REV>", entry, count=1)
            moved.append(self._finish(path, rev_name, 0))
        return moved


def whole_gzip_members(path: str) -> int:
    """The length of the longest prefix of ``path`` made of complete gzip members."""
    with open(path, "rb") as f:
        data = f.read()
    end = 0
    while end < len(data):
        member = zlib.decompressobj(31)
        try:
            member.decompress(data[end:])
        except zlib.error:
            break
        if not member.eof:
            break
        end = len(data) - len(member.unused_data)
    return end


def _add_metrics(parser: argparse.ArgumentParser) -> None:
    _flag(
        parser,
        "metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics of this command's client at http://HOST:PORT/metrics "
        "(needs the metrics extra)",
    )


@contextlib.contextmanager
def _metrics(address: str | None, client: Any) -> Iterator[None]:
    """Export ``client`` at ``address`` while the command runs (nothing when None)."""
    if address is None:
        yield
        return
    try:
        from prometheus_client import CollectorRegistry

        from transports import metrics
    except ImportError:
        raise CLIError(
            "--metrics-address needs prometheus-client: python -m pip install 'nsq-sansio[metrics]'"
        ) from None
    registry = CollectorRegistry()
    metrics.instrument(client, registry=registry)
    try:
        server, _ = metrics.start_http_server(address, registry)
    except ValueError as err:
        raise CLIError(str(err)) from None
    host, port = server.server_address[:2]
    print(f"metrics: http://{format_address(host, port)}/metrics", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def _add_progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr (redrawn on a terminal, a line every 2s otherwise)",
    )


def to_file_main(argv: Sequence[str]) -> int:
    from transports.progress import ProgressDisplay, Stage
    from transports.sync import Consumer

    args = _to_file_parser().parse_args(argv)
    topic = _topic(args.topic)
    channel = _channel(args.channel)
    if not os.path.isdir(args.output_dir):
        raise CLIError(f"--output-dir {args.output_dir!r} is not a directory")
    if args.work_dir is not None and not os.path.isdir(args.work_dir):
        raise CLIError(f"--work-dir {args.work_dir!r} is not a directory")
    if not 1 <= args.gzip_level <= 9:
        raise CLIError(f"--gzip-level must be 1-9, got {args.gzip_level}")
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
    nsqd, lookupd = _check_sources(args, args.connect_timeout)
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
            _stop_on_signals() as stop,
            Consumer(
                topic,
                channel,
                nsqd=nsqd,
                lookupd=lookupd,
                pull=True,
                max_in_flight=max(1, args.max_in_flight),
                # a batch may wait up to sync-interval before its FIN: keep nsqd from timing it out
                msg_timeout=min(
                    900.0, max(60.0, args.sync_interval * 4)
                ),  # nsqd default max: 15 min
                **_client_options(args),
            ) as consumer,
            _metrics(args.metrics_address, consumer),
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
        f"archived {archived:,} messages to {len(files.paths)} file(s) in {args.output_dir}",
        file=sys.stderr,
    )
    return 0


# --- dispatch --------------------------------------------------------------------------------

_USAGE = """usage: nsq-sansio <command> [options]   (nsq-sansio <command> --help)

commands:
  demo      embedded lookupd + 2 nsqd in this process; publish a workload, consume it on a
            push channel (2 consumers) and a pull channel, with retries, backoff and give-ups;
            exit 0 only if every message is accounted for
  tail      print a topic's messages
  pub       publish lines of stdin (or a file) to a topic, MPUB batches, rate limit
  stat      live table of topic/channel depth, in-flight and rates (from every nsqd's /stats)
  to-file   archive a channel to rolling files, FIN after fsync
  nsqd      run an embedded nsqd (nsqd's flags)
  lookupd   run an embedded nsqlookupd (nsqlookupd's flags)
"""


def _dispatch(command: str) -> Callable[[Sequence[str]], int]:
    if command == "demo":
        from transports.demo import demo_main

        return demo_main
    if command == "nsqd":
        from transports.embedded.cli import nsqd_main

        return nsqd_main
    if command in ("lookupd", "nsqlookupd"):
        from transports.embedded.cli import lookupd_main

        return lookupd_main
    return {"tail": tail_main, "pub": pub_main, "stat": stat_main, "to-file": to_file_main}[command]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``nsq-sansio`` entry point; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_USAGE, end="", file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(_USAGE, end="")
        return 0
    if args[0] in ("-V", "--version", "version"):
        from nsq_sansio import __version__

        print(f"nsq-sansio {__version__}")
        return 0
    command = args[0]
    if command not in COMMANDS and command != "nsqlookupd":
        print(f"nsq-sansio: unknown command {command!r}\n{_USAGE}", file=sys.stderr, end="")
        return 2
    try:
        return _dispatch(command)(args[1:])
    except CLIError as err:
        print(f"nsq-sansio {command}: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `nsq-sansio tail ... | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except (NSQError, OSError, ValueError) as err:
        print(f"nsq-sansio {command}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""``nsq-sansio demo``: the whole library at work, in one process, with exact accounting.

An embedded nsqlookupd and two embedded nsqd start in-process. A workload (default 200,000
messages of 100 bytes, about 1% of them deferred) is published across both nsqd while two
channels consume the topic:

* ``push``: two concurrent push consumers (``async for msg in consumer`` / ``for msg in c``);
* ``pull``: one pull consumer (``fetch(batch, timeout)``).

The handler fails a small, deterministic share of messages: ~1% fail once (requeued without
backoff, they succeed on the next attempt) and a few (``--give-ups``, 1 per 1,000 up to 10)
always fail: their first failure asks for backoff, and after ``max_attempts`` deliveries
they are given up. Every message carries its sequence number, its publish time
and its deferral, so at the end each channel is checked message by message:

* every sequence number is either finished or given up (never both, never neither);
* a message handled successfully twice is a *redelivery* when the later delivery has a higher
  attempt count (nsqd took it back after a timeout: at-least-once, not a loss) and a
  *duplicate* otherwise; duplicates must be 0;
* exactly the poison messages are given up.

The exit code is 0 only when every message is accounted for on both channels. The run is
bounded (``--timeout``); consumers are drained on the way out.

Runtimes: ``asyncio`` and ``trio`` (the anyio transport, broker in the same event loop) and
``blocking`` (the threaded transport, broker on a background thread).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import struct
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from transports.progress import ProgressDisplay, Stage

__all__ = ["DemoOptions", "DemoResult", "Progress", "Tally", "Workload", "demo_main", "run_demo"]

TOPIC = "demo"
CHANNELS = ("push", "pull")
_HEADER = struct.Struct(">IdI")  # seq, publish time (time.monotonic()), defer in ms
MIN_BODY_SIZE = _HEADER.size
#: The closing report fits an 80-column terminal.
REPORT_WIDTH = 79
#: Failures of an always-failing message up to this attempt ask for backoff.
BACKOFF_ATTEMPTS = 1


# --- options ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """Everything the demo can be told; the command line maps onto it one to one."""

    messages: int = 200_000
    body_size: int = 100
    runtime: str = "asyncio"  # asyncio | trio | blocking
    compression: str = "none"  # none | snappy | deflate
    tls: bool = False
    max_in_flight: int = 1000
    batch: int = 100  # MPUB batch and fetch batch
    deferred_every: int = 100  # 1 message in N is published with DPUB (0: none)
    fail_per_mille: int = 10  # messages whose first attempt fails (requeued, no backoff)
    #: Messages that always fail (REQ with backoff) and are given up after max_attempts;
    #: None: one per 1,000 messages, between 1 and 10.
    give_ups: int | None = None
    max_attempts: int = 3
    timeout: float = 300.0
    progress: bool = True

    def __post_init__(self) -> None:
        if self.messages < 1:
            raise ValueError(f"--messages must be >= 1, got {self.messages}")
        if self.messages >= 2**32:
            raise ValueError("--messages must be below 2**32")
        if self.body_size < MIN_BODY_SIZE:
            raise ValueError(f"--size must be >= {MIN_BODY_SIZE} bytes, got {self.body_size}")
        if self.runtime not in ("asyncio", "trio", "blocking"):
            raise ValueError(f"unknown runtime {self.runtime!r}")
        if self.compression not in ("none", "snappy", "deflate"):
            raise ValueError(f"unknown compression {self.compression!r}")
        if self.max_in_flight < 1 or self.batch < 1:
            raise ValueError("--max-in-flight and --batch must be >= 1")
        if not 0 <= self.fail_per_mille <= 1000:
            raise ValueError("--fail-per-mille must be between 0 and 1000")
        if self.max_attempts < 2:
            raise ValueError("--max-attempts must be >= 2 (failed messages are retried)")
        if self.give_ups is not None and self.give_ups < 0:
            raise ValueError("--give-ups must be >= 0")
        if self.timeout <= 0:
            raise ValueError("--timeout must be > 0")

    def client_options(self) -> dict[str, Any]:
        """Config fields shared by the demo's consumers."""
        return {
            "max_in_flight": self.max_in_flight,
            "max_attempts": self.max_attempts,
            "default_requeue_delay": 0.05,
            "max_requeue_delay": 1.0,
            "backoff_multiplier": 0.01,
            "max_backoff_duration": 0.2,
            "lookupd_poll_interval": 1.0,
            # In backoff only one connection holds RDY 1; with two nsqd the message to retry
            # may sit on the other one. Move RDY after 1 s of silence rather than go-nsq's 10 s.
            "low_rdy_idle_timeout": 1.0,
            "rdy_redistribute_interval": 0.25,
            "snappy": self.compression == "snappy",
            "deflate": self.compression == "deflate",
        }

    def producer_options(self) -> dict[str, Any]:
        return {
            "snappy": self.compression == "snappy",
            "deflate": self.compression == "deflate",
        }


# --- workload --------------------------------------------------------------------------------


class Workload:
    """Which messages exist, which are deferred, which fail: all derived from the sequence."""

    def __init__(self, options: DemoOptions) -> None:
        self.options = options
        self.count = options.messages
        self._pad = b"." * (options.body_size - MIN_BODY_SIZE)
        give_ups = options.give_ups
        if give_ups is None:
            give_ups = min(10, max(1, self.count // 1000))
        self.give_ups = min(give_ups, self.count)
        self.poison_every = self.count // self.give_ups if self.give_ups else 0

    def deferred_ms(self, seq: int) -> int:
        every = self.options.deferred_every
        if every and seq % every == every // 2:
            return 200 + (seq // every) % 9 * 100  # 0.2 .. 1.0 s
        return 0

    def is_poison(self, seq: int) -> bool:
        every = self.poison_every
        return bool(every) and seq % every == every - 1

    def wants_backoff(self, body: bytes, attempts: int) -> bool:
        """A failure that slows the consumer down (REQ with backoff): the first failure of an
        always-failing message. Its later failures, and the one-off failures, are retried
        without backoff, so the demo shows backoff without being dominated by it."""
        return attempts <= BACKOFF_ATTEMPTS and self.is_poison(_HEADER.unpack_from(body)[0])

    def fails_first(self, seq: int) -> bool:
        return (seq * 2654435761 >> 8) % 1000 < self.options.fail_per_mille

    def body(self, seq: int, defer_ms: int = 0) -> bytes:
        return _HEADER.pack(seq, time.monotonic(), defer_ms) + self._pad

    @staticmethod
    def parse(body: bytes) -> tuple[int, float, int]:
        return _HEADER.unpack_from(body)

    def batches(self) -> Iterator[tuple[str, int, list[int]]]:
        """("mpub", 0, [seq...]) for immediate batches, ("dpub", delay_ms, [seq]) for deferred."""
        batch: list[int] = []
        size = self.options.batch
        for seq in range(self.count):
            defer = self.deferred_ms(seq)
            if defer:
                yield "dpub", defer, [seq]
                continue
            batch.append(seq)
            if len(batch) >= size:
                yield "mpub", 0, batch
                batch = []
        if batch:
            yield "mpub", 0, batch

    def expected_given_up(self) -> int:
        return self.give_ups

    def expected_deferred(self) -> int:
        return sum(1 for seq in range(self.count) if self.deferred_ms(seq))


# --- accounting ------------------------------------------------------------------------------

_PENDING, _FINISHED, _GIVEN_UP = 0, 1, 2


class ChannelTally:
    """What happened to every message on one channel. Thread-safe (the blocking runtime)."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count
        self.state = bytearray(count)
        self.first_ok_attempt = [0] * count
        self.handled = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        self.redelivered = 0
        self.duplicates = 0
        self.double_end = 0  # finished and given up
        self.taken_back = 0
        self.latencies: list[float] = []
        self.first_at = 0.0
        self.last_at = 0.0
        self._lock = threading.Lock()

    @property
    def accounted(self) -> int:
        return self.finished + self.given_up

    def complete(self) -> bool:
        return self.accounted >= self.count

    def handle(self, workload: Workload, body: bytes, attempts: int) -> bool:
        """The demo's handler: True = finish it, False = requeue it."""
        seq, published, defer_ms = Workload.parse(body)
        now = time.monotonic()
        with self._lock:
            self.handled += 1
            if not self.first_at:
                self.first_at = now
            self.last_at = now
            if attempts == 1:
                self.latencies.append(now - published - defer_ms / 1000.0)
        fails = workload.is_poison(seq) or (attempts == 1 and workload.fails_first(seq))
        return not fails

    def record_requeue(self) -> None:
        with self._lock:
            self.requeued += 1

    def record_finish(self, body: bytes, attempts: int) -> None:
        seq = _HEADER.unpack_from(body)[0]
        with self._lock:
            state = self.state[seq]
            if state == _PENDING:
                self.state[seq] = _FINISHED
                self.first_ok_attempt[seq] = attempts
                self.finished += 1
            elif state == _GIVEN_UP:
                self.double_end += 1
            elif attempts > self.first_ok_attempt[seq]:
                self.redelivered += 1
                self.first_ok_attempt[seq] = attempts
            else:
                self.duplicates += 1

    def record_give_up(self, body: bytes) -> None:
        seq = _HEADER.unpack_from(body)[0]
        with self._lock:
            state = self.state[seq]
            if state == _PENDING:
                self.state[seq] = _GIVEN_UP
                self.given_up += 1
            elif state == _FINISHED:
                self.double_end += 1
            # given up twice: nsqd redelivered it after the FIN was lost; a retry, not a loss
            else:
                self.redelivered += 1

    def record_taken_back(self) -> None:
        with self._lock:
            self.taken_back += 1

    def missing(self, limit: int = 10) -> list[int]:
        out = []
        for seq, state in enumerate(self.state):
            if state == _PENDING:
                out.append(seq)
                if len(out) >= limit:
                    break
        return out

    def wrongly_given_up(self, workload: Workload) -> int:
        return sum(
            1
            for seq, state in enumerate(self.state)
            if state == _GIVEN_UP and not workload.is_poison(seq)
        )


class Tally:
    """Publishing counters plus one :class:`ChannelTally` per channel."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.published = 0
        self.deferred = 0
        self.publish_started = 0.0
        self.publish_done = 0.0
        self.channels = {name: ChannelTally(name, workload.count) for name in CHANNELS}
        self._lock = threading.Lock()

    def add_published(self, count: int, deferred: bool) -> None:
        with self._lock:
            self.published += count
            if deferred:
                self.deferred += count

    def complete(self) -> bool:
        return all(ch.complete() for ch in self.channels.values())

    def on_event(self, channel: str) -> Callable[[object], None]:
        """An ``on_event`` callback recording GiveUp and TakenBack reports for ``channel``."""
        from nsq_sansio.consumer import GiveUp, TakenBack

        tally = self.channels[channel]

        def on_event(event: object) -> None:
            if isinstance(event, GiveUp):
                tally.record_give_up(event.message.body)
            elif isinstance(event, TakenBack):
                tally.record_taken_back()

        return on_event


# --- progress --------------------------------------------------------------------------------


class Progress:
    """The demo's stages (publish, then each channel) drawn by
    :class:`~transports.progress.ProgressDisplay`: bars fitted to the terminal, redrawn in
    place, or one compact line per stage every 2 s when stderr is not a terminal."""

    def __init__(
        self,
        tally: Tally,
        stream: TextIO | None = None,
        enabled: bool = True,
        columns: int | None = None,
    ) -> None:
        self.tally = tally
        self.display = ProgressDisplay(stream, enabled=enabled, columns=columns)

    @property
    def tty(self) -> bool:
        return self.display.tty

    def stages(self) -> list[Stage]:
        t = self.tally
        total = t.workload.count
        out = [Stage("publish", t.published, total, (("deferred", t.deferred),))]
        for name, ch in t.channels.items():
            extras = (("retries", ch.requeued), ("gave up", ch.given_up))
            out.append(Stage(name, ch.accounted, total, extras))
        return out

    def update(self, final: bool = False) -> None:
        self.display.update(self.stages(), final=final)


# --- result and report -----------------------------------------------------------------------


@dataclass(slots=True)
class DemoResult:
    options: DemoOptions
    tally: Tally
    elapsed: float = 0.0
    timed_out: bool = False
    error: str | None = None
    consumer_stats: dict[str, list[Any]] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why the run does not account for every message (empty: it does)."""
        out: list[str] = []
        if self.error:
            out.append(self.error)
        t = self.tally
        workload = t.workload
        if t.published != workload.count:
            out.append(f"published {t.published:,} of {workload.count:,} messages")
        expected_given_up = workload.expected_given_up()
        for name, ch in t.channels.items():
            if not ch.complete():
                missing = ch.missing()
                out.append(
                    f"{name}: {ch.count - ch.accounted:,} messages neither finished nor given up"
                    f" (first: {', '.join(map(str, missing))})"
                )
            if ch.duplicates:
                out.append(f"{name}: {ch.duplicates:,} duplicates beyond retries")
            if ch.double_end:
                out.append(f"{name}: {ch.double_end:,} messages both finished and given up")
            wrong = ch.wrongly_given_up(workload)
            if wrong:
                out.append(f"{name}: {wrong:,} healthy messages given up")
            if ch.complete() and ch.given_up != expected_given_up:
                out.append(f"{name}: given up {ch.given_up:,}, expected {expected_given_up:,}")
        if self.timed_out:
            out.append(f"timed out after {self.options.timeout:g}s")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:,.1f} ms"


def format_report(result: DemoResult) -> str:
    opts = result.options
    t = result.tally
    publish_time = max(t.publish_done - t.publish_started, 1e-9)
    rows: list[tuple[str, ...]] = [("", "push (2 consumers)", "pull (fetch)")]
    chans = [t.channels[name] for name in CHANNELS]

    def row(label: str, fn: Callable[[ChannelTally], str]) -> None:
        rows.append((label, *(fn(ch) for ch in chans)))

    row("published", lambda ch: f"{t.published:,}")
    row("finished", lambda ch: f"{ch.finished:,}")
    row("requeued", lambda ch: f"{ch.requeued:,}")
    row("given up", lambda ch: f"{ch.given_up:,}")
    row("redelivered (retries)", lambda ch: f"{ch.redelivered:,}")
    row("duplicates", lambda ch: f"{ch.duplicates:,}")
    row("unaccounted", lambda ch: f"{ch.count - ch.accounted:,}")

    def throughput(ch: ChannelTally) -> str:
        span = ch.last_at - ch.first_at
        return f"{ch.handled / span:,.0f} msg/s" if span > 0 else "-"

    row("throughput (handled)", throughput)

    def latency(q: float) -> Callable[[ChannelTally], str]:
        return lambda ch: _ms(_percentile(sorted(ch.latencies), q))

    row("p50 latency", latency(0.5))
    row("p99 latency", latency(0.99))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        f"nsq-sansio demo: {opts.messages:,} messages x {opts.body_size} B, runtime {opts.runtime}",
        f"compression {opts.compression}, TLS {'on' if opts.tls else 'off'};"
        f" total run {result.elapsed:.2f}s",
        f"published to 2 nsqd in {publish_time:.2f}s ({t.published / publish_time:,.0f} msg/s,"
        f" {t.deferred:,} deferred)",
        "",
    ]
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(
                cell.ljust(widths[j]) if j == 0 else cell.rjust(widths[j])
                for j, cell in enumerate(r)
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("latency: publish to first delivery (attempt 1), deferral excluded")
    problems = result.problems()
    if problems:
        lines += textwrap.wrap("FAILED: " + "; ".join(problems), REPORT_WIDTH)
    else:
        lines.append("OK: every message accounted for (each finished or given up, no duplicates)")
    return "\n".join(lines)


# --- TLS material ----------------------------------------------------------------------------


@contextlib.contextmanager
def self_signed_certificate() -> Iterator[tuple[str, str]]:
    """A throwaway certificate for 127.0.0.1 in a temporary directory: (cert, key) paths.

    Uses the ``cryptography`` package when installed, else the ``openssl`` binary."""
    directory = tempfile.mkdtemp(prefix="nsq-sansio-demo-tls-")
    try:
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        try:
            _cryptography_cert(cert, key)
        except ImportError:
            _openssl_cert(cert, key)
        yield cert, key
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cryptography_cert(cert_path: str, key_path: str) -> None:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _openssl_cert(cert_path: str, key_path: str) -> None:
    import subprocess

    try:
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-keyout",
                key_path,
                "-out",
                cert_path,
            ],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as err:
        raise RuntimeError(
            "--tls needs a certificate: install the 'cryptography' package or an openssl binary"
        ) from err


# --- running ---------------------------------------------------------------------------------


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
            from .demo_blocking import run_blocking

            run_blocking(options, workload, tally, progress, result, tls)
        else:
            import anyio

            from .demo_async import run_async

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
    defaults = DemoOptions()
    p = argparse.ArgumentParser(
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
    p.add_argument("--runtime", choices=("asyncio", "trio", "blocking"), default=defaults.runtime)
    p.add_argument(
        "--compression", choices=("none", "snappy", "deflate"), default=defaults.compression
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
        return 2
    try:
        result = run_demo(options)
    except KeyboardInterrupt:
        print("nsq-sansio demo: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line, never a traceback
        print(f"nsq-sansio demo: {_describe(err)}", file=sys.stderr)
        return 1
    print(format_report(result))
    return 0 if result.ok else 1


def _spark_main(args: argparse.Namespace, spark: Any) -> int:
    from .demo_spark import SparkDemoOptions, format_spark_report, run_spark_demo

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
        return 2
    try:
        with _quiet_logs("transports"):  # the sink's commit report: the table has it
            result = run_spark_demo(options, spark=spark)
    except KeyboardInterrupt:
        print("nsq-sansio demo: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line, never a traceback
        print(f"nsq-sansio demo: {_describe(err)}", file=sys.stderr)
        return 1
    print(format_spark_report(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(demo_main())
